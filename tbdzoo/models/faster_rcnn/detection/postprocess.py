"""Head outputs -> detections, as torchvision's RoIHeads.postprocess_detections with its defaults:
softmax, class-specific decode with weights (10, 10, 5, 5), clip, drop background, keep scores
> 0.05, drop boxes under 0.01 pixels, NMS 0.5 per class, the 100 best."""
import numpy as np

from ....errors import DetectionInputError
from .boxes import HEAD_WEIGHTS, check_boxes, check_image_hw, clip, decode, remove_small
from .nms import nms, score_order

SCORE_THRESHOLD = 0.05
NMS_THRESHOLD = 0.5
MAX_DETECTIONS = 100
MIN_SIZE = 1e-2


def softmax(logits):
    shifted = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=1, keepdims=True)


def detections(class_logits, box_deltas, rois, image_hw, score_threshold=SCORE_THRESHOLD,
               nms_threshold=NMS_THRESHOLD, max_detections=MAX_DETECTIONS, min_size=MIN_SIZE,
               weights=HEAD_WEIGHTS):
    """One image's detections (boxes (D, 4) float32, scores (D,) float32, labels (D,) int64),
    best first, equal scores in (RoI, class) order, from the head's ``class_logits`` (R, K) and
    ``box_deltas`` (R, 4K) on ``rois`` (R, 4)."""
    rois = check_boxes(rois, "rois")
    logits = np.asarray(class_logits, dtype=np.float64)
    deltas = np.asarray(box_deltas, dtype=np.float64)
    if (logits.ndim != 2 or logits.shape[0] != len(rois)
            or deltas.shape != (len(rois), 4 * logits.shape[1])):
        raise DetectionInputError(
            "class_logits must be (R, K) and box_deltas (R, 4K) for R = {} rois; got {} and {}"
            .format(len(rois), logits.shape, deltas.shape))
    height, width = check_image_hw(image_hw, "image_hw")
    num_classes = logits.shape[1]
    boxes = clip(decode(deltas, rois, weights), height, width).reshape(len(rois), num_classes, 4)
    scores = softmax(logits)
    boxes = boxes[:, 1:].reshape(-1, 4)
    scores = scores[:, 1:].reshape(-1)
    labels = np.tile(np.arange(1, num_classes), len(rois))
    candidates = np.flatnonzero(scores > score_threshold)
    candidates = candidates[remove_small(boxes[candidates], min_size)]
    kept = []
    for cls in np.unique(labels[candidates]):
        own = candidates[labels[candidates] == cls]
        kept.append(own[nms(boxes[own], scores[own], nms_threshold)])
    kept = np.concatenate(kept) if kept else np.zeros(0, np.int64)
    kept = np.sort(kept)  # equal scores then come out in (RoI, class) order
    kept = kept[score_order(scores[kept])][:int(max_detections)]
    return boxes[kept].astype(np.float32), scores[kept].astype(np.float32), labels[kept]
