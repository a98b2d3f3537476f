"""Greedy non-maximum suppression with one stated tie order, so every backend keeps the same boxes."""
import numpy as np

from ..errors import DetectionInputError
from .boxes import areas


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
    stops after that many (the same first ``max_keep`` as without it)."""
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    scores = np.asarray(scores).reshape(-1)
    if len(scores) != len(boxes):
        raise DetectionInputError("nms got {} boxes but {} scores".format(len(boxes), len(scores)))
    order = score_order(scores)
    area = areas(boxes)
    keep = []
    limit = len(order) if max_keep is None else int(max_keep)
    while order.size > 0 and len(keep) < limit:
        i = order[0]
        keep.append(i)
        rest = order[1:]
        wx = np.minimum(boxes[i, 2], boxes[rest, 2]) - np.maximum(boxes[i, 0], boxes[rest, 0])
        wy = np.minimum(boxes[i, 3], boxes[rest, 3]) - np.maximum(boxes[i, 1], boxes[rest, 1])
        inter = np.maximum(wx, 0.0) * np.maximum(wy, 0.0)
        union = area[i] + area[rest] - inter
        overlap = np.zeros_like(inter)
        np.divide(inter, union, out=overlap, where=union > 0)
        order = rest[overlap <= threshold]
    return np.asarray(keep, dtype=np.int64)
