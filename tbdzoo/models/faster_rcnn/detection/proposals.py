"""RPN outputs -> proposals, in mx-rcnn's order: decode every anchor, clip to the valid image,
drop boxes smaller than ``min_size``, keep the ``pre_nms`` best, NMS, keep the ``post_nms`` best.
A backend may lend the whole function a kernel of its framework (detection/kernels.py)."""
import numpy as np

from ....errors import DetectionInputError
from . import kernels
from .boxes import RPN_WEIGHTS, check_boxes, check_image_hw, clip, decode, remove_small
from .nms import nms, score_order

# mx-rcnn's TRAIN / TEST settings; min_size is RPN_MIN_SIZE = 16 pixels of the original image,
# so a caller that resizes the image by a factor s passes 16 * s.
TRAIN = {"pre_nms": 12000, "post_nms": 2000, "threshold": 0.7, "min_size": 16.0}
EVAL = {"pre_nms": 6000, "post_nms": 300, "threshold": 0.7, "min_size": 16.0}


def proposals(objectness, deltas, anchors, valid_hw, pre_nms, post_nms, threshold, min_size,
              weights=RPN_WEIGHTS):
    """One image's proposals: boxes (P, 4) float32 and their scores (P,), best first, P <=
    ``post_nms``. ``objectness`` (N,) is any score increasing with objectness (a probability or a
    logit), ``deltas`` (N, 4) the RPN's regression, both in the order of ``anchors`` (N, 4).
    Call as ``proposals(..., **TRAIN)`` or ``**EVAL``."""
    anchors = check_boxes(anchors, "anchors")
    objectness = np.asarray(objectness, dtype=np.float64).reshape(-1)
    deltas = np.asarray(deltas, dtype=np.float64)
    if objectness.shape != (len(anchors),) or deltas.shape != (len(anchors), 4):
        raise DetectionInputError(
            "objectness must be ({0},) and deltas ({0}, 4), one per anchor in the anchors' order; "
            "got {1} and {2}".format(len(anchors), objectness.shape, deltas.shape))
    height, width = check_image_hw(valid_hw)
    kernel = kernels.lent("proposals")
    if kernel is not None:
        return kernel(objectness, deltas, anchors, (height, width), pre_nms, post_nms,
                      threshold, min_size, weights)
    boxes = clip(decode(deltas, anchors, weights), height, width)
    big = remove_small(boxes, min_size)
    best = big[score_order(objectness[big])][:int(pre_nms)]
    kept = best[nms(boxes[best], objectness[best], threshold, max_keep=int(post_nms))]
    return boxes[kept].astype(np.float32), objectness[kept].astype(np.float32)
