"""The detection ops and loss kinds (docs/spec.md, "Detection"): roi_align against torchvision's
RoIAlign, to_batch's bookkeeping of a batch that grows inside the graph, frozen_batchnorm's
state, the loss kinds' checks, and a bad batch refused before any framework sees it.
Cross-backend agreement is tests/test_consistency.py's (probes roi_align,
roi_align_to_batch_head, frozen_batchnorm, sigmoid_cross_entropy)."""
import numpy as np
import pytest

import tbdzoo
from conftest import require_backend, require_framework
from tbdzoo.spec import Graph
from tbdzoo.spec.program import Program

require_framework("torch")

from tbdzoo import reference as ref


def test_roi_align_is_torchvisions_roi_align_with_its_sample_points_as_inputs():
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    from tbdzoo.backends.torch import ops as torch_ops
    rng = np.random.RandomState(0)
    features = rng.standard_normal((2, 3, 9, 11)).astype(np.float32)
    boxes = [[[0.0, 0.0, 11.0, 9.0], [2.3, 1.7, 6.1, 8.4]], [[5.5, 3.25, 10.9, 4.0],
                                                             [0.2, 0.4, 1.1, 0.9]]]
    a = {"output_size": (3, 2), "sampling_ratio": 2}
    taps = [[ref.bilinear_taps(b, a["output_size"], 2, 9, 11) for b in image] for image in boxes]
    indices = np.array([[t[0] for t in image] for image in taps])
    weights = np.array([[t[1] for t in image] for image in taps])
    theirs = torchvision.ops.roi_align(
        torch.from_numpy(features), [torch.tensor(b) for b in boxes], output_size=(3, 2),
        spatial_scale=1.0, sampling_ratio=2, aligned=True).numpy().reshape(2, 2, 3, 3, 2)
    np.testing.assert_allclose(ref.roi_align(features, indices, weights, a), theirs, atol=1e-5)
    x = torch.from_numpy(features).requires_grad_()
    ours = torch_ops.roi_align([x, torch.from_numpy(indices), torch.from_numpy(weights)], {}, a,
                               True)
    np.testing.assert_allclose(ours.detach().numpy(), theirs, atol=1e-5)
    # the backward pass scatters each output's gradient back through its taps
    ours.sum().backward()
    expected = np.zeros((2, 9 * 11))
    for n in range(2):
        np.add.at(expected[n], indices[n].ravel(), weights[n].ravel() / 4.0 * 3)  # C rows add
    np.testing.assert_allclose(x.grad.numpy().sum(axis=1).reshape(2, -1), expected, atol=1e-5)


def _roi_align_case():
    """Two images' features, their RoIs' taps (roi_align_points, aligned; RoIs partly off the
    map and tiny ones included), an upstream gradient, and torchvision's RoIAlign output and
    feature gradient for them."""
    import torch
    import torchvision

    from tbdzoo.models.faster_rcnn.detection.roi_align import roi_align_points
    rng = np.random.RandomState(3)
    features = rng.standard_normal((2, 3, 9, 11)).astype(np.float32)
    boxes = [[[0.0, 0.0, 11.0, 9.0], [2.3, 1.7, 6.1, 8.4], [-3.0, -2.0, 4.0, 30.0]],
             [[5.5, 3.25, 10.9, 4.0], [0.2, 0.4, 1.1, 0.9], [8.0, 6.0, 8.5, 6.5]]]
    a = {"output_size": (3, 2), "sampling_ratio": 2}
    taps = [roi_align_points(image, (9, 11), 1.0, a["output_size"], 2, True) for image in boxes]
    indices = np.array([t[0] for t in taps])
    weights = np.array([t[1] for t in taps])
    upstream = rng.standard_normal((2, 3, 3, 3, 2)).astype(np.float32)
    x = torch.from_numpy(features).requires_grad_()
    out = torchvision.ops.roi_align(x, [torch.tensor(b) for b in boxes], output_size=(3, 2),
                                    spatial_scale=1.0, sampling_ratio=2, aligned=True)
    (out * torch.from_numpy(upstream.reshape(6, 3, 3, 2))).sum().backward()
    return (features, indices, weights, upstream, a, out.detach().numpy().reshape(upstream.shape),
            x.grad.numpy())


@pytest.mark.parametrize("form", ["sparse", "gather", "compiled"])
def test_torch_roi_align_forms_match_torchvision_forward_and_backward(form):
    """The sparse product (eager), the gather form, and what torch.compile traces (the gather
    form: Dynamo cannot trace sparse tensors)."""
    import torch

    from tbdzoo.backends.torch import ops as torch_ops
    features, indices, weights, upstream, a, expected, expected_grad = _roi_align_case()
    fn = {"sparse": torch_ops.roi_align, "gather": torch_ops.roi_align_gather,
          "compiled": torch.compile(torch_ops.roi_align, backend="aot_eager",
                                    fullgraph=True)}[form]
    x = torch.from_numpy(features).requires_grad_()
    out = fn([x, torch.from_numpy(indices), torch.from_numpy(weights)], {}, a, True)
    (out * torch.from_numpy(upstream)).sum().backward()
    np.testing.assert_allclose(out.detach().numpy(), expected, atol=1e-5)
    np.testing.assert_allclose(x.grad.numpy(), expected_grad, atol=1e-5)


def test_torch_roi_align_gather_form_runs_under_bf16_autocast():
    """bf16 features in, bf16 out, the sum in float32, the backward pass through the gather."""
    import torch

    from tbdzoo.backends.torch import ops as torch_ops
    features, indices, weights, upstream, a, expected, _ = _roi_align_case()
    x = torch.from_numpy(features).bfloat16().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = torch_ops.roi_align_gather([x, torch.from_numpy(indices),
                                          torch.from_numpy(weights)], {}, a, True)
    (out.float() * torch.from_numpy(upstream)).sum().backward()
    assert out.dtype == torch.bfloat16 and x.grad.dtype == torch.bfloat16
    np.testing.assert_allclose(out.float().detach().numpy(), expected, atol=0.05)


@pytest.mark.parametrize("mode", ["eager", "function", "xla"])
def test_tensorflow_roi_align_matches_torchvision_forward_and_backward(mode):
    """The sparse product (eager, tf.function) and the gather form XLA compiles (jit_compile)."""
    features, indices, weights, upstream, a, expected, expected_grad = _roi_align_case()
    tf = pytest.importorskip("tensorflow")  # after torchvision: the other order can crash
    from tbdzoo.backends.tensorflow import ops as tf_ops

    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = tf_ops.roi_align(tf.transpose(x, [0, 2, 3, 1]), tf.constant(indices),
                                   tf.constant(weights), a)
            loss = tf.reduce_sum(out * upstream)
        return out, tape.gradient(loss, x)

    run = step if mode == "eager" else tf.function(step, jit_compile=mode == "xla")
    out, grad = run(tf.constant(features))
    np.testing.assert_allclose(out.numpy(), expected, atol=1e-5)
    np.testing.assert_allclose(grad.numpy(), expected_grad, atol=1e-5)


@pytest.mark.parametrize("form", ["roi_align", "roi_align_sparse"])
@pytest.mark.parametrize("hybridize", [False, True])
def test_mxnet_roi_align_matches_torchvision_forward_and_backward(form, hybridize):
    """The gather form (the backend's op) and the sparse custom operator, imperative and in a
    hybridized block."""
    require_framework("mxnet")
    from tbdzoo.backends.mxnet import framework as _  # noqa: F401  (NumPy shim before mxnet)
    # isort: split
    import mxnet as mx

    from tbdzoo.backends.mxnet import ops as mx_ops
    features, indices, weights, upstream, a, expected, expected_grad = _roi_align_case()
    ctx = mx_ops.GraphContext({}, False)
    ctx.in_shapes = [features.shape[1:], indices.shape[1:], weights.shape[1:]]

    class Block(mx.gluon.HybridBlock):
        def hybrid_forward(self, F, x, idx, w):
            return getattr(mx_ops, form)(F, [x, idx, w], {}, a, ctx)

    block = Block()
    if hybridize:
        block.hybridize(static_alloc=True, static_shape=True)
    x = mx.nd.array(features)
    x.attach_grad()
    with mx.autograd.record():
        out = block(x, mx.nd.array(indices), mx.nd.array(weights))
        loss = (out * mx.nd.array(upstream)).sum()
    loss.backward()
    np.testing.assert_allclose(out.asnumpy(), expected, atol=1e-5)
    np.testing.assert_allclose(x.grad.asnumpy(), expected_grad, atol=1e-5)


def test_mxnet_contrib_roialign_samples_as_the_reference_does():
    """MXNet's own RoIAlign (aligned, sample_ratio 2) pools exactly the reference's points, RoIs
    off the map included; it takes boxes, not the spec op's sample points (docs/detection.md)."""
    require_framework("mxnet")
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    from tbdzoo.backends.mxnet import framework as _  # noqa: F401  (NumPy shim before mxnet)
    # isort: split
    import mxnet as mx
    rng = np.random.RandomState(4)
    features = rng.standard_normal((1, 3, 9, 11)).astype(np.float32)
    boxes = 16 * np.array([[0, 0, 11, 9], [2.3, 1.7, 6.1, 8.4], [-3, -2, 4, 30],
                           [8, 6, 8.5, 6.5]], np.float32)
    for aligned in (True, False):
        expected = torchvision.ops.roi_align(torch.from_numpy(features), [torch.from_numpy(boxes)],
                                             (3, 2), 1 / 16.0, 2, aligned=aligned).numpy()
        rois = np.concatenate([np.zeros((4, 1), np.float32), boxes], 1)
        got = mx.nd.contrib.ROIAlign(mx.nd.array(features), mx.nd.array(rois), pooled_size=(3, 2),
                                     spatial_scale=1 / 16.0, sample_ratio=2,
                                     aligned=aligned).asnumpy()
        np.testing.assert_allclose(got, expected, atol=1e-6)


def _head_graph():
    g = Graph("head")
    x = g.input("x", (4, 6, 5))
    idx = g.input("idx", (3, 6 * 4, 4), dtype="int32")
    w = g.input("w", (3, 6 * 4, 4))
    roi = g.add("roi", "roi_align", [x, idx, w], output_size=(2, 3), sampling_ratio=2)
    rois = g.add("rois", "to_batch", roi)
    conv = g.add("conv", "conv2d", rois, filters=5, kernel=3, padding=1)
    return g, x, rois, conv


def test_to_batch_counts_rows_per_example_in_flops_and_refuses_mixing_batches():
    g, x, rois, conv = _head_graph()
    assert g.shape_of("roi") == (3, 4, 2, 3) and g.shape_of(rois) == (4, 2, 3)
    assert g.rows_per_example(x) == 1 and g.rows_per_example(rois) == 3
    assert g.rows_per_example(conv) == 3
    per_roi = 2 * 5 * 2 * 3 * 4 * 9
    assert g.flops()["conv"] == 3 * per_roi  # FLOPs per example of the input batch
    assert g.flops()["roi"] == 2 * 4 * 4 * (3 * 4 * 2 * 3)
    pooled = g.add("pool", "global_avgpool", x)
    with pytest.raises(ValueError, match="batches of different sizes"):
        g.add("mixed", "concat", [pooled, g.add("pool2", "global_avgpool", conv)])
    labels = g.add("labels", "to_batch", g.input("y", (3,), dtype="int32", role="target"))
    assert g.dtype_of(labels) == "int32" and g.shape_of(labels) == ()
    assert Graph.from_json(g.dumps()).hash() == g.hash()


@pytest.mark.parametrize("attrs,message", [
    ({"output_size": (2, 2), "sampling_ratio": 2}, r"indices must be \(R, 16, 4\)"),
    ({"output_size": (2, 3), "sampling_ratio": 0}, "sampling_ratio must be an integer >= 1"),
])
def test_roi_align_refuses_shapes_that_do_not_fit_its_attributes(attrs, message):
    g = Graph("bad")
    x, idx = g.input("x", (4, 6, 5)), g.input("idx", (3, 24, 4), dtype="int32")
    w = g.input("w", (3, 24, 4))
    with pytest.raises(ValueError, match=message):
        g.add("roi", "roi_align", [x, idx, w], **attrs)
    with pytest.raises(ValueError, match="indices must be int32"):
        g.add("roi", "roi_align", [x, w, w], output_size=(2, 3))


def test_frozen_batchnorm_holds_state_only_and_folds_exactly():
    g = Graph("frozen")
    x = g.input("x", (3, 4, 4))
    g.add("bn", "frozen_batchnorm", x, eps=0.0)
    assert g.trainable_count() == 0
    assert [(n, p.trainable) for n, p in g.params().items()] == [
        ("bn.gamma", False), ("bn.beta", False), ("bn.running_mean", False),
        ("bn.running_var", False)]
    assert g.flops()["bn"] == 2 * 3 * 16
    with pytest.raises(ValueError, match="eps must be a number >= 0"):
        g.add("bn2", "frozen_batchnorm", x, eps=-1.0)
    import torch

    from tbdzoo.backends.torch import ops as torch_ops
    rng = np.random.RandomState(1)
    p = {"gamma": rng.standard_normal(3), "beta": rng.standard_normal(3),
         "running_mean": rng.standard_normal(3), "running_var": rng.uniform(0.5, 2, 3)}
    xs = rng.standard_normal((2, 3, 4, 4))
    ours = torch_ops.frozen_batchnorm([torch.from_numpy(xs)], {k: torch.from_numpy(v) for k, v
                                                               in p.items()}, {"eps": 1e-5}, True)
    np.testing.assert_allclose(ours.numpy(), ref.frozen_batchnorm(xs, p, {"eps": 1e-5}),
                               rtol=1e-12)


def _loss_graph():
    g, _x, _rois, conv = _head_graph()
    box = g.add("box", "dense", g.add("pool", "global_avgpool", conv), units=4)
    g.input("t", (3, 4), role="target")
    g.input("tw", (3, 4), role="target")
    return g, box


@pytest.mark.parametrize("inputs,attrs,message", [
    ({"target": "t_folded", "weight": "tw_folded"}, {"sigma": 0.0}, "sigma must be a number > 0"),
    ({"target": "t", "weight": "tw"}, {}, "inputs must have one shape"),
    ({"target": "t_folded", "weight": "x_feat"}, {}, "batches of different sizes"),
])
def test_smooth_l1_refuses_bad_inputs_and_attributes(inputs, attrs, message):
    g, box = _loss_graph()
    g.add("t_folded", "to_batch", "t")
    g.add("tw_folded", "to_batch", "tw")
    g.add("x_feat", "global_avgpool", "x")  # (4,), the box's shape, but one row per image
    p = Program()
    p.loss("box", "smooth_l1", prediction=box, **dict(inputs, **attrs))
    p.objective("o", {"box": 1.0})
    p.group("all", "*", {"kind": "sgd", "lr": 0.1, "momentum": 0.0, "nesterov": False,
                         "weight_decay": 0.0})
    p.phase("train", "o", "all")
    with pytest.raises(ValueError, match=message):
        g.set_program(p)


def test_losses_refuse_inputs_from_batches_of_different_sizes():
    g, box = _loss_graph()
    g.add("x4", "dense", g.add("x_feat", "global_avgpool", "x"), units=4)
    g.add("tw_folded", "to_batch", "tw")
    p = Program()
    p.loss("box", "smooth_l1", prediction=box, target="x4", weight="tw_folded")
    p.objective("o", {"box": 1.0})
    p.group("all", "*", {"kind": "sgd", "lr": 0.1, "momentum": 0.0, "nesterov": False,
                         "weight_decay": 0.0})
    p.phase("train", "o", "all")
    with pytest.raises(ValueError, match="batches of different sizes"):
        g.set_program(p)


def test_the_loss_kinds_reduce_as_the_spec_says():
    d = np.array([[0.05, -0.5], [2.0, 0.0]])
    # sigma 3: quadratic below 1/9, linear above; normalizer 2 over 2 rows
    expected = (0.5 * 9 * 0.05 ** 2 + (0.5 - 0.5 / 9) + 2 * (2.0 - 0.5 / 9)) / (2 * 2)
    assert ref.smooth_l1(d, 0.0, np.array([[1, 1], [2, 0]]), 3.0, 2.0) == pytest.approx(expected)
    z, y = np.array([0.3, -2.0, 4.0]), np.array([1.0, 0.0, 0.0])
    bce = np.log1p(np.exp(-z)) * y + np.log1p(np.exp(z)) * (1 - y)
    assert ref.sigmoid_cross_entropy(z, y, np.array([1, 1, 0])) == pytest.approx(bce[:2].mean())
    assert ref.sigmoid_cross_entropy(z, y, np.zeros(3)) == 0.0  # no sampled anchor: no NaN


@pytest.mark.parametrize("backend", ["torch", "cntk", "jax"])
def test_a_tap_outside_the_feature_map_is_refused_naming_the_example(backend):
    require_backend(backend)
    model = tbdzoo.build("probe/roi_align", backend=backend, config="tiny",
                         isolate=backend != "torch")
    try:
        batch = model.synthetic_batch(seed=0)
        batch["roi_indices"][1, 2, 5, 3] = 6 * 5  # the feature map is 6 x 5
        with pytest.raises(ValueError, match=r"example 1, RoI 2, sample 5, tap 3 is index 30, "
                                             r"outside \[0, 30\) of the 6 x 5 feature map"):
            model.loss_and_gradients(batch)
    finally:
        model.close()


@pytest.mark.parametrize("backend", ["tensorflow", "mxnet", "cntk", "jax"])
def test_sigmoid_cross_entropy_at_a_logit_of_exactly_zero_has_the_gradient_sigmoid_0_minus_y(backend):
    """A zero-initialised objectness layer over ReLU outputs gives logits of exactly 0, where a
    relu/abs form of the loss would give -y instead of 0.5 - y."""
    require_backend(backend)
    reference = tbdzoo.build("probe/sigmoid_cross_entropy", backend="torch", config="tiny",
                             device="cpu")
    other = tbdzoo.build("probe/sigmoid_cross_entropy", backend=backend, config="tiny",
                         isolate=True)
    try:
        weights = {k: (np.zeros_like(v) if k.startswith("objectness") else v)
                   for k, v in reference.get_weights().items()}
        reference.set_weights(weights)
        other.set_weights(weights)
        batch = reference.synthetic_batch(seed=0)
        labels, sampled = batch["labels"], batch["labels_weight"]
        expected = ((0.5 - labels) * sampled).sum(axis=(0, 2, 3)) / max(sampled.sum(), 1.0)
        for model in (reference, other):
            grads = model.loss_and_gradients(batch)[1]
            np.testing.assert_allclose(grads["objectness.bias"], expected, rtol=1e-5, atol=1e-7)
    finally:
        other.close()


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("aligned", [False, True])
def test_torchs_gather_points_are_the_numpy_references_bit_for_bit(aligned, device):
    """The kernel the PyTorch backend lends the targets step (tbdzoo/models/faster_rcnn/detection/kernels.py).
    On a GPU it once differed in the last bit of most weights: CUDA divides by a Python number
    as a multiplication by its reciprocal (torch_roi_align.divide)."""
    torch = pytest.importorskip("torch")  # the cuda cases are marked gpu: skipped without one
    from tbdzoo.backends.torch import roi_align as torch_roi_align
    from tbdzoo.models.faster_rcnn.detection import kernels
    from tbdzoo.models.faster_rcnn.detection.roi_align import roi_align_points
    rng = np.random.RandomState(1)
    xy = rng.uniform(-40, 300, (96, 2))
    rois = np.concatenate([xy, xy + rng.uniform(0, 200, (96, 2))], 1)  # some past the map
    rois[0] = [0, 0, 0, 0]
    rois[1] = [16, 16, 16.5, 17]  # under one feature cell
    args = (rois, (13, 17), 1.0 / 16, (7, 7), 2, aligned)
    expected = roi_align_points(*args)
    with kernels.lending(roi_align_points=torch_roi_align.host_kernel(torch.device(device))):
        got = roi_align_points(*args)
    assert got[0].dtype == np.int32 and got[1].dtype == np.float32
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])


def test_a_kernel_is_lent_only_for_its_block_and_only_by_a_known_name():
    from tbdzoo.models.faster_rcnn.detection import kernels
    with kernels.lending(nms=len):
        assert kernels.lent("nms") is len
        with kernels.lending(nms=None):
            assert kernels.lent("nms") is None
        assert kernels.lent("nms") is len
    assert kernels.lent("nms") is None
    with pytest.raises(ValueError, match="roi_align_points"), kernels.lending(roi_align=len):
        pass
