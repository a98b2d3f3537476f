"""Training targets: which anchors the RPN learns from, and which RoIs the head learns from.

Values are mx-rcnn's (TBD's Faster R-CNN), the rules docs/detection.md states. Subsampling draws
from the RandomState the caller passes (see randomness.step_rng), only when there are more
candidates than places; the kept indices are then sorted, so the output order never depends on
the draw order.
"""
import numpy as np

from ....errors import DetectionInputError
from .boxes import HEAD_WEIGHTS, RPN_WEIGHTS, check_boxes, check_image_hw, encode, iou

IGNORE = -1


def _subsample(indices, count, rng):
    """``count`` of ``indices`` drawn without replacement, ascending; all of them if fewer."""
    if len(indices) <= count:
        return indices
    return np.sort(indices[rng.permutation(len(indices))[:count]])


def _check_rng(rng):
    if not isinstance(rng, np.random.RandomState):
        raise DetectionInputError(
            "rng must be a numpy.random.RandomState (its stream is the same on every NumPy "
            "version); got {}: use tbdzoo.models.faster_rcnn.detection.randomness.step_rng(run_seed, step, purpose)"
            .format(type(rng).__name__))


def inside_anchors(anchors, valid_hw, allowed_border=0):
    """Indices of the anchors lying within the valid image grown by ``allowed_border`` pixels;
    every anchor when ``allowed_border`` is None."""
    anchors = np.asarray(anchors, dtype=np.float64)
    if allowed_border is None:
        return np.arange(len(anchors))
    height, width = check_image_hw(valid_hw)
    b = float(allowed_border)
    return np.flatnonzero((anchors[:, 0] >= -b) & (anchors[:, 1] >= -b) &
                          (anchors[:, 2] <= width + b) & (anchors[:, 3] <= height + b))


def anchor_targets(anchors, gt_boxes, valid_hw, rng, batch_size=256, positive_fraction=0.5,
                   positive_iou=0.7, negative_iou=0.3, allowed_border=0, weights=RPN_WEIGHTS):
    """RPN targets for one image: labels (N,) int32, 1 object / 0 background / -1 ignored;
    regression targets (N, 4) float32, zero but for positives; their weights (N, 4) float32, 1 on
    positives. At most ``batch_size`` labelled anchors, at most ``positive_fraction`` of them
    positive, the rest background."""
    _check_rng(rng)
    anchors = check_boxes(anchors, "anchors")
    gt = check_boxes(gt_boxes, "gt_boxes", image_hw=valid_hw, positive=True)
    n = len(anchors)
    labels = np.full(n, IGNORE, dtype=np.int32)
    inside = inside_anchors(anchors, valid_hw, allowed_border)
    targets = np.zeros((n, 4), dtype=np.float32)
    if len(gt) == 0:
        labels[inside] = 0
    else:
        overlaps = iou(anchors[inside], gt)  # (I, G)
        best_gt = overlaps.argmax(axis=1)  # ties: the lowest gt index
        best = overlaps[np.arange(len(inside)), best_gt]
        own = np.full(len(inside), IGNORE, dtype=np.int32)
        own[best < negative_iou] = 0
        # Every ground truth's best anchors, ties included, are positive even below
        # positive_iou; a ground truth that no inside anchor touches has none.
        gt_best = overlaps.max(axis=0) if len(inside) else np.zeros(len(gt))
        ties_best = (overlaps == gt_best[None, :]) & (gt_best[None, :] > 0)
        own[ties_best.any(axis=1)] = 1
        own[best >= positive_iou] = 1
        labels[inside] = own
        positive = inside[own == 1]
        targets[positive] = encode(gt[best_gt[own == 1]], anchors[positive], weights)
    positives = np.flatnonzero(labels == 1)
    kept = _subsample(positives, int(positive_fraction * batch_size), rng)
    # the dropped positives lose their label and targets (kept is a subset of positives)
    kept_targets = targets[kept]
    labels[positives], targets[positives] = IGNORE, 0
    labels[kept], targets[kept] = 1, kept_targets
    negatives = np.flatnonzero(labels == 0)
    kept_negatives = _subsample(negatives, batch_size - len(kept), rng)
    labels[negatives] = IGNORE
    labels[kept_negatives] = 0
    target_weights = np.zeros((n, 4), dtype=np.float32)
    target_weights[kept] = 1
    return labels, targets, target_weights


def check_labels(labels, name, num_classes, count):
    """``labels`` as int64 (count,), each a class in 1 .. num_classes - 1 (0 is background)."""
    arr = np.asarray(labels)
    if arr.shape != (count,):
        raise DetectionInputError("{} must have shape ({},), one class per box; got {}".format(
            name, count, arr.shape))
    if count and not np.issubdtype(arr.dtype, np.integer):
        raise DetectionInputError("{} must be integer class ids; got dtype {}".format(
            name, arr.dtype))
    arr = arr.astype(np.int64)
    bad = (arr < 1) | (arr >= num_classes)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise DetectionInputError(
            "{}[{}] = {} is outside 1 .. {}: classes are 1 .. num_classes - 1 = {}, 0 is the "
            "background".format(name, i, int(arr[i]), num_classes - 1, num_classes - 1))
    return arr


def sample_rois(proposals, gt_boxes, gt_labels, rng, num_classes=21, batch_size=128,
                fg_fraction=0.25, fg_iou=0.5, bg_iou=(0.0, 0.5), weights=HEAD_WEIGHTS,
                valid_hw=None):
    """The head's ``batch_size`` RoIs for one image, drawn from the proposals with the ground
    truth appended: rois (R, 4) float32; labels (R,) int32 (class, 0 background, -1 padding);
    class-specific targets (R, 4 * num_classes) float32 and weights, 1 only on the 4 columns of a
    foreground RoI's own class. Foreground (IoU >= ``fg_iou``) fills at most ``fg_fraction``,
    background (IoU in ``bg_iou``, low end included) the rest; if both fall short the last places
    repeat the sampled RoIs cyclically with label -1 and zero weights."""
    _check_rng(rng)
    proposals = check_boxes(proposals, "proposals")
    gt = check_boxes(gt_boxes, "gt_boxes", image_hw=valid_hw, positive=True)
    classes = check_labels(gt_labels, "gt_labels", num_classes, len(gt))
    rois = np.concatenate([proposals, gt], axis=0)
    if len(gt):
        overlaps = iou(rois, gt)
        assigned = overlaps.argmax(axis=1)
        best = overlaps[np.arange(len(rois)), assigned]
    else:
        assigned = np.zeros(len(rois), dtype=np.int64)
        best = np.zeros(len(rois))
    fg = _subsample(np.flatnonzero(best >= fg_iou), int(round(fg_fraction * batch_size)), rng)
    bg_candidates = np.flatnonzero((best >= bg_iou[0]) & (best < bg_iou[1]))
    bg = _subsample(bg_candidates, batch_size - len(fg), rng)
    keep = np.concatenate([fg, bg]).astype(np.int64)
    labels = np.concatenate([classes[assigned[fg]], np.zeros(len(bg), np.int64)])
    out_rois = rois[keep]
    pad = batch_size - len(keep)
    if pad > 0:
        filler = (out_rois[np.arange(pad) % len(out_rois)] if len(out_rois)
                  else np.zeros((pad, 4)))
        out_rois = np.concatenate([out_rois, filler])
        labels = np.concatenate([labels, np.full(pad, IGNORE, np.int64)])
    targets = np.zeros((batch_size, 4 * num_classes), dtype=np.float32)
    target_weights = np.zeros_like(targets)
    if len(fg):  # foreground rows come first; each fills its own class's 4 columns
        columns = 4 * labels[:len(fg), None] + np.arange(4)[None, :]
        rows = np.arange(len(fg))[:, None]
        targets[rows, columns] = encode(gt[assigned[fg]], rois[fg], weights)
        target_weights[rows, columns] = 1
    return out_rois.astype(np.float32), labels.astype(np.int32), targets, target_weights
