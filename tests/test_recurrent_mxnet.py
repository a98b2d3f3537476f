"""The recurrent ops and the CTC loss on the MXNet backend, on small ragged batches.

Each op's output against the NumPy reference (tbdzoo/reference/), its loss and every
canonical parameter's gradient against the PyTorch backend, and what the reference alone cannot
show: padding exactly 0, the clipped ReLU's gradient at its two ends, the running statistics of
sequence_batchnorm over valid steps, batches MXNet would score silently wrong, and weights
through the canonical .npz. The probes' consistency cases (tests/test_consistency.py) cover the
same ops through the suite's protocol.
"""
import warnings

import numpy as np
import pytest

from conftest import require_framework

require_framework("mxnet")
require_framework("torch")

import tbdzoo.backends.mxnet.framework  # noqa: F401  (sets numpy.bool before mxnet is imported)

# isort: split
from mxnet import autograd, nd

from tbdzoo import reference as ref
from tbdzoo.backends.mxnet import model as mx_backend
from tbdzoo.backends.mxnet import ops
from tbdzoo.backends.registry import build_native
from tbdzoo.backends.torch import model as torch_backend
from tbdzoo.models.registry import ModelDef
from tbdzoo.spec import Graph
from tbdzoo.spec import ops as spec_ops
from tbdzoo.spec.program import single_objective

T, D, CLASSES = 6, 3, 5
LENGTHS = np.array([6, 2, 4], np.int32)  # one at full length, one short, ragged
HPARAMS = {"optimizer": "sgd", "lr": 0.1, "momentum": 0.0, "nesterov": False,
           "weight_decay": 0.0, "lr_schedule": "constant", "batch_size": len(LENGTHS)}


def _definition(add_op):
    """x (T, D) with ragged lengths -> the op -> flatten -> dense -> CE."""
    def build(hp):
        g = Graph("recurrent_op")
        g.input("x", (T, D))
        g.input("x_lengths", (), "int32")
        y = add_op(g)
        logits = g.add("head.fc", "dense", g.add("head.flatten", "flatten", y), units=CLASSES)
        g.input("labels", (), "int32", "target")
        g.set_output(logits)
        g.set_loss("softmax_cross_entropy", logits=logits, labels="labels", label_smoothing=0.0,
                   ignore_index=None)
        return g

    def batch(hp, batch_size, seed):
        rng = np.random.RandomState(seed)
        out = {"x": rng.standard_normal((len(LENGTHS), T, D)).astype(np.float32),
               "x_lengths": LENGTHS.copy(),
               "labels": rng.randint(0, CLASSES, len(LENGTHS)).astype(np.int32)}
        if "query" in build(hp).inputs:
            out["query"] = rng.standard_normal((len(LENGTHS), 4, 5)).astype(np.float32)
        return out
    return ModelDef("recurrent_op", "test", {"tiny": HPARAMS}, build, batch, "examples/s",
                    lambda hp, b: len(b["labels"]))


def _attention(g):
    g.input("query", (4, 5))
    return g.add("attn", "additive_attention", ["query", "x", "x_lengths"], units=7)


CASES = {
    "lstm_two_layers": lambda g: g.add("rnn", "lstm", ["x", "x_lengths"], units=4, num_layers=2),
    "lstm_bidirectional_sum": lambda g: g.add(
        "rnn", "lstm", ["x", "x_lengths"], units=3, num_layers=2, bidirectional=True,
        merge="sum", init=("uniform", 0.3), forget_bias=1.0),
    "gru": lambda g: g.add("rnn", "gru", ["x", "x_lengths"], units=4),
    "gru_bidirectional_two_layers": lambda g: g.add(
        "rnn", "gru", ["x", "x_lengths"], units=3, num_layers=2, bidirectional=True),
    "additive_attention": _attention,
    "sequence_batchnorm": lambda g: g.add("bn", "sequence_batchnorm", ["x", "x_lengths"]),
    "clipped_relu": lambda g: g.add("clip", "clipped_relu", ["x"], ceiling=0.5),
    "transpose": lambda g: g.add("tr", "transpose", ["x"], perm=(1, 0)),
}


def _models(case):
    definition = _definition(CASES[case])
    hp = definition.hparams("tiny")
    with warnings.catch_warnings():  # an op that reads no lengths leaves that input unread,
        warnings.simplefilter("ignore")  # which Gluon warns of when it builds the graph
        mx_model = mx_backend.Model(definition, hp, seed=0)
        mx_model.predict(mx_model.synthetic_batch())
    return mx_model, torch_backend.Model(definition, hp, seed=0, device="cpu")


def _op_output(model, batch):
    """The op's own output in inference mode, read before the head."""
    op = model.spec.nodes["head.flatten"].inputs[0]
    return model.values(batch, [op])[op]


@pytest.mark.parametrize("case", list(CASES))
def test_op_matches_the_reference_forward_and_pytorch_gradients(case):
    model, reference = _models(case)
    weights, batch = model.get_weights(), model.synthetic_batch()
    expected = ref.forward(model.spec, weights, batch)
    np.testing.assert_allclose(model.predict(batch), expected[model.spec.output],
                               rtol=1e-5, atol=1e-6)
    op = model.spec.nodes["head.flatten"].inputs[0]
    out = _op_output(model, batch)
    np.testing.assert_allclose(out, expected[op], rtol=1e-5, atol=1e-6)
    if model.spec.nodes[op].inputs == ["x", "x_lengths"]:  # a sequence out per sequence in
        for n, length in enumerate(LENGTHS):
            assert np.all(out[n, length:] == 0.0)  # padding is exactly 0, not nearly
    reference.set_weights(weights)
    loss, grads = model.loss_and_gradients(batch)
    ref_loss, ref_grads = reference.loss_and_gradients(batch)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert list(grads) == list(ref_grads) == model.trainable_names()
    scale = max(np.abs(g).max() for g in ref_grads.values())
    for name, g in grads.items():
        np.testing.assert_allclose(g, ref_grads[name], rtol=1e-4, atol=1e-5 * scale,
                                   err_msg=name)


def test_the_backward_direction_reads_each_example_within_its_length():
    """An example's bidirectional output must not change when garbage fills its padding."""
    model, _ = _models("gru_bidirectional_two_layers")
    batch = model.synthetic_batch()
    noisy = dict(batch, x=batch["x"].copy())
    for n, length in enumerate(LENGTHS):
        noisy["x"][n, length:] = 100.0
    np.testing.assert_array_equal(_op_output(model, noisy), _op_output(model, batch))
    np.testing.assert_array_equal(model.predict(noisy), model.predict(batch))


def test_clipped_relu_gradient_is_zero_at_both_ends():
    x = nd.array([-1.0, 0.0, 0.25, 0.5, 0.75])
    x.attach_grad()
    with autograd.record():
        y = ops.clipped_relu(nd, [x], {}, {"ceiling": 0.5}, None)
    y.backward()
    np.testing.assert_array_equal(y.asnumpy(), [0.0, 0.0, 0.25, 0.5, 0.5])
    np.testing.assert_array_equal(x.grad.asnumpy(), [0.0, 0.0, 1.0, 0.0, 0.0])


def test_lengths_after_conv_is_the_spec_formula_at_least_one():
    lengths = np.arange(1, 20)
    for kernel, stride, padding, dilation in [(3, 2, (1, 1), 1), (11, 2, (5, 5), 1),
                                              (5, 3, (0, 2), 2), (7, 1, (0, 0), 1)]:
        attrs = {"kernel": kernel, "stride": stride, "padding": padding, "dilation": dilation}
        got = ops.lengths_after_conv(nd, [nd.array(lengths)], {}, attrs, None).asnumpy()
        np.testing.assert_array_equal(got, spec_ops.length_after_conv(lengths, attrs))


def test_sequence_batchnorm_running_statistics_use_only_valid_steps():
    model, _ = _models("sequence_batchnorm")
    batch = model.synthetic_batch()
    valid = batch["x"][ref.valid_positions(LENGTHS, T)]  # (valid steps, D)
    model.train_step(batch)
    weights = model.get_weights()
    np.testing.assert_allclose(weights["bn.running_mean"], 0.1 * valid.mean(axis=0),
                               rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(weights["bn.running_var"], 0.9 + 0.1 * valid.var(axis=0, ddof=1),
                               rtol=1e-5)
    # inference normalises by the running statistics, padding still 0
    expected = ref.forward(model.spec, weights, batch)
    np.testing.assert_allclose(model.predict(batch), expected[model.spec.output], rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(_op_output(model, batch), expected["bn"], rtol=1e-5, atol=1e-6)
    assert np.all(_op_output(model, batch)[1, LENGTHS[1]:] == 0.0)


def test_recurrent_weights_round_trip_through_the_canonical_file(tmp_path):
    model, _ = _models("lstm_bidirectional_sum")
    rng = np.random.RandomState(3)
    weights = {n: rng.standard_normal(w.shape).astype(np.float32)
               for n, w in model.get_weights().items()}
    model.set_weights(weights)
    model.save_weights(str(tmp_path / "w.npz"))
    other, _ = _models("lstm_bidirectional_sum")
    other.load_weights(str(tmp_path / "w.npz"))
    for name, value in other.get_weights().items():
        np.testing.assert_array_equal(value, weights[name], err_msg=name)
    batch = model.synthetic_batch()
    # The same weights, bit for bit (above); two instances' outputs may still part by an ulp
    # (MXNet's CPU kernels need not repeat a sum bit for bit: 4.8e-7 of 1.8 seen once, in the
    # full suite on a loaded machine).
    np.testing.assert_allclose(other.predict(batch), model.predict(batch), rtol=1e-6, atol=0)
    assert set(weights) <= set(other.native.collect_params().keys())


# -- CTC ------------------------------------------------------------------------------------
def test_ctc_probe_loss_matches_the_reference():
    """The probe: strided convolution, lengths_after_conv, a bidirectional GRU, CTC."""
    model = build_native("probe/ctc", "mxnet", config="tiny")
    batch = model.synthetic_batch()
    loss, _ = model.loss_and_gradients(batch)
    values = ref.forward(model.spec, model.get_weights(), batch, training=True)
    assert loss == pytest.approx(ref.loss(model.spec, values, batch), rel=1e-5)


def _ctc_definition(frames, max_labels):
    def build(hp):
        g = Graph("ctc")
        g.input("x", (frames, D))
        g.input("x_lengths", (), "int32")
        logits = g.add("logits", "dense", "x", units=CLASSES)
        g.input("labels", (max_labels,), "int32", "target")
        # not "labels_lengths": that name would be checked as a sequence length, in [1, L],
        # where a CTC label may be empty
        g.input("label_lengths", (), "int32", "target")
        g.set_output(logits)
        g.set_program(single_objective(g, hp, "ctc", logits=logits, labels="labels",
                                       input_lengths="x_lengths", label_lengths="label_lengths"))
        return g

    def batch(hp, batch_size, seed):
        rng = np.random.RandomState(seed)
        return {"x": rng.standard_normal((3, frames, D)).astype(np.float32),
                "x_lengths": np.array([frames, 2, 3], np.int32),
                "labels": np.array([[1, 1, 2] + [0] * (max_labels - 3), [3] + [0] * (max_labels - 1),
                                    [0] * max_labels], np.int32),
                "label_lengths": np.array([3, 1, 0], np.int32)}
    return ModelDef("ctc", "test", {"tiny": HPARAMS}, build, batch, "examples/s",
                    lambda hp, b: len(b["x"]))


def test_ctc_labels_wider_than_the_frames_and_an_empty_label():
    """MXNet refuses a label axis longer than the frames; the padding past them is cut. An
    empty label scores all-blank frames."""
    definition = _ctc_definition(frames=5, max_labels=8)
    model = mx_backend.Model(definition, definition.hparams("tiny"))
    reference = torch_backend.Model(definition, definition.hparams("tiny"), device="cpu")
    batch = model.synthetic_batch()
    reference.set_weights(model.get_weights())
    loss, grads = model.loss_and_gradients(batch)
    ref_loss, ref_grads = reference.loss_and_gradients(batch)
    values = ref.forward(model.spec, model.get_weights(), batch, training=True)
    assert loss == pytest.approx(ref.loss(model.spec, values, batch), rel=1e-5)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    for name, g in grads.items():
        np.testing.assert_allclose(g, ref_grads[name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_an_unalignable_ctc_example_is_refused_before_mxnet_scores_it_zero():
    definition = _ctc_definition(frames=5, max_labels=3)
    model = mx_backend.Model(definition, definition.hparams("tiny"))
    batch = model.synthetic_batch()
    batch["x_lengths"] = np.array([3, 2, 3], np.int32)  # labels 1 1 2 need 4 frames
    with pytest.raises(ValueError, match="example 0: 3 labels need 4 frames"):
        model.loss_and_gradients(batch)


def test_sequence_batchnorm_in_a_plain_gluon_loop_follows_the_autograd_mode():
    """The native block: batch statistics of the valid steps under autograd.record(), running
    ones outside it, as MXNet's BatchNorm; training moves the running statistics MXNet's way
    (biased variance), as batchnorm does in a user's loop."""
    model, _ = _models("sequence_batchnorm")
    batch = model.synthetic_batch()
    features = [nd.array(batch[n].astype(np.float32)) for n in ("x", "x_lengths")]
    node = model.spec.nodes["bn"]
    weights = model.get_weights()
    valid = batch["x"][ref.valid_positions(LENGTHS, T)]
    with autograd.record():
        trained = model.native(*features)
    trained.backward()  # MXNet moves running statistics in the backward pass
    assert trained.shape == (len(LENGTHS), CLASSES)
    params = {k[len("bn."):]: v for k, v in weights.items() if k.startswith("bn.")}
    head = model.get_weights()
    expected = ref.sequence_batchnorm(batch["x"], LENGTHS, params, node.attrs, training=True)
    logits = expected.reshape(len(LENGTHS), -1) @ head["head.fc.weight"].T + head["head.fc.bias"]
    np.testing.assert_allclose(trained.asnumpy(), logits, rtol=1e-5, atol=1e-5)
    after = model.get_weights()
    np.testing.assert_allclose(after["bn.running_mean"], 0.1 * valid.mean(axis=0), rtol=1e-5,
                               atol=1e-7)
    np.testing.assert_allclose(after["bn.running_var"], 0.9 + 0.1 * valid.var(axis=0), rtol=1e-5)
    inference = ref.forward(model.spec, after, batch)[model.spec.output]
    np.testing.assert_allclose(model.native(*features).asnumpy(), inference, rtol=1e-5, atol=1e-6)
