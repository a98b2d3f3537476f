"""Checks of a batch's RoIAlign inputs, before any framework sees them.

Frameworks disagree on a tap index outside its example's feature map: PyTorch raises,
MXNet's ``take`` clamps it silently, TensorFlow's CPU gather fails naming no input, and CNTK's
gather (over the whole batch's rows) reads another example's map. So the one batch check
(common/batches.py) checks the NumPy batch here first and fails with one BatchError naming the
node, the input, the example and the fix. Valid Python 3.6.
"""
import numpy as np

from ...errors import BatchError


def check_batch(graph, batch):
    """Raise BatchError when a ``roi_align`` node's indices (a graph input in ``batch``) leave
    [0, H * W) of its features, or its weights are not finite."""
    for node in graph.nodes.values():
        if node.op != "roi_align":
            continue
        _, h, w = graph.shape_of(node.inputs[0])
        indices, weights = node.inputs[1], node.inputs[2]
        if indices in graph.inputs and indices in batch:
            values = np.asarray(batch[indices])
            if not np.issubdtype(values.dtype, np.integer) and \
                    np.any(values != np.floor(values)):
                raise BatchError("node {!r} (roi_align): input {!r} holds non-integer values; "
                                 "it takes int32 flat indices into the (H, W) feature map".format(
                                     node.name, indices), input=indices, allowed="integers")
            bad = np.argwhere((values < 0) | (values >= h * w))
            if len(bad):
                n, r, s, k = (int(v) for v in bad[0])
                raise BatchError(
                    "node {!r} (roi_align): input {!r}: example {}, RoI {}, sample {}, tap {} "
                    "is index {}, outside [0, {}) of the {} x {} feature map; indices are "
                    "flat (y * W + x) and each tap must lie inside the map (clamp the sample "
                    "points to it when computing them)".format(
                        node.name, indices, n, r, s, k, values[n, r, s, k], h * w, h, w),
                    input=indices, position=(n, r, s, k), value=int(values[n, r, s, k]),
                    allowed=(0, h * w))
        if weights in graph.inputs and weights in batch:
            values = np.asarray(batch[weights])
            if not np.all(np.isfinite(values)):
                at = tuple(int(v) for v in np.argwhere(~np.isfinite(values))[0])
                raise BatchError("node {!r} (roi_align): input {!r}: example {} holds a "
                                 "non-finite weight".format(node.name, weights, at[0]),
                                 input=weights, position=at, value=float(values[at]),
                                 allowed="finite numbers")
