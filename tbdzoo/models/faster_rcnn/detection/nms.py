"""Greedy non-maximum suppression with one stated tie order, so that every backend keeps the
same boxes. A backend may lend it its framework's kernel (detection/kernels.py)."""
import numpy as np

from ....errors import DetectionInputError
from . import kernels

BLOCK = 256  # boxes compared at once: the result is the greedy one, only faster


def score_order(scores):
    """Indices by score descending, equal scores by index ascending (a stable sort)."""
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    if np.isnan(scores).any():
        raise DetectionInputError("scores[{}] is NaN: a score must be a number".format(
            int(np.flatnonzero(np.isnan(scores))[0])))
    single = scores.astype(np.float32)
    if len(scores) < 2 ** 31 and np.array_equal(single, scores):
        return _single_precision_order(single)
    return np.argsort(-scores, kind="stable")


def _single_precision_order(scores):
    """``score_order`` of float32 scores (no NaN) as one int64 sort: each score's bits, mapped
    to an integer of the same order (-0 and 0 alike), above its index. The keys are unique, so
    the plain sort gives the stable order, several times faster (RPN scores are float32)."""
    bits = scores.view(np.int32).astype(np.int64)
    ordered = np.where(bits < 0, -(bits & 0x7FFFFFFF), bits)
    keys = (-ordered << 32) | np.arange(len(scores), dtype=np.int64)
    return np.sort(keys) & 0xFFFFFFFF


def overlaps_above(a, b, threshold):
    """(len(a), len(b)) booleans: IoU > ``threshold``, the IoU computed exactly as boxes.iou
    but in place (this is most of the time NMS takes)."""
    ax1, ay1, ax2, ay2 = (a[:, i, None] for i in range(4))
    bx1, by1, bx2, by2 = (b[None, :, i] for i in range(4))
    inter = np.minimum(ax2, bx2)
    inter -= np.maximum(ax1, bx1)
    np.maximum(inter, 0.0, out=inter)
    height = np.minimum(ay2, by2)
    height -= np.maximum(ay1, by1)
    np.maximum(height, 0.0, out=height)
    inter *= height
    union = (ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1)
    union -= inter
    with np.errstate(invalid="ignore", divide="ignore"):  # 0 / 0 is NaN: not above
        np.divide(inter, union, out=union)
    return union > threshold


def nms(boxes, scores, threshold, max_keep=None):
    """Indices of the kept boxes, best first. Walking boxes in ``score_order``, a box is kept
    unless its IoU with an already kept box is strictly greater than ``threshold``. ``max_keep``
    stops after that many (the same first ``max_keep`` as without it).

    The walk goes a block of boxes at a time: first every kept box of earlier blocks suppresses
    in one matrix, then the block's own boxes in turn."""
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    scores = np.asarray(scores).reshape(-1)
    if len(scores) != len(boxes):
        raise DetectionInputError("nms got {} boxes but {} scores".format(len(boxes), len(scores)))
    kernel = kernels.lent("nms")
    if kernel is not None:
        return np.asarray(kernel(boxes, scores, threshold, max_keep), dtype=np.int64)
    order = score_order(scores)
    ranked = boxes[order]
    limit = len(order) if max_keep is None else int(max_keep)
    keep = []
    for start in range(0, len(order), BLOCK):
        if len(keep) >= limit:
            break
        block = ranked[start:start + BLOCK]
        alive = np.ones(len(block), dtype=bool)
        for first in range(0, len(keep), BLOCK):  # kept boxes a block at a time: in cache
            kept = ranked[keep[first:first + BLOCK]]
            alive[alive] &= ~overlaps_above(kept, block[alive], threshold).any(axis=0)
            if not alive.any():
                break
        inside = overlaps_above(block, block, threshold)
        for i in np.flatnonzero(alive):
            if not alive[i]:
                continue
            keep.append(start + i)
            if len(keep) >= limit:
                break
            alive[i + 1:] &= ~inside[i, i + 1:]
    return order[np.asarray(keep, dtype=np.int64)]
