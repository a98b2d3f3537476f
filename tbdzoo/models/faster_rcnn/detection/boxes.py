"""Box arithmetic every detection step shares, in one convention (docs/detection.md).

Boxes are (x1, y1, x2, y2) in input-image pixels with no "+1": width = x2 - x1. The coding is
torchvision's BoxCoder, so a backend's RPN and head regress the same numbers on every framework.
"""
import math

import numpy as np

from ....errors import DetectionInputError

RPN_WEIGHTS = (1.0, 1.0, 1.0, 1.0)
HEAD_WEIGHTS = (10.0, 10.0, 5.0, 5.0)  # mx-rcnn's BBOX_STDS (0.1, 0.1, 0.2, 0.2), inverted
SCALE_CLIP = math.log(1000.0 / 16)  # largest dw, dh decoded, as torchvision's bbox_xform_clip


def check_boxes(boxes, name, image_hw=None, positive=False):
    """``boxes`` as float64 (N, 4), refused by name and row when a box is malformed.

    ``positive`` asks for x2 > x1 and y2 > y1 (boxes that get encoded); ``image_hw`` asks every
    box to lie in [0, width] x [0, height].
    """
    arr = np.asarray(boxes, dtype=np.float64)
    if arr.ndim == 1 and arr.size == 0:
        arr = arr.reshape(0, 4)
    if arr.ndim != 2 or arr.shape[1] != 4:
        raise DetectionInputError("{} must have shape (N, 4) as (x1, y1, x2, y2); got {}".format(
            name, np.shape(boxes)))
    # each check is one pass over the array; the offending row is looked for only on failure
    if not np.isfinite(arr).all():
        i = int(np.flatnonzero(~np.isfinite(arr).all(axis=1))[0])
        raise DetectionInputError("{}[{}] = {} is not finite".format(name, i, arr[i].tolist()))
    for lo, hi, axis in ((0, 2, "x"), (1, 3, "y")):
        bad = arr[:, hi] <= arr[:, lo] if positive else arr[:, hi] < arr[:, lo]
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise DetectionInputError(
                "{}[{}] = {} has {}2 {} {}1: boxes are (x1, y1, x2, y2) with x1 <= x2 and y1 <= y2"
                "{}".format(name, i, arr[i].tolist(), axis, "<=" if positive else "<", axis,
                            " and a positive width and height" if positive else ""))
    if image_hw is not None:
        height, width = check_image_hw(image_hw)
        outside = ((arr[:, 0] < 0) | (arr[:, 1] < 0) | (arr[:, 2] > width) | (arr[:, 3] > height))
        if outside.any():
            i = int(np.flatnonzero(outside)[0])
            raise DetectionInputError(
                "{}[{}] = {} reaches outside the image [0, {:g}] x [0, {:g}] (x by y): clip it "
                "to the image first".format(name, i, arr[i].tolist(), width, height))
    return arr


def check_image_hw(image_hw, name="valid_hw"):
    """(height, width) as two positive floats, refused by name otherwise."""
    try:
        height, width = (float(v) for v in image_hw)
    except (TypeError, ValueError):
        raise DetectionInputError("{} must be (height, width); got {!r}".format(name, image_hw)) from None
    if not (height > 0 and width > 0):
        raise DetectionInputError("{} = {!r} must be a positive (height, width)".format(
            name, image_hw))
    return height, width


def areas(boxes):
    boxes = np.asarray(boxes, dtype=np.float64)
    return (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])


def iou(a, b):
    """(N, M) intersection over union of boxes ``a`` (N, 4) and ``b`` (M, 4); 0 where the union
    is empty. Computed as (M, N) and returned transposed when N > M: NumPy's elementwise loops
    then run along the many anchors rather than the few ground truths (the same operations on
    the same values, several times faster at an RPN's 20,000 x 3)."""
    a = np.asarray(a, dtype=np.float64).reshape(-1, 4)
    b = np.asarray(b, dtype=np.float64).reshape(-1, 4)
    if len(a) > len(b):
        return _iou(b, a).T
    return _iou(a, b)


def _iou(a, b):
    ax1, ay1, ax2, ay2 = (a[:, i, None] for i in range(4))
    bx1, by1, bx2, by2 = (np.ascontiguousarray(b[:, i])[None, :] for i in range(4))
    width = np.minimum(ax2, bx2) - np.maximum(ax1, bx1)
    height = np.minimum(ay2, by2) - np.maximum(ay1, by1)
    inter = np.maximum(width, 0.0) * np.maximum(height, 0.0)
    union = ((ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1)) - inter
    out = np.zeros_like(inter)
    np.divide(inter, union, out=out, where=union > 0)
    return out


def _centres(boxes):
    widths = boxes[:, 2] - boxes[:, 0]
    heights = boxes[:, 3] - boxes[:, 1]
    return boxes[:, 0] + 0.5 * widths, boxes[:, 1] + 0.5 * heights, widths, heights


def encode(reference, proposals, weights):
    """Regression targets (N, 4) that move ``proposals`` onto ``reference`` (both (N, 4)):
    (wx dx, wy dy, ww log(w'/w), wh log(h'/h)) with dx, dy in units of the proposal's size."""
    reference = np.asarray(reference, dtype=np.float64).reshape(-1, 4)
    proposals = np.asarray(proposals, dtype=np.float64).reshape(-1, 4)
    wx, wy, ww, wh = (float(w) for w in weights)
    ex_x, ex_y, ex_w, ex_h = _centres(proposals)
    gt_x, gt_y, gt_w, gt_h = _centres(reference)
    return np.stack([wx * (gt_x - ex_x) / ex_w, wy * (gt_y - ex_y) / ex_h,
                     ww * np.log(gt_w / ex_w), wh * np.log(gt_h / ex_h)], axis=1)


def decode(deltas, boxes, weights, scale_clip=SCALE_CLIP):
    """Boxes (N, 4K) that ``deltas`` (N, 4K) give from ``boxes`` (N, 4), K boxes per row (one per
    class for the head); dw and dh are clamped at ``scale_clip`` before the exponential."""
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    deltas = np.asarray(deltas, dtype=np.float64)
    deltas = deltas.reshape(deltas.shape[0], -1)
    wx, wy, ww, wh = (float(w) for w in weights)
    ctr_x, ctr_y, widths, heights = _centres(boxes)
    dx = deltas[:, 0::4] / wx
    dy = deltas[:, 1::4] / wy
    dw = np.minimum(deltas[:, 2::4] / ww, scale_clip)
    dh = np.minimum(deltas[:, 3::4] / wh, scale_clip)
    pred_x = dx * widths[:, None] + ctr_x[:, None]
    pred_y = dy * heights[:, None] + ctr_y[:, None]
    half_w = 0.5 * (np.exp(dw) * widths[:, None])
    half_h = 0.5 * (np.exp(dh) * heights[:, None])
    out = np.stack([pred_x - half_w, pred_y - half_h, pred_x + half_w, pred_y + half_h], axis=2)
    return out.reshape(deltas.shape[0], -1)


def clip(boxes, height, width):
    """``boxes`` (..., 4K) with x clamped to [0, width] and y to [0, height]."""
    boxes = np.array(boxes, dtype=np.float64)
    boxes[..., 0::2] = np.clip(boxes[..., 0::2], 0.0, float(width))
    boxes[..., 1::2] = np.clip(boxes[..., 1::2], 0.0, float(height))
    return boxes


def remove_small(boxes, min_size):
    """Indices, ascending, of the boxes whose width and height are both at least ``min_size``."""
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    widths = boxes[:, 2] - boxes[:, 0]
    heights = boxes[:, 3] - boxes[:, 1]
    return np.flatnonzero((widths >= min_size) & (heights >= min_size))
