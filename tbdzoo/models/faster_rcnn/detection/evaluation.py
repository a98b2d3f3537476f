"""PASCAL VOC2007 mean average precision: 11-point AP per class at IoU 0.5, ``difficult`` ground
truth neither a true nor a false positive (docs/detection.md)."""
import numpy as np

from ....errors import DetectionInputError
from .boxes import check_boxes, iou
from .nms import score_order
from .targets import check_labels

RECALL_POINTS = np.arange(11) / 10.0  # k / 10 exactly: a recall of 3/10 counts at 0.3


def eleven_point_ap(recall, precision):
    """Mean over t in 0, 0.1, ..., 1 of the best precision at recall >= t (0 if none)."""
    recall = np.asarray(recall, dtype=np.float64)
    precision = np.asarray(precision, dtype=np.float64)
    total = 0.0
    for t in RECALL_POINTS:
        reached = recall >= t
        total += precision[reached].max() if reached.any() else 0.0
    return total / len(RECALL_POINTS)


def _ground_truth(image, gt, num_classes):
    if len(gt) == 2:
        boxes, labels = gt
        difficult = None
    else:
        boxes, labels, difficult = gt
    boxes = check_boxes(boxes, "ground_truth[{}] boxes".format(image))
    labels = check_labels(labels, "ground_truth[{}] labels".format(image), num_classes, len(boxes))
    difficult = (np.zeros(len(boxes), bool) if difficult is None
                 else np.asarray(difficult, dtype=bool).reshape(-1))
    if difficult.shape != (len(boxes),):
        raise DetectionInputError("ground_truth[{}] difficult must have one flag per box ({}); "
                                  "got {}".format(image, len(boxes), difficult.shape))
    return boxes, labels, difficult


def _detections(image, det, num_classes):
    boxes, scores, labels = det
    boxes = check_boxes(boxes, "detections[{}] boxes".format(image))
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    if scores.shape != (len(boxes),):
        raise DetectionInputError("detections[{}] has {} boxes but {} scores".format(
            image, len(boxes), len(scores)))
    labels = check_labels(labels, "detections[{}] labels".format(image), num_classes, len(boxes))
    return boxes, scores, labels


def average_precisions(detections, ground_truth, num_classes=21, iou_threshold=0.5):
    """AP of each class 1 .. num_classes - 1 (index 0 of the result is class 1); NaN for a class
    without any non-difficult ground truth. ``detections``: per image (boxes, scores, labels);
    ``ground_truth``: per image (boxes, labels) or (boxes, labels, difficult)."""
    if len(detections) != len(ground_truth):
        raise DetectionInputError("detections cover {} images but ground_truth {}: give one entry "
                                  "per image to both, empty ones included".format(
                                      len(detections), len(ground_truth)))
    dets = [_detections(i, d, num_classes) for i, d in enumerate(detections)]
    gts = [_ground_truth(i, g, num_classes) for i, g in enumerate(ground_truth)]
    aps = np.full(num_classes - 1, np.nan)
    for cls in range(1, num_classes):
        own_gt = [(b[l == cls], d[l == cls]) for b, l, d in gts]
        positives = sum(int((~d).sum()) for _, d in own_gt)
        image_of, boxes, scores = [], [], []
        for i, (b, s, l) in enumerate(dets):
            mine = l == cls
            image_of += [i] * int(mine.sum())
            boxes.append(b[mine])
            scores.append(s[mine])
        if positives == 0:
            continue
        boxes = np.concatenate(boxes) if boxes else np.zeros((0, 4))
        scores = np.concatenate(scores) if scores else np.zeros(0)
        taken = [np.zeros(len(b), bool) for b, _ in own_gt]
        tp, fp = [], []
        for k in score_order(scores):  # equal scores: image order, then detection order
            gt_boxes, difficult = own_gt[image_of[k]]
            hit, miss = 0, 0
            if len(gt_boxes):
                overlaps = iou(boxes[k:k + 1], gt_boxes)[0]
                j = int(overlaps.argmax())
                if overlaps[j] >= iou_threshold:
                    if difficult[j]:
                        continue  # neither true nor false positive
                    if not taken[image_of[k]][j]:
                        taken[image_of[k]][j] = True
                        hit = 1
                    else:
                        miss = 1  # a duplicate of a detected object
                else:
                    miss = 1
            else:
                miss = 1
            tp.append(hit)
            fp.append(miss)
        tp = np.cumsum(tp, dtype=np.float64)
        fp = np.cumsum(fp, dtype=np.float64)
        recall = tp / positives
        precision = tp / np.maximum(tp + fp, np.finfo(np.float64).eps)
        aps[cls - 1] = eleven_point_ap(recall, precision)
    return aps


def mean_average_precision(detections, ground_truth, num_classes=21, iou_threshold=0.5):
    """VOC07 mAP: the mean of the classes' APs over the classes that have ground truth."""
    aps = average_precisions(detections, ground_truth, num_classes, iou_threshold)
    return float(np.nanmean(aps)) if np.isfinite(aps).any() else float("nan")
