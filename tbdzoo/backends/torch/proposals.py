"""Proposals (``proposals.proposals``) computed by PyTorch on a device, for
``tbdzoo.models.faster_rcnn.detection.kernels.lending``: the decode, clip, size filter, score order and NMS of the
NumPy reference with the same float64 operations, one elementwise kernel each (no fused
multiply-add, no division by a reciprocal: ``roi_align.divide``), so the boxes are the
reference's bit for bit (tests/test_detection_nms.py). The exponentials of the decode stay on
the host, NumPy's: the one operation whose rounding a CUDA kernel need not share. The NMS is
``nms.nms``, on the boxes where they are."""
import numpy as np
import torch

from ...errors import DetectionInputError
from ...models.faster_rcnn.detection.boxes import SCALE_CLIP
from . import nms as torch_nms
from .roi_align import divide


def _decoded(deltas, anchors, weights, device):
    """``boxes.decode`` of (N, 4) deltas from (N, 4) anchors, on ``device`` (float64)."""
    wx, wy, ww, wh = (float(w) for w in weights)
    deltas = np.asarray(deltas, dtype=np.float64).reshape(-1, 4)
    grow = np.exp(np.minimum(deltas[:, 2:] / np.array([ww, wh]), SCALE_CLIP))  # (N, 2)

    def up(array):
        return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float64)).to(device)
    d, grow, a = up(deltas), up(grow), up(anchors)
    widths = a[:, 2] - a[:, 0]
    heights = a[:, 3] - a[:, 1]
    ctr_x = a[:, 0] + 0.5 * widths
    ctr_y = a[:, 1] + 0.5 * heights
    pred_x = divide(d[:, 0], wx) * widths + ctr_x
    pred_y = divide(d[:, 1], wy) * heights + ctr_y
    half_w = 0.5 * (grow[:, 0] * widths)
    half_h = 0.5 * (grow[:, 1] * heights)
    return torch.stack([pred_x - half_w, pred_y - half_h, pred_x + half_w, pred_y + half_h], 1)


def proposals(objectness, deltas, anchors, valid_hw, pre_nms, post_nms, threshold, min_size,
              weights, device):
    """``proposals.proposals`` on checked inputs: boxes (P, 4) and scores (P,), float32 NumPy."""
    height, width = valid_hw
    boxes = _decoded(deltas, anchors, weights, device)
    boxes[:, 0::2] = boxes[:, 0::2].clamp(0.0, float(width))
    boxes[:, 1::2] = boxes[:, 1::2].clamp(0.0, float(height))
    big = torch.nonzero((boxes[:, 2] - boxes[:, 0] >= min_size) &
                        (boxes[:, 3] - boxes[:, 1] >= min_size))[:, 0]
    scores = torch.from_numpy(np.ascontiguousarray(objectness, dtype=np.float64)).to(device)
    candidates = scores[big]
    nan = torch.isnan(candidates)
    if bool(nan.any()):
        raise DetectionInputError("scores[{}] is NaN: a score must be a number".format(
            int(torch.nonzero(nan)[0, 0])))
    best = big[torch_nms.score_order(candidates)][:int(pre_nms)]
    kept = best[torch_nms.nms(boxes[best], scores[best], threshold, max_keep=int(post_nms))]
    return (boxes[kept].to(torch.float32).cpu().numpy(),
            scores[kept].to(torch.float32).cpu().numpy())


def host_kernel(device):
    """``proposals`` by PyTorch on ``device``, for ``kernels.lending``."""
    def kernel(objectness, deltas, anchors, valid_hw, pre_nms, post_nms, threshold, min_size,
               weights):
        return proposals(objectness, deltas, anchors, valid_hw, pre_nms, post_nms, threshold,
                         min_size, weights, device)
    return kernel
