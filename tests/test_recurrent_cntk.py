"""The recurrent ops and the CTC loss on CNTK, reached through the worker as users reach them.

Each recurrent probe (tbdzoo/models/probes.py) on its ragged batch, from random weights:
the forward output and the loss against the NumPy reference, the gradients of every canonical
parameter against PyTorch. Then what ragged batches must guarantee: the content of padded
steps changes nothing, BatchNorm statistics count valid steps only, weights travel per
canonical parameter, and a CTC batch that cannot be aligned is refused with the reason.
"""
import numpy as np
import pytest

from conftest import random_weights, require_backend, run_in_env
from tbdzoo import reference as ref
from tbdzoo.backends import environments
from tbdzoo.backends.registry import build

PROBES = ("lstm", "lstm_bidirectional_sum", "gru", "gru_bidirectional", "additive_attention",
          "sequence_batchnorm", "clipped_relu", "transpose", "ctc")


@pytest.fixture(scope="module")
def workers():
    """One CNTK worker per probe, shared by the tests (a worker takes seconds to start)."""
    require_backend("cntk")
    started = {}

    def get(name):
        if name not in started:
            started[name] = build("probe/" + name, backend="cntk", config="tiny", isolate=True)
        return started[name]
    yield get
    for model in started.values():
        model.close()


def _single(loss):
    """A program's loss comes as {objective: value}; the probes have one objective."""
    return next(iter(loss.values())) if isinstance(loss, dict) else loss


@pytest.mark.parametrize("name", PROBES)
def test_probe_matches_the_numpy_reference_and_pytorch(workers, name):
    require_backend("torch")
    model = workers(name)
    weights = random_weights(model, seed=5)
    batch = model.synthetic_batch(seed=2)
    lengths = [batch[k] for k in batch if k.endswith("_lengths") and k != "labels_lengths"]
    assert all(v.min() < v.max() for v in lengths)  # ragged: one full, one short
    model.set_weights(weights)
    spec = model.spec

    expected = ref.forward(spec, weights, batch)[spec.output]  # running statistics, if any
    np.testing.assert_allclose(model.predict(batch), expected, rtol=1e-4, atol=1e-5)

    loss, grads = model.loss_and_gradients(batch)
    reference_loss = ref.loss(spec, ref.forward(spec, weights, batch, training=True), batch)
    assert _single(loss) == pytest.approx(reference_loss, rel=1e-5)

    with build("probe/" + name, backend="torch", config="tiny") as torch_model:
        torch_model.set_weights(weights)
        torch_loss, torch_grads = torch_model.loss_and_gradients(batch)
    assert _single(loss) == pytest.approx(_single(torch_loss), rel=1e-5)
    assert list(grads) == list(torch_grads) == model.trainable_names()
    for key, value in grads.items():
        np.testing.assert_allclose(value, torch_grads[key], rtol=1e-3,
                                   atol=1e-4 * np.abs(torch_grads[key]).max() + 1e-7,
                                   err_msg=key)


@pytest.mark.parametrize("name,sequence", [("lstm_bidirectional_sum", "x"),
                                           ("gru_bidirectional", "x"),
                                           ("sequence_batchnorm", "x"),
                                           ("additive_attention", "memory")])
def test_padded_steps_change_nothing(workers, name, sequence):
    """Huge values at every padded step give bit-identical outputs, loss and gradients: the
    recurrences never read them (the backward direction starts at each example's own last
    step), statistics and attention weights leave them out."""
    model = workers(name)
    model.set_weights(random_weights(model, seed=6))
    batch = model.synthetic_batch(seed=3)
    noisy = dict(batch)
    noisy[sequence] = batch[sequence].copy()
    lengths = batch[sequence + "_lengths"]
    for row, length in zip(noisy[sequence], lengths):
        row[length:] = 1e3 * np.random.RandomState(int(length)).standard_normal(row[length:].shape)
    assert not np.array_equal(noisy[sequence], batch[sequence])
    np.testing.assert_array_equal(model.predict(noisy), model.predict(batch))
    loss, grads = model.loss_and_gradients(batch)
    noisy_loss, noisy_grads = model.loss_and_gradients(noisy)
    assert noisy_loss == loss
    for key in grads:
        np.testing.assert_array_equal(noisy_grads[key], grads[key], err_msg=key)


def test_sequence_batchnorm_running_statistics_count_valid_steps_only(workers):
    model = workers("sequence_batchnorm")
    weights = random_weights(model, seed=7)
    model.set_weights(weights)
    m = model.spec.nodes["bn"].attrs["momentum"]
    mean, var = weights["bn.running_mean"].astype(np.float64), weights["bn.running_var"]
    for seed in (4, 5):
        batch = model.synthetic_batch(seed=seed)
        valid = np.concatenate([x[:n] for x, n in zip(batch["x"], batch["x_lengths"])])
        assert len(valid) < batch["x"].shape[0] * batch["x"].shape[1]
        model.train_step(batch)
        mean = (1 - m) * mean + m * valid.mean(axis=0)
        var = (1 - m) * var + m * valid.var(axis=0, ddof=1)
        after = model.get_weights()
        np.testing.assert_allclose(after["bn.running_mean"], mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(after["bn.running_var"], var, rtol=1e-5, atol=1e-6)
    # inference normalises by them: the reference with the updated statistics
    batch = model.synthetic_batch(seed=6)
    expected = ref.forward(model.spec, model.get_weights(), batch)[model.spec.output]
    np.testing.assert_allclose(model.predict(batch), expected, rtol=1e-4, atol=1e-5)


def test_weights_travel_per_canonical_parameter(workers, tmp_path):
    """Per gate, layer and direction, in the spec's order, through memory and the .npz."""
    model = workers("lstm_bidirectional_sum")
    weights = random_weights(model, seed=8)
    model.set_weights(weights)
    got = model.get_weights()
    assert list(got) == list(model.spec.params()) and "rnn.l1.bw.u_o" in got
    for key in weights:
        np.testing.assert_array_equal(got[key], weights[key], err_msg=key)
    path = str(tmp_path / "w.npz")
    model.save_weights(path)
    model.set_weights(random_weights(model, seed=9))
    model.load_weights(path)
    for key, value in model.get_weights().items():
        np.testing.assert_array_equal(value, weights[key], err_msg=key)


def test_ctc_refuses_a_batch_it_cannot_align(workers):
    model = workers("ctc")
    batch = model.synthetic_batch(seed=1)
    batch["labels"] = batch["labels"].copy()
    batch["labels_lengths"] = batch["labels_lengths"].copy()
    batch["labels"][0] = [2, 2, 2]  # three equal labels need 5 frames; the probe has at most 5
    batch["labels_lengths"][0] = 3
    batch["x_lengths"] = batch["x_lengths"].copy()
    batch["x_lengths"][0] = 6  # 3 frames after the stride-2 convolution
    with pytest.raises(Exception, match="3 labels need 5 frames"):
        model.loss_and_gradients(batch)


_ENDS_CHECK = r"""
import numpy as np, cntk as C
from tbdzoo.backends.cntk import ops
from tbdzoo.spec.ops import length_after_conv

x = C.input_variable((6,), np.float32, needs_gradient=True)
y = ops.clipped_relu([x], {}, {"ceiling": 20.0}, None)
v = np.array([[-1.0, 0.0, 5.0, 20.0, 25.0, 19.5]], np.float32)
np.testing.assert_array_equal(y.eval({x: v}), [[0.0, 0.0, 5.0, 20.0, 20.0, 19.5]])
np.testing.assert_array_equal(C.reduce_sum(y).grad({x: v}), [[0, 0, 1, 0, 0, 1]])

lengths = C.input_variable((), np.float32)
values = np.array([1, 2, 20, 21, 22, 23, 24, 1000001])
for a in ({"kernel": 11, "stride": 2, "padding": (5, 5), "dilation": 1},
          {"kernel": 11, "stride": 3, "padding": (0, 0), "dilation": 2},
          {"kernel": 3, "stride": 7, "padding": (2, 0), "dilation": 1}):
    got = ops.lengths_after_conv([lengths], {}, a, None).eval({lengths: values.astype(np.float32)})
    np.testing.assert_array_equal(got, length_after_conv(values, a))
print("ends ok")
"""


def test_clipped_relu_ends_and_lengths_after_conv_in_the_cntk_interpreter():
    """Where the probes' random inputs never land: the gradient at exactly 0 and exactly the
    ceiling (both 0), and the lengths formula for strides that do not divide, with dilation."""
    require_backend("cntk")
    proc = run_in_env(environments.python_of("cntk"), ["-c", _ENDS_CHECK], timeout=300)
    assert proc.returncode == 0 and "ends ok" in proc.stdout, proc.stdout + proc.stderr
