"""Training programs on the MXNet backend, against the PyTorch reference (docs/consistency.md).

The protocol is tbdzoo.consistency's (set weights, predict, loss and gradients, three steps),
run in this process on both backends; a program of two objectives gives a loss per objective,
and every one of them is compared. Also: RMSProp and clipping against their documented
formulas, weights through the canonical .npz, and the bad inputs users meet.
"""
from collections import OrderedDict

import numpy as np
import pytest

from conftest import require_framework

require_framework("mxnet")
require_framework("torch")

from tbdzoo import consistency
from tbdzoo.backends.registry import build_native


def _values(loss):
    """A step's loss as a row: one entry per objective of a program of several."""
    return list(loss.values()) if isinstance(loss, dict) else [loss]


def run_protocol(model, weights, batch, steps=3):
    model.set_weights(weights)
    out = OrderedDict()
    out["forward"] = np.asarray(model.predict(batch), np.float64)
    loss, grads = model.loss_and_gradients(batch)
    out["loss"] = np.asarray(_values(loss), np.float64)
    for name, g in grads.items():
        out["grad/" + name] = np.asarray(g, np.float64)
    out["trajectory"] = np.asarray([_values(model.train_step(batch)) for _ in range(steps)],
                                   np.float64)
    return out


def check_against_reference(name, config, seed, **overrides):
    reference = build_native(name, "torch", config=config, seed=seed, device="cpu", **overrides)
    weights, batch = reference.get_weights(), reference.synthetic_batch(seed=seed)
    record = run_protocol(reference, weights, batch)
    model = build_native(name, "mxnet", config=config, seed=seed + 1, **overrides)
    other = run_protocol(model, weights, batch)
    failures = consistency.compare(record, other)
    if not np.allclose(other["loss"], record["loss"], rtol=1e-5, atol=1e-6):
        failures.append("loss: {} vs reference {}".format(other["loss"], record["loss"]))
    return failures


# Seed 1, as on every backend (docs/consistency.md), not 0: at seed 0 an input of the
# generator's res4.relu1 lies within float32 rounding
# of zero, so PyTorch's and MXNet's ReLU masks differ in that element, and every generator
# gradient upstream of it (res1 to res3, the input dense layer) moves by up to 5e-4 of its
# largest entry with cosines still 1.000000: rounding, not a difference in the model. Seeds 1
# and 2 pass. (Both WGAN configs share the generator and its seed-0 batch, so both miss at seed 0.)
@pytest.mark.parametrize("config", ["tiny", "tiny_original"])
def test_wgan_matches_the_reference(config):
    assert check_against_reference("wgan", config, seed=1) == []


def test_inception_v3_output_loss_and_weights_match_the_reference(tmp_path):
    """Inference output and the training objective (main + 0.4 aux, label-smoothed) at the
    reference's tolerances, and a step that moves the weights the way the reference does."""
    reference = build_native("inception_v3", "torch", config="tiny", device="cpu", dropout=0.0)
    weights, batch = reference.get_weights(), reference.synthetic_batch(seed=0)
    model = build_native("inception_v3", "mxnet", config="tiny", seed=1, dropout=0.0)
    model.set_weights(weights)
    tol = consistency.TOLERANCES["forward"]
    np.testing.assert_allclose(model.predict(batch), reference.predict(batch), **tol)
    loss, grads = model.loss_and_gradients(batch)
    expected, expected_grads = reference.loss_and_gradients(batch)
    assert loss == pytest.approx(expected, rel=1e-5)
    assert consistency.cosine(grads["fc.weight"], expected_grads["fc.weight"]) > 0.9999
    assert model.train_step(batch) == pytest.approx(reference.train_step(batch), rel=1e-5)
    path = str(tmp_path / "inception.npz")
    model.save_weights(path)
    reference.load_weights(path)
    np.testing.assert_allclose(reference.predict(batch), model.predict(batch), **tol)


def test_the_steps_return_each_objective_and_count_each_group():
    model = build_native("wgan", "mxnet", config="tiny")
    losses = model.train_step(model.synthetic_batch(seed=0))
    assert list(losses) == ["generator", "critic"]
    assert all(np.isfinite(v) for v in losses.values())
    assert dict(model.group_steps) == {"generator": 1, "critic": 2}


def test_the_original_wgan_clips_the_critic_after_each_update():
    model = build_native("wgan", "mxnet", config="tiny_original")
    model.train_step(model.synthetic_batch(seed=0))
    weights = model.get_weights()
    owner = model.program.assignment(model.spec)
    assert max(np.abs(weights[n]).max() for n, g in owner.items() if g == "critic") <= 0.01
    assert max(np.abs(weights[n]).max() for n, g in owner.items() if g == "generator") > 0.01


def test_wgan_weights_round_trip_through_the_canonical_npz(tmp_path):
    from conftest import random_weights
    model = build_native("wgan", "mxnet", config="tiny")
    batch = model.synthetic_batch(seed=0)
    model.predict(batch)  # an inference pass first: MKLDNN may now hold weights in its layout
    weights = random_weights(model)
    model.set_weights(weights)
    path = str(tmp_path / "wgan.npz")
    model.save_weights(path)
    other = build_native("wgan", "mxnet", config="tiny", seed=5)
    other.load_weights(path)
    for name, value in other.get_weights().items():
        np.testing.assert_array_equal(value, weights[name], err_msg=name)
    np.testing.assert_allclose(other.predict(batch), model.predict(batch), rtol=1e-6, atol=1e-6)


def test_weights_can_be_set_after_predict():
    """MKLDNN keeps a convolution's weight in its blocked layout after an inference pass; a
    copy from NumPy into it used to fail ('Check failed: !IsMKLDNNData()')."""
    model = build_native("resnet50", "mxnet", config="tiny")
    batch = model.synthetic_batch(seed=0)
    before = model.predict(batch)
    weights = model.get_weights()
    scaled = OrderedDict((k, v * 1.5 if v.ndim == 4 else v) for k, v in weights.items())
    model.set_weights(scaled)
    assert not np.allclose(model.predict(batch), before)
    for name, value in model.get_weights().items():
        np.testing.assert_array_equal(value, scaled[name], err_msg=name)
    model.set_weights(weights)
    np.testing.assert_allclose(model.predict(batch), before, rtol=1e-6, atol=1e-6)


def test_a_wgan_batch_without_noise_is_refused_by_name():
    model = build_native("wgan", "mxnet", config="tiny")
    batch = model.synthetic_batch(seed=0)
    del batch["noise"]
    with pytest.raises(ValueError, match="lacks 'noise'"):
        model.train_step(batch)
    with pytest.raises(ValueError, match="lacks 'noise'"):
        model.predict(batch)


def _parameter(values):
    import mxnet as mx
    from mxnet import gluon
    p = gluon.Parameter("w", shape=(len(values),), init=mx.init.Zero())
    p.initialize()
    p.set_data(mx.nd.array(values))
    return p


@pytest.mark.parametrize("centered", [False, True])
def test_rmsprop_and_clipping_follow_the_documented_formulas(centered):
    """Three steps against the float64 reference of docs/optimizers.md: clipping before coupled
    weight decay, eps inside the root, lr inside the momentum buffer, a changing rate."""
    from tbdzoo.backends.mxnet import optimizers  # first: it lets MXNet import under NumPy 1.24+
    from tbdzoo.reference.optimizers import trajectory as reference_trajectory
    # isort: split
    from mxnet import nd
    spec = {"kind": "rmsprop", "alpha": 0.9, "eps": 1.0, "momentum": 0.9, "centered": centered,
            "weight_decay": 0.01}
    clip = {"kind": "global_norm", "value": 2.0}
    start, grads = [1.0, -2.0, 3.0], ([3.0, 4.0, 0.0], [1.0, 1.0, 1.0], [-2.0, 0.0, 5.0])
    rates = (0.1, 0.05, 0.1)
    p = _parameter(start)
    opt = optimizers.RMSProp([p], **{k: v for k, v in spec.items() if k != "kind"})
    for lr, grad in zip(rates, grads):
        p.grad()[:] = nd.array(grad)
        optimizers.clip_gradients([p], clip)
        opt.step(lr)
    expected = reference_trajectory(spec, start, grads, rates, clip)[-1]
    np.testing.assert_allclose(p.data().asnumpy(), expected, rtol=1e-5)


def test_value_clipping_and_weight_clipping():
    from tbdzoo.backends.mxnet import optimizers
    # isort: split
    from mxnet import nd
    p = _parameter([0.5, -0.02, 0.003])
    p.grad()[:] = nd.array([3.0, -0.5, 0.1])
    optimizers.clip_gradients([p], {"kind": "value", "value": 0.2})
    np.testing.assert_allclose(p.grad().asnumpy(), [0.2, -0.2, 0.1], rtol=1e-6)
    optimizers.clip_weights([p], 0.01)
    np.testing.assert_allclose(p.data().asnumpy(), [0.01, -0.01, 0.003], rtol=1e-6)
