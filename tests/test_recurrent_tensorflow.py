"""The recurrent ops and the CTC loss on the TensorFlow backend: forward values against the NumPy
reference (tbdzoo/reference/), gradients against the PyTorch backend, on the probes'
small ragged batches (one example at full length, one short), and the contract's edge cases:
exact zeros at padding, gradients at the clipping points, running statistics over valid steps
only, weights that round-trip per canonical parameter, and batches refused with the reason."""
from collections import OrderedDict

import numpy as np
import pytest

from conftest import random_weights, require_framework

require_framework("tensorflow")

import tbdzoo.backends.tensorflow.framework  # noqa: F401  (sets the TF log level before the import)

# isort: split
import tensorflow as tf

from tbdzoo.backends.registry import build_native
from tbdzoo.backends.tensorflow import adapters as tf_adapters
from tbdzoo.backends.tensorflow import ops

# isort: split

from tbdzoo import reference as ref

# probe -> the node that holds the op under test
PROBES = OrderedDict([
    ("lstm", "rnn"), ("lstm_bidirectional_sum", "rnn"), ("gru", "rnn"),
    ("gru_bidirectional", "rnn"), ("additive_attention", "attn"), ("sequence_batchnorm", "bn"),
    ("clipped_relu", "clip"), ("transpose", "tr"), ("ctc", "rnn"),
])


def _build(probe, backend="tensorflow"):
    return build_native("probe/" + probe, backend, config="tiny", seed=0)


def _with_weights(probe, backend="tensorflow"):
    """The probe with random weights (scaled so the recurrent gates do not saturate) and its
    synthetic batch."""
    model = _build(probe, backend)
    weights = OrderedDict((n, 0.5 * v if "running_var" not in n else v)
                          for n, v in random_weights(model).items())
    model.set_weights(weights)
    return model, weights, model.synthetic_batch(seed=1)


def _node_values(model, batch, training):
    """Every node's output, canonical, from the native model (running statistics untouched)."""
    inputs = model.prepare_batch(batch).native
    if model.program is not None:  # one prepared batch per phase: the first phase's
        inputs = inputs[0][1]
    values = model.net.forward(inputs, training=training, update_stats=False)
    return {name: tf_adapters.to_layout(value, tf_adapters.CANONICAL).numpy()
            for name, value in values.items() if name in model.spec.nodes}


# training mode changes only what sequence_batchnorm normalises by (the ctc probe has one too)
@pytest.mark.parametrize("probe, training", [(p, False) for p in PROBES] + [
    ("sequence_batchnorm", True), ("ctc", True)])
def test_forward_matches_the_numpy_reference(probe, training):
    model, weights, batch = _with_weights(probe)
    got = _node_values(model, batch, training)
    want = ref.forward(model.spec, weights, batch, training=training)
    for name in (PROBES[probe], model.spec.output):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)


def test_the_ctc_loss_matches_the_numpy_reference():
    model, weights, batch = _with_weights("ctc")
    loss, _ = model.loss_and_gradients(batch)
    outputs = ref.forward(model.spec, weights, batch, training=True)
    np.testing.assert_allclose(loss, ref.loss(model.spec, outputs, batch), rtol=1e-5)


@pytest.mark.parametrize("probe", list(PROBES))
def test_loss_and_gradients_match_the_torch_backend(probe):
    require_framework("torch")
    model, weights, batch = _with_weights(probe)
    reference = _build(probe, "torch")
    reference.set_weights(weights)
    loss, grads = model.loss_and_gradients(batch)
    want_loss, want_grads = reference.loss_and_gradients(batch)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    assert list(grads) == list(want_grads)
    for name, g in grads.items():
        scale = max(float(np.abs(want_grads[name]).max()), 1e-3)
        np.testing.assert_allclose(g, want_grads[name], rtol=1e-4, atol=1e-5 * scale,
                                   err_msg=name)


@pytest.mark.parametrize("probe", ["lstm", "lstm_bidirectional_sum", "gru_bidirectional",
                                   "sequence_batchnorm"])
def test_outputs_at_padded_positions_are_exactly_zero(probe):
    model, _, batch = _with_weights(probe)
    lengths = batch["x_lengths"]
    assert lengths.min() < model.spec.shape_of("x")[0]  # the batch really is ragged
    for training in (False, True):
        y = _node_values(model, batch, training)[PROBES[probe]]
        for n, length in enumerate(lengths):
            assert np.all(y[n, length:] == 0.0)
            assert np.all(np.any(y[n, :length] != 0.0, axis=-1))


def test_padding_content_does_not_reach_valid_outputs_or_gradients():
    model, _, batch = _with_weights("gru_bidirectional")
    noisy = dict(batch)
    noisy["x"] = batch["x"].copy()
    for n, length in enumerate(batch["x_lengths"]):
        noisy["x"][n, length:] = 1e3
    np.testing.assert_array_equal(model.predict(noisy), model.predict(batch))
    (loss, grads), (noisy_loss, noisy_grads) = [model.loss_and_gradients(b)
                                                for b in (batch, noisy)]
    assert loss == noisy_loss
    for name in grads:
        np.testing.assert_array_equal(noisy_grads[name], grads[name])


def test_weights_round_trip_per_canonical_parameter():
    model, weights, _ = _with_weights("lstm_bidirectional_sum")
    back = model.get_weights()
    assert list(back) == list(model.spec.params())
    for name, value in weights.items():
        np.testing.assert_array_equal(back[name], value)
    # one Keras variable per canonical parameter, in the canonical shape, named by its suffix
    assert sorted(v.path for v in model.native.weights) == sorted(
        "rnn/" + n[len("rnn."):] if n.startswith("rnn.") else model.net.keras_path(n)
        for n in model.spec.params())
    assert model.native.get_layer("rnn").spec_weights["l1.bw.w_i"].shape == (3, 6)


def test_clipped_relu_values_and_gradient_at_the_clipping_points():
    x = tf.constant([-1.0, 0.0, 0.25, 0.5, 0.75])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = ops.clipped_relu(x, {"ceiling": 0.5})
    np.testing.assert_array_equal(y.numpy(), [0.0, 0.0, 0.25, 0.5, 0.5])
    np.testing.assert_array_equal(tape.gradient(y, x).numpy(), [0.0, 0.0, 1.0, 0.0, 0.0])


def test_lengths_after_conv_follows_the_spec_formula():
    from tbdzoo.spec import ops as spec_ops
    lengths = np.arange(1, 12, dtype=np.int32)
    for attrs in [{"kernel": 3, "stride": 2, "padding": (1, 1), "dilation": 1},
                  {"kernel": 11, "stride": 3, "padding": (0, 0), "dilation": 1},
                  {"kernel": 3, "stride": 1, "padding": (0, 2), "dilation": 2}]:
        got = ops.lengths_after_conv(tf.constant(lengths), attrs).numpy()
        np.testing.assert_array_equal(got, spec_ops.length_after_conv(lengths, attrs))
        assert got.min() >= 1


def test_sequence_batchnorm_running_statistics_use_valid_positions_only():
    model, weights, batch = _with_weights("sequence_batchnorm")
    model.loss_and_gradients(batch)  # a gradient computation leaves the statistics alone
    np.testing.assert_array_equal(model.get_weights()["bn.running_mean"],
                                  weights["bn.running_mean"])
    model.train_step(batch)
    x, lengths = batch["x"].astype(np.float64), batch["x_lengths"]
    valid = np.concatenate([x[n, :length] for n, length in enumerate(lengths)])
    m = model.spec.nodes["bn"].attrs["momentum"]
    got = model.get_weights()
    np.testing.assert_allclose(got["bn.running_mean"],
                               (1 - m) * weights["bn.running_mean"] + m * valid.mean(axis=0),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["bn.running_var"],
                               (1 - m) * weights["bn.running_var"] + m * valid.var(axis=0, ddof=1),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("change, message", [
    (lambda b: b["x_lengths"].__setitem__(1, 0), r"x_lengths'\]\[1\] = 0 is outside \[1, 9\]"),
    (lambda b: (b["x_lengths"].__setitem__(1, 1), b["labels"].__setitem__(1, [1, 2, 0]),
                b["labels_lengths"].__setitem__(1, 2)),
     r"example 1: 2 labels need 2 frames .* but input_length is 1"),
    (lambda b: b["labels"].__setitem__((0, 0), 5), r"example 0: label id 5 is outside \[1, 5\)"),
    (lambda b: b["labels_lengths"].__setitem__(0, 4), r"example 0: label_length 4 is outside \[0, 3\]"),
])
def test_a_batch_ctc_cannot_score_is_refused_naming_the_example(change, message):
    model = _build("ctc")
    batch = {k: np.array(v) for k, v in model.synthetic_batch(seed=1).items()}
    change(batch)
    with pytest.raises(ValueError, match=message):
        model.loss_and_gradients(batch)


def test_an_xla_compiled_step_gives_the_same_ctc_loss_and_gradients():
    """XLA has no CTCLoss kernel: the compiled step takes tf.nn.ctc_loss's dense form."""
    model, weights, batch = _with_weights("ctc")
    compiled = build_native("probe/ctc", "tensorflow", config="tiny", execution="compiled")
    compiled.set_weights(weights)
    (loss, grads), (xla_loss, xla_grads) = [m.loss_and_gradients(batch)
                                            for m in (model, compiled)]
    np.testing.assert_allclose(xla_loss, loss, rtol=1e-5)
    for name, g in grads.items():
        np.testing.assert_allclose(xla_grads[name], g, rtol=1e-4, atol=1e-6, err_msg=name)
