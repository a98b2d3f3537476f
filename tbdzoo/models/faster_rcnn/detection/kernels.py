"""Kernels a backend lends the NumPy reference for the length of a call: its framework's own
operator doing the same work on the device. A lent kernel must give exactly what the NumPy code
gives (the same kept boxes, the same gather points); each has a test saying so
(tests/test_detection_nms.py, tests/test_detection_ops.py), so the targets every backend trains on
stay the same. Kernels: ``nms(boxes, scores, threshold, max_keep)``,
``roi_align_points(rois, (height, width), spatial_scale, (out_h, out_w), sampling_ratio,
aligned)`` and ``proposals(objectness, deltas, anchors, (height, width), pre_nms, post_nms,
threshold, min_size, weights)`` (inputs already checked), with the NumPy functions' arguments
and results."""
import contextlib
import threading

NAMES = ("nms", "roi_align_points", "proposals")

_state = threading.local()


@contextlib.contextmanager
def lending(**given):
    """Within the block, the named NumPy functions call the given kernels (None: NumPy)."""
    unknown = sorted(set(given) - set(NAMES))
    if unknown:
        raise ValueError("no kernel slot {}; the slots are {}".format(
            ", ".join(unknown), ", ".join(NAMES)))
    previous = dict(getattr(_state, "kernels", {}))
    _state.kernels = dict(previous, **given)
    try:
        yield
    finally:
        _state.kernels = previous


def lent(name):
    """The kernel lent for ``name`` in this thread, or None."""
    return getattr(_state, "kernels", {}).get(name)
