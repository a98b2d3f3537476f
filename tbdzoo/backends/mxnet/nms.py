"""NMS on MXNet NDArrays with ``mx.nd.contrib.box_nms``, keeping exactly the boxes of the NumPy
reference ``tbdzoo.models.faster_rcnn.detection.nms.nms`` (docs/detection.md, "RoIAlign and NMS on each backend").

box_nms takes rows of (id, score, coordinates...) and returns them sorted, suppressed rows
filled with -1; here each row is (original index, stand-in score, x1, y1, x2, y2) with
``in_format="corner"`` (x1, y1, x2, y2, no "+1", as tbdzoo's), ``force_suppress`` (one class),
in float64, the reference's arithmetic. It suppresses at IoU strictly greater than the
threshold. The order is fixed first (a stable sort, score descending, equal scores by index
ascending), and the stand-in scores N, N - 1, ..., 1 leave box_nms no ties to break.
Imperative only: the number of kept boxes is data-dependent.
"""
from . import framework  # noqa: F401  (first: numpy.bool for mxnet 1.9.1, quiet import)

# isort: split
import mxnet as mx
import numpy as np

from ...errors import DetectionInputError


def nms(boxes, scores, threshold, max_keep=None):
    """Indices (int64 NumPy array) of the kept boxes, best first; ``boxes`` (N, 4) NDArray as
    (x1, y1, x2, y2), ``scores`` (N,)."""
    if len(boxes.shape) != 2 or boxes.shape[1] != 4:
        raise DetectionInputError("boxes must be (N, 4) as (x1, y1, x2, y2); got {}".format(
            boxes.shape))
    scores = scores.reshape((-1,))
    if scores.shape[0] != boxes.shape[0]:
        raise DetectionInputError("nms got {} boxes but {} scores".format(boxes.shape[0],
                                                                          scores.shape[0]))
    count = boxes.shape[0]
    if count == 0:
        return np.zeros(0, np.int64)
    host_scores = scores.asnumpy().astype(np.float64)
    if np.isnan(host_scores).any():
        raise DetectionInputError("scores[{}] is NaN: a score must be a number".format(
            int(np.flatnonzero(np.isnan(host_scores))[0])))
    order = np.argsort(-host_scores, kind="stable")
    ctx = boxes.context
    rows = mx.nd.concat(
        mx.nd.array(order[:, None], ctx=ctx, dtype="float64"),
        mx.nd.arange(count, 0, -1, ctx=ctx, dtype="float64").reshape((-1, 1)),
        mx.nd.take(boxes.astype("float64"), mx.nd.array(order, ctx=ctx)), dim=1)
    out = mx.nd.contrib.box_nms(rows.expand_dims(0), overlap_thresh=float(threshold),
                                valid_thresh=0.5, topk=-1, coord_start=2, score_index=1,
                                id_index=-1, force_suppress=True, in_format="corner",
                                out_format="corner")
    ids = out[0, :, 0].asnumpy()
    kept = ids[ids >= 0].astype(np.int64)
    return kept if max_keep is None else kept[:int(max_keep)]
