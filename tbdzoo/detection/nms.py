"""Greedy non-maximum suppression with one stated tie order, so that every backend keeps the
same boxes."""
import numpy as np

from ..errors import DetectionInputError
from .boxes import iou

BLOCK = 256  # boxes compared at once: the result is the greedy one, only faster


def score_order(scores):
    """Indices by score descending, equal scores by index ascending (a stable sort)."""
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    if np.isnan(scores).any():
        raise DetectionInputError("scores[{}] is NaN: a score must be a number".format(
            int(np.flatnonzero(np.isnan(scores))[0])))
    return np.argsort(-scores, kind="stable")


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
    order = score_order(scores)
    ranked = boxes[order]
    limit = len(order) if max_keep is None else int(max_keep)
    keep = []
    for start in range(0, len(order), BLOCK):
        if len(keep) >= limit:
            break
        block = ranked[start:start + BLOCK]
        alive = np.ones(len(block), dtype=bool)
        if keep:
            alive &= ~(iou(ranked[keep], block) > threshold).any(axis=0)
        inside = iou(block, block)
        for i in np.flatnonzero(alive):
            if not alive[i]:
                continue
            keep.append(start + i)
            if len(keep) >= limit:
                break
            alive[i + 1:] &= inside[i, i + 1:] <= threshold
    return order[np.asarray(keep, dtype=np.int64)]
