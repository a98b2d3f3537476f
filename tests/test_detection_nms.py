"""NMS with each framework's own kernel against the NumPy reference (docs/detection.md, "NMS on
each backend"): the same kept boxes in the same order, ties included (equal scores by index),
at IoU exactly at the threshold (kept: suppression is strictly above it), with ``max_keep``,
and per class."""
import os

import numpy as np
import pytest

from conftest import require_backend, run_in_env
from nms_cases import THRESHOLDS, float_boxes, tied_pixel_boxes
from tbdzoo.backends import environments
from tbdzoo.errors import DetectionInputError
from tbdzoo.models.faster_rcnn.detection.nms import nms as reference_nms


def test_torch_nms_keeps_the_reference_boxes_with_ties_and_float_boxes():
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    from tbdzoo.backends.torch import nms as torch_nms
    rng = np.random.RandomState(0)
    for trial in range(16):
        boxes, scores = (tied_pixel_boxes if trial % 2 else float_boxes)(rng)
        threshold = THRESHOLDS[trial % 3]
        expected = reference_nms(boxes, scores, threshold)
        got = torch_nms.nms(torch.from_numpy(boxes), torch.from_numpy(scores), threshold)
        np.testing.assert_array_equal(got.numpy(), expected)
        np.testing.assert_array_equal(
            torch_nms.nms(torch.from_numpy(boxes), torch.from_numpy(scores), threshold, 7).numpy(),
            reference_nms(boxes, scores, threshold, max_keep=7))
    # equal scores on identical boxes: the lowest index is kept
    same = torch.tensor([[0.0, 0.0, 4.0, 4.0]] * 3)
    assert torch_nms.nms(same, torch.ones(3), 0.5).tolist() == [0]


def test_score_order_is_the_stable_descending_order_for_float32_and_float64_scores():
    from tbdzoo.models.faster_rcnn.detection.nms import score_order
    rng = np.random.RandomState(2)
    single = rng.standard_normal(5000).astype(np.float32)
    single[::7] = single[1]                      # ties
    single[3::11] = np.float32(0)
    single[5::13] = np.float32(-0.0)             # -0 ties with 0
    single[:4] = [np.inf, -np.inf, np.float32(1e-45), np.float32(-1e-45)]
    for scores in (single, single.astype(np.float64), rng.standard_normal(3000),
                   np.zeros(0, np.float32)):
        np.testing.assert_array_equal(score_order(scores),
                                      np.argsort(-np.asarray(scores, np.float64), kind="stable"))


def test_torch_nms_with_max_keep_on_a_prefix_keeps_the_boxes_of_the_whole(monkeypatch):
    """max_keep runs the kernel on the best boxes first and doubles them until it keeps enough:
    the kept boxes are those of NMS over every box, whether the first prefix suffices, needs to
    grow, or never reaches max_keep."""
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    from tbdzoo.backends.torch import nms as torch_nms
    sizes = []
    kernel = torchvision.ops.nms
    monkeypatch.setattr(torchvision.ops, "nms",
                        lambda b, s, t: sizes.append(len(b)) or kernel(b, s, t))
    rng = np.random.RandomState(1)
    boxes, scores = float_boxes(rng, n=2000)
    expected = reference_nms(boxes, scores, 0.5)
    for max_keep in (10, len(expected) // 2, len(expected) - 1, len(expected) + 5):
        del sizes[:]
        got = torch_nms.nms(torch.from_numpy(boxes), torch.from_numpy(scores), 0.5, max_keep)
        np.testing.assert_array_equal(got.numpy(), expected[:max_keep])
        assert sizes[0] == min(2000, torch_nms.PREFIX_PER_KEPT * max_keep)
        assert sizes[-1] <= 2000 and sizes == sorted(sizes)
    assert sizes[-1] == 2000  # more than NMS keeps: the prefix grew to every box


def test_proposals_keep_their_boxes_with_torchvisions_kernel_lent():
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    from tbdzoo.backends.torch import nms as torch_nms
    from tbdzoo.models.faster_rcnn.detection import kernels
    from tbdzoo.models.faster_rcnn.detection.proposals import proposals
    rng = np.random.RandomState(3)
    anchors, _ = float_boxes(rng, 600)
    objectness = np.round(rng.uniform(size=600), 1)  # ties
    deltas = 0.2 * rng.randn(600, 4)
    calls = []
    kernel = torch_nms.host_kernel(torch.device("cpu"))

    def counted(*args):
        calls.append(len(args[0]))
        return kernel(*args)
    expected = proposals(objectness, deltas, anchors, (90, 90), 400, 100, 0.7, 2.0)
    with kernels.lending(nms=counted):
        got = proposals(objectness, deltas, anchors, (90, 90), 400, 100, 0.7, 2.0)
    assert calls and calls[0] <= 400
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])
    assert kernels.lent("nms") is None  # restored after the block


def test_proposals_on_pytorch_are_the_numpy_boxes_bit_for_bit():
    """The whole of ``proposals`` lent to PyTorch (decode, clip, size filter, score order, NMS)
    gives the reference's boxes and scores exactly: with tied and signed-zero scores, deltas
    past the scale clip, boxes the clip and the size filter remove, and with no box left. On
    the CPU here; the same float64 operations run on a GPU."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    from tbdzoo.backends.torch import proposals as torch_proposals
    from tbdzoo.errors import DetectionInputError
    from tbdzoo.models.faster_rcnn.detection import kernels
    from tbdzoo.models.faster_rcnn.detection.proposals import proposals
    kernel = torch_proposals.host_kernel(torch.device("cpu"))
    rng = np.random.RandomState(4)
    for trial in range(6):
        n = 900
        anchors = float_boxes(rng, n)[0] * 1.5 - 10
        objectness = np.round(rng.randn(n), 1).astype(np.float32)  # ties, and 0.0 with -0.0
        objectness[::17] = -0.0
        deltas = (0.3 * rng.randn(n, 4)).astype(np.float32)
        deltas[::29, 2:] = 9.0                                    # past SCALE_CLIP
        args = (objectness, deltas, anchors, (80 + trial, 90), 600, 150, 0.5 + 0.05 * trial,
                4.0 * trial)
        expected = proposals(*args)
        with kernels.lending(proposals=kernel):
            got = proposals(*args)
        assert got[0].dtype == expected[0].dtype == np.float32 and len(expected[0])
        np.testing.assert_array_equal(got[0], expected[0])
        np.testing.assert_array_equal(got[1], expected[1])
    args = (objectness, deltas, anchors, (80, 90), 600, 150, 0.7, 1e6)  # nothing that large
    with kernels.lending(proposals=kernel):
        assert proposals(*args)[0].shape == (0, 4)
    objectness = objectness.astype(np.float64)
    objectness[5] = np.nan
    with kernels.lending(proposals=kernel), pytest.raises(DetectionInputError, match="NaN"):
        proposals(objectness, deltas, anchors, (80, 90), 600, 150, 0.7, 0.0)


def test_torch_batched_nms_is_the_per_class_nms_of_postprocess():
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    from tbdzoo.backends.torch import nms as torch_nms
    rng = np.random.RandomState(1)
    boxes, scores = tied_pixel_boxes(rng)
    labels = rng.randint(1, 4, len(boxes))
    kept = []
    for c in np.unique(labels):
        own = np.flatnonzero(labels == c)
        kept.append(own[reference_nms(boxes[own], scores[own], 0.5)])
    kept = np.sort(np.concatenate(kept))
    expected = kept[np.argsort(-scores[kept], kind="stable")]
    got = torch_nms.batched_nms(torch.from_numpy(boxes), torch.from_numpy(scores),
                                torch.from_numpy(labels), 0.5)
    np.testing.assert_array_equal(got.numpy(), expected)


def test_torch_nms_without_torchvision_runs_the_reference(monkeypatch):
    torch = pytest.importorskip("torch")
    import sys

    from tbdzoo.backends.torch import nms as torch_nms
    boxes, scores = tied_pixel_boxes(np.random.RandomState(5), 60)
    monkeypatch.setitem(sys.modules, "torchvision", None)  # import torchvision now fails
    got = torch_nms.nms(torch.from_numpy(boxes), torch.from_numpy(scores), 0.5, max_keep=9)
    assert got.dtype == torch.int64
    np.testing.assert_array_equal(got.numpy(), reference_nms(boxes, scores, 0.5, max_keep=9))


def test_torch_nms_refuses_nan_scores_and_mismatched_lengths():
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    from tbdzoo.backends.torch import nms as torch_nms
    boxes = torch.tensor([[0.0, 0.0, 2.0, 2.0], [1.0, 1.0, 3.0, 3.0]])
    with pytest.raises(DetectionInputError, match=r"scores\[1\] is NaN"):
        torch_nms.nms(boxes, torch.tensor([0.5, float("nan")]), 0.5)
    with pytest.raises(DetectionInputError, match="2 boxes but 3 scores"):
        torch_nms.nms(boxes, torch.ones(3), 0.5)


def test_tensorflow_nms_keeps_the_reference_boxes_on_whole_pixels_with_ties():
    """Eagerly and in a tf.function. TensorFlow takes the IoU in float32: on whole-pixel boxes
    that never moves a comparison with the threshold."""
    pytest.importorskip("torch")  # torch before TensorFlow in one process
    tf = pytest.importorskip("tensorflow")
    from tbdzoo.backends.tensorflow import nms as tensorflow_nms
    rng = np.random.RandomState(2)
    traced = tf.function(lambda b, s, t: tensorflow_nms.nms(b, s, t), autograph=False)
    for trial in range(6):
        boxes, scores = tied_pixel_boxes(rng)
        threshold = THRESHOLDS[trial % 3]
        expected = reference_nms(boxes, scores, threshold)
        np.testing.assert_array_equal(tensorflow_nms.nms(boxes, scores, threshold).numpy(),
                                      expected)
        np.testing.assert_array_equal(traced(boxes, scores, threshold).numpy(), expected)
    with pytest.raises(DetectionInputError, match="NaN"):
        tensorflow_nms.nms(boxes[:2], np.array([0.5, np.nan], np.float32), 0.5)


def test_mxnet_nms_keeps_the_reference_boxes_with_ties_and_float_boxes():
    from conftest import require_framework
    require_framework("mxnet")
    from tbdzoo.backends.mxnet import nms as mxnet_nms
    # isort: split
    import mxnet as mx
    rng = np.random.RandomState(3)
    for trial in range(12):
        boxes, scores = (tied_pixel_boxes if trial % 2 else float_boxes)(rng)
        threshold = THRESHOLDS[trial % 3]
        np.testing.assert_array_equal(
            mxnet_nms.nms(mx.nd.array(boxes, dtype="float64"), mx.nd.array(scores), threshold),
            reference_nms(boxes, scores, threshold))
    np.testing.assert_array_equal(
        mxnet_nms.nms(mx.nd.array(boxes), mx.nd.array(scores), 0.5, max_keep=5),
        reference_nms(boxes, scores, 0.5, max_keep=5))
    with pytest.raises(DetectionInputError, match=r"scores\[1\] is NaN"):
        mxnet_nms.nms(mx.nd.array(boxes[:2]), mx.nd.array([0.5, np.nan]), 0.5)


_JAX_NMS_CHECK = r"""
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from nms_cases import THRESHOLDS, float_boxes, tied_pixel_boxes
from tbdzoo.backends.jax import nms as jax_nms
from tbdzoo.errors import DetectionInputError
from tbdzoo.models.faster_rcnn.detection import kernels
from tbdzoo.models.faster_rcnn.detection.nms import nms as reference_nms
from tbdzoo.models.faster_rcnn.detection.proposals import proposals

rng = np.random.RandomState(0)
for trial in range(16):
    boxes, scores = (tied_pixel_boxes if trial % 2 else float_boxes)(rng, 300 + 97 * trial)
    threshold = THRESHOLDS[trial % 3]
    for max_keep in (None, 0, 7, 150):
        np.testing.assert_array_equal(jax_nms.nms(boxes, scores, threshold, max_keep),
                                      reference_nms(boxes, scores, threshold, max_keep))
assert jax_nms.nms(np.array([[0.0, 0.0, 4.0, 4.0]] * 3), np.ones(3), 0.5).tolist() == [0]
# piled boxes: the best 2 * max_keep keep too few, so the prefix grows, four times
boxes, scores = float_boxes(rng, 1500)
boxes[:1400] = boxes[0] + rng.uniform(0, 0.5, (1400, 4))
for max_keep in (40, 90):
    np.testing.assert_array_equal(jax_nms.nms(boxes, scores, 0.7, max_keep),
                                  reference_nms(boxes, scores, 0.7, max_keep))
assert jax_nms.nms(np.zeros((0, 4)), np.zeros(0), 0.5).shape == (0,)
scores[3] = np.nan
try:
    jax_nms.nms(boxes, scores, 0.5)
    raise SystemExit("no error for a NaN score")
except DetectionInputError as error:
    assert "scores[3] is NaN" in str(error), error
anchors, _ = float_boxes(rng, 1500)
objectness = np.round(rng.uniform(size=1500), 1)  # ties
deltas = 0.2 * rng.randn(1500, 4)
args = (objectness, deltas, anchors, (90, 90), 1200, 300, 0.7, 2.0)
expected = proposals(*args)
with kernels.lending(nms=jax_nms.host_kernel(None)):
    got = proposals(*args)
np.testing.assert_array_equal(got[0], expected[0])
np.testing.assert_array_equal(got[1], expected[1])
print("jax nms ok")
"""


def test_jax_nms_keeps_the_reference_boxes():
    """The JAX backend's NMS (the overlaps as bits on the device in float64, the walk over them
    on the host) keeps the reference's boxes in its order: ties, IoU at the threshold,
    ``max_keep`` (0 included, and prefixes that must grow), no box, a NaN score, and the
    proposals it is lent to. On the CPU here; on a GPU ``benchmarks/detection_kernels_check.py``
    checks the same."""
    require_backend("jax")
    proc = run_in_env(environments.python_of("jax"),
                      ["-c", _JAX_NMS_CHECK, os.path.dirname(os.path.abspath(__file__))],
                      timeout=600)
    assert proc.returncode == 0 and "jax nms ok" in proc.stdout, proc.stdout + proc.stderr
