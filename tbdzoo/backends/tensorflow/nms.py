"""NMS on TensorFlow tensors with ``tf.image.non_max_suppression``, keeping the boxes of the
NumPy reference ``tbdzoo.models.faster_rcnn.detection.nms.nms`` (docs/detection.md, "RoIAlign and NMS on each backend").

TensorFlow's boxes are (y1, x1, y2, x2): the columns are swapped here, so callers keep
tbdzoo's (x1, y1, x2, y2). Its kernel suppresses at IoU strictly greater than the threshold,
with no "+1", like the reference. The order is fixed before the kernel sees the boxes (a stable
sort, score descending, equal scores by index ascending, then strictly decreasing stand-in
scores). One difference remains: the kernel takes the IoU in float32, the reference in float64,
so a pair whose IoU lies within float32 rounding of the threshold may go the other way
(boxes on whole pixels never do; tests/test_detection_nms.py measures the rest).
"""
from . import framework  # noqa: F401  (first: TensorFlow imported as the backend needs it)

# isort: split
import tensorflow as tf

from ...errors import DetectionInputError


def score_order(scores):
    """Indices by score descending, equal scores by index ascending (a stable sort)."""
    return tf.argsort(tf.reshape(scores, [-1]), direction="DESCENDING", stable=True)


def nms(boxes, scores, threshold, max_keep=None):
    """Indices (int32) of the kept boxes, best first; ``boxes`` (N, 4) as (x1, y1, x2, y2)."""
    boxes = tf.convert_to_tensor(boxes)
    scores = tf.reshape(tf.convert_to_tensor(scores), [-1])
    if boxes.shape.rank != 2 or boxes.shape[1] != 4:
        raise DetectionInputError("boxes must be (N, 4) as (x1, y1, x2, y2); got {}".format(
            boxes.shape))
    if tf.executing_eagerly():
        if int(tf.shape(scores)[0]) != int(tf.shape(boxes)[0]):
            raise DetectionInputError("nms got {} boxes but {} scores".format(
                int(tf.shape(boxes)[0]), int(tf.shape(scores)[0])))
        if bool(tf.reduce_any(tf.math.is_nan(scores))):
            raise DetectionInputError("scores hold NaN: a score must be a number")
    order = score_order(scores)
    count = tf.shape(order)[0]
    ranks = -tf.cast(tf.range(count), tf.float32)
    ranked = tf.gather(tf.cast(boxes, tf.float32), order)
    kept = tf.image.non_max_suppression(tf.gather(ranked, [1, 0, 3, 2], axis=1), ranks,
                                        count if max_keep is None else int(max_keep),
                                        iou_threshold=float(threshold))
    return tf.gather(order, kept)
