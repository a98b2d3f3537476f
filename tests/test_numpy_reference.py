"""The NumPy reference (tbdzoo/reference/) by hand, and the PyTorch backend against it.

tbdzoo/reference/ implements every spec op in float64 from the spec's definitions; `tbd
consistency` holds every backend to it (tests/test_consistency.py). Here the PyTorch backend's
float32 output must match it at rtol 1e-5, atol 1e-6 on every probe with random weights
(non-zero biases, shifted statistics), so that a term a backend forgets cannot hide behind an
initial zero; and the reference's ops, losses and optimizers are checked against values worked
out by hand.
"""
import numpy as np
import pytest

import tbdzoo
from conftest import require_framework
from tbdzoo.models.probes import PROBES
from tbdzoo.spec import losses as spec_losses
from tbdzoo.spec import ops as spec_ops

require_framework("torch")

from tbdzoo import reference as ref

RTOL, ATOL = 1e-5, 1e-6


def random_weights(model, seed=3):
    """Random values of the scale a trained model holds: weights N(0, 1 / fan_in), biases and
    BatchNorm statistics N(0, 0.25) (variances positive), gammas around 1. Unit-variance weights
    would make attention logits of ~50 whose float32 sums cancel to ~1, leaving PyTorch 1e-5
    away from any exact answer for reasons that are not its fault."""
    rng = np.random.RandomState(seed)
    out = {}
    for name, value in model.get_weights().items():
        noise = rng.standard_normal(value.shape)
        if value.ndim > 1:
            noise /= np.sqrt(np.prod(value.shape[1:]))
        elif "running_var" in name or "gamma" in name:
            noise = 1.0 + 0.5 * np.abs(noise) if "running_var" in name else 1.0 + 0.5 * noise
        else:
            noise *= 0.5
        out[name] = noise.astype(np.float32)
    return out


def _torch_model(name, seed=0, **overrides):
    return tbdzoo.build(name, backend="torch", config="tiny", device="cpu", seed=seed,
                        **overrides)


@pytest.mark.parametrize("probe", list(PROBES))
def test_torch_matches_numpy_on_every_probe(probe):
    model = _torch_model("probe/" + probe)
    weights = random_weights(model)
    model.set_weights(weights)
    batch = model.synthetic_batch(seed=5)
    graph = model.spec

    outputs = ref.forward(graph, weights, batch, training=False)
    np.testing.assert_allclose(model.predict(batch), outputs[graph.output], rtol=RTOL, atol=ATOL)

    # Training mode: batch statistics in BatchNorm; the probes' dropout rate is 0.
    train_outputs = ref.forward(graph, weights, batch, training=True)
    loss, _ = model.loss_and_gradients(batch)
    assert loss == pytest.approx(ref.loss(graph, train_outputs, batch), rel=RTOL, abs=ATOL)


def test_every_spec_op_has_a_reference_and_a_probe():
    probed = set()
    for probe in PROBES:
        md = tbdzoo.get_model("probe/" + probe)
        probed.update(n.op for n in md.build_graph(md.hparams("tiny")).nodes.values())
    assert probed == set(spec_ops.names()) == set(ref.OPS)


def test_every_loss_kind_and_every_models_op_has_a_reference():
    assert set(ref.LOSSES) == set(spec_losses.names())
    for name in tbdzoo.list_models():
        md = tbdzoo.get_model(name)
        graph = md.build_graph(md.hparams("tiny"))
        assert {n.op for n in graph.nodes.values()} <= set(ref.OPS), name
        if graph.program is not None:
            assert {t["kind"] for t in graph.program.losses.values()} <= set(ref.LOSSES), name


def test_the_reference_model_starts_where_a_backend_does():
    """The weights and synthetic batch `tbd consistency record` writes are those every backend
    builds from the same seed; and the reference's loss there is the backend's."""
    from tbdzoo.reference.model import Model
    ref_model = Model("probe/conv2d", seed=4)
    model = _torch_model("probe/conv2d", seed=4)
    for name, value in model.get_weights().items():
        np.testing.assert_array_equal(ref_model.weights[name], value)
    batch = model.synthetic_batch(seed=6)
    for name, value in ref_model.synthetic_batch(seed=6).items():
        np.testing.assert_array_equal(batch[name], value)
    assert ref_model.losses(batch) == pytest.approx(model.loss_and_gradients(batch)[0],
                                                    rel=RTOL, abs=ATOL)


def test_torch_transformer_matches_numpy_with_padding_ignored():
    """The whole tiny Transformer: causal and padding masks, tied embeddings, and a loss whose
    padded target positions are ignored while the rest are label-smoothed."""
    model = _torch_model("transformer", dropout=0.0)
    weights = random_weights(model)
    model.set_weights(weights)
    batch = model.synthetic_batch(seed=2)
    graph = model.spec
    assert graph.loss["ignore_index"] is not None and graph.loss["label_smoothing"] > 0
    assert np.any(batch["labels"] == graph.loss["ignore_index"])  # the test must see padding

    outputs = ref.forward(graph, weights, batch, training=False)
    np.testing.assert_allclose(model.predict(batch), outputs[graph.output], rtol=RTOL, atol=ATOL)
    loss, _ = model.loss_and_gradients(batch)
    assert loss == pytest.approx(ref.loss(graph, outputs, batch), rel=RTOL, abs=ATOL)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("ignore_index", [None, 0, 3])
def test_cross_entropy_matches_torch(label_smoothing, ignore_index):
    import torch

    from tbdzoo.backends.torch import ops as torch_ops
    rng = np.random.RandomState(7)
    logits = rng.standard_normal((4, 5, 6)).astype(np.float32) * 3
    labels = rng.randint(0, 6, size=(4, 5)).astype(np.int64)
    labels[0, :2] = 3  # the ignored label occurs, and not everywhere
    expected = ref.softmax_cross_entropy(logits, labels, label_smoothing, ignore_index)
    got = torch_ops.softmax_cross_entropy(
        torch.from_numpy(logits), torch.from_numpy(labels),
        {"label_smoothing": label_smoothing, "ignore_index": ignore_index}).item()
    assert got == pytest.approx(expected, rel=RTOL, abs=ATOL)


def test_reference_cross_entropy_by_hand():
    """Two classes, logits (0, log 3): p = (1/4, 3/4). Label 1 with eps = 0.2 gives
    q = (0.1, 0.9), loss = -(0.1 log 1/4 + 0.9 log 3/4); the row labelled 7 is ignored."""
    logits = np.array([[0.0, np.log(3.0)], [5.0, -5.0]])
    expected = -(0.1 * np.log(0.25) + 0.9 * np.log(0.75))
    got = ref.softmax_cross_entropy(logits, np.array([1, 7]), 0.2, ignore_index=7)
    assert got == pytest.approx(expected, rel=1e-12)


def test_reference_conv_and_pools_by_hand():
    """One 3x3 image, worked out on paper: a dilated kernel reads the corners, padding counts
    in the average only when asked, and padded cells never win the max."""
    x = np.arange(9.0).reshape(1, 1, 3, 3)  # [[0 1 2] [3 4 5] [6 7 8]]
    corners = {"weight": np.ones((1, 1, 2, 2))}
    a = {"kernel": (2, 2), "stride": (1, 1), "padding": ((0, 0), (0, 0)), "dilation": (2, 2),
         "groups": 1}
    assert ref.conv2d(x, corners, a).ravel().tolist() == [0 + 2 + 6 + 8]
    pool = {"kernel": (2, 2), "stride": (2, 2), "padding": ((1, 0), (1, 0))}
    # windows: {pad, pad, pad, 0}, {pad, pad, 1, 2}, {pad, 3, pad, 6}, {4, 5, 7, 8}
    assert ref.avgpool2d(x, dict(pool, count_include_pad=False)).ravel().tolist() == [0, 1.5, 4.5, 6]
    assert ref.avgpool2d(x, dict(pool, count_include_pad=True)).ravel().tolist() == [0, 0.75, 2.25, 6]
    assert ref.maxpool2d(-x, pool).ravel().tolist() == [0, -1, -3, -4]
    grouped = {"weight": np.array([1.0, 10.0]).reshape(2, 1, 1, 1)}
    two = np.concatenate([x, x + 100], axis=1)
    out = ref.conv2d(two, grouped, dict(a, kernel=(1, 1), dilation=(1, 1), groups=2))
    assert out[0, 0].tolist() == x[0, 0].tolist() and out[0, 1].tolist() == (10 * (x[0, 0] + 100)).tolist()


def test_reference_optimizers_by_hand():
    """One step and a second from w = 1, g = 2 (then g = 1), lr 0.1, worked out on paper."""
    from tbdzoo.reference.optimizers import Optimizer
    sgd = Optimizer({"optimizer": "sgd", "momentum": 0.9, "nesterov": False, "weight_decay": 0.5})
    w = sgd.step(1.0, 2.0, 0.1)  # g = 2 + 0.5 = 2.5, b = 2.5, w = 1 - 0.25
    assert w == pytest.approx(0.75, rel=1e-15)
    assert sgd.step(w, 1.0, 0.1) == pytest.approx(0.75 - 0.1 * (0.9 * 2.5 + 1.375), rel=1e-15)
    nesterov = Optimizer({"optimizer": "sgd", "momentum": 0.9, "nesterov": True,
                          "weight_decay": 0.0})
    assert nesterov.step(1.0, 2.0, 0.1) == pytest.approx(1 - 0.1 * (2 + 0.9 * 2), rel=1e-15)
    adam = Optimizer({"optimizer": "adam", "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
                      "weight_decay": 0.0})
    # first step: m_hat = g, v_hat = g^2, so w moves by lr * g / (|g| + eps)
    assert adam.step(1.0, 2.0, 0.1) == pytest.approx(1 - 0.1 * 2 / (2 + 1e-8), rel=1e-15)
    m, v = 0.9 * 0.2 + 0.1 * 1.0, 0.999 * 0.004 + 0.001 * 1.0
    m_hat, v_hat = m / (1 - 0.81), v / (1 - 0.999 ** 2)
    assert adam.step(0.9, 1.0, 0.1) == pytest.approx(0.9 - 0.1 * m_hat / (np.sqrt(v_hat) + 1e-8),
                                                      rel=1e-14)
    rms = Optimizer({"kind": "rmsprop", "alpha": 0.9, "eps": 1.0, "momentum": 0.5,
                     "centered": True, "weight_decay": 0.0})
    # v = 0.1 * 4 = 0.4, a = 0.1 * 2 = 0.2, d = 0.4 - 0.04, b = 0.1 * 2 / sqrt(0.36 + 1)
    b = 0.2 / np.sqrt(1.36)
    assert rms.step(1.0, 2.0, 0.1) == pytest.approx(1 - b, rel=1e-15)


def test_reference_clipping_and_weight_hook_by_hand():
    from tbdzoo.reference.optimizers import clip_gradients, clip_weights
    a, b = clip_gradients([np.array([3.0]), np.array([4.0])], {"kind": "global_norm", "value": 1.0})
    assert (a[0], b[0]) == (pytest.approx(3 / (5 + 1e-6)), pytest.approx(4 / (5 + 1e-6)))
    same = clip_gradients([np.array([0.3, -0.4])], {"kind": "global_norm", "value": 1.0})[0]
    assert same.tolist() == [0.3, -0.4]  # below the norm: untouched
    assert clip_gradients([np.array([3.0, -0.5])], {"kind": "value", "value": 1.0})[0].tolist() \
        == [1.0, -0.5]
    assert clip_weights([np.array([0.02, -0.3])], 0.01)[0].tolist() == [0.01, -0.01]
