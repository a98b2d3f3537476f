"""MXNet backend specifics: the native object, weights, inference, running statistics and the
normalized optimizers, checked against NumPy (cross-framework checks live in the consistency
tests). Tiny configs only; skipped where this interpreter has no mxnet."""

import warnings

import numpy as np
import pytest

from conftest import random_weights, require_framework

require_framework("mxnet")

import tbdzoo.backends.mxnet.framework  # noqa: F401  (sets numpy.bool before mxnet is imported)

# isort: split
from mxnet import gluon, nd

from tbdzoo.backends.mxnet import optimizers
from tbdzoo.backends.registry import build_native
from tbdzoo.reference.optimizers import Optimizer as ReferenceOptimizer


def _model(name, **overrides):
    return build_native(name, "mxnet", config="tiny", **overrides)


def test_native_is_a_hybridized_hybridblock_with_canonical_parameters():
    model = _model("resnet50")
    assert isinstance(model.native, gluon.HybridBlock)
    assert model.native._active  # hybridize() was called (Gluon 1.x keeps no public flag)
    model.predict(model.synthetic_batch())
    assert model.native._cached_op is not None  # the cached graph ran
    assert set(model.spec.params()) <= set(model.native.collect_params().keys())


def test_inference_blocks_bind_only_the_parameters_they_read():
    """Gluon warns of a bound parameter that no computation reads; the training batch norm's
    float64 statistics slots belong to the training blocks only."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = _model("resnet50")
        batch = model.synthetic_batch()
        model.train_step(batch)
        model.predict(batch)
    assert not [w for w in caught if "is not used by any computation" in str(w.message)]
    assert not [n for n in model.native.collect_params() if "float64" in n]


def test_a_tied_parameter_is_one_gluon_parameter():
    model = _model("transformer", dropout=0.0)
    names = set(model.native.collect_params().keys())
    assert "embed.weight" in names and "generator.weight" not in names
    assert "tgt_embed.weight" not in names
    _, grads = model.loss_and_gradients(model.synthetic_batch())
    assert np.abs(grads["embed.weight"]).max() > 0


@pytest.mark.parametrize("name,overrides", [("resnet50", {}), ("transformer", {"dropout": 0.0})])
def test_predict_equals_the_native_block_in_inference(name, overrides):
    model = _model(name, **overrides)
    model.set_weights(random_weights(model))
    batch = model.synthetic_batch()
    features = [nd.array(batch[i.name].astype(np.float32)) for i in model.spec.feature_inputs()]
    native = model.native(*features).asnumpy()
    np.testing.assert_array_equal(model.predict(batch), native)
    assert native.shape == (len(batch[model.spec.feature_inputs()[0].name]),) + \
        model.spec.nodes[model.spec.output].shape


def test_the_native_block_trains_in_a_plain_gluon_loop():
    """What a user importing ``.native`` does: Gluon loss, autograd, Trainer."""
    from mxnet import autograd
    model = _model("resnet50")
    batch = model.synthetic_batch()
    before = model.get_weights()
    net = model.native
    trainer = gluon.Trainer([p for p in net.collect_params().values() if p.grad_req != "null"],
                            "sgd", {"learning_rate": 0.1})
    with autograd.record():
        loss = gluon.loss.SoftmaxCrossEntropyLoss()(net(nd.array(batch["images"])),
                                                    nd.array(batch["labels"]))
    loss.backward()
    trainer.step(len(batch["labels"]))
    after = model.get_weights()
    assert not np.array_equal(after["conv1.weight"], before["conv1.weight"])
    assert not np.array_equal(after["bn1.running_mean"], before["bn1.running_mean"])


def _parameter(value, grad):
    p = gluon.Parameter("w", shape=value.shape)
    p.initialize()
    p.set_data(nd.array(value))
    p.grad()[:] = nd.array(grad)
    return p


@pytest.mark.parametrize("hp", [
    {"optimizer": "sgd", "momentum": 0.0, "nesterov": False, "weight_decay": 0.01},
    {"optimizer": "sgd", "momentum": 0.9, "nesterov": False, "weight_decay": 0.01},
    {"optimizer": "sgd", "momentum": 0.9, "nesterov": True, "weight_decay": 0.01},
    {"optimizer": "adam", "beta1": 0.9, "beta2": 0.98, "eps": 1e-3,  # a large eps shows
     "weight_decay": 0.01}])                                         # where it sits
def test_optimizers_are_the_normalized_formulas_with_a_changing_learning_rate(hp):
    rng = np.random.RandomState(0)
    w = rng.standard_normal(6)
    p = _parameter(w, np.zeros(6))
    opt, reference = optimizers.make([p], hp), ReferenceOptimizer(hp)
    for lr in (0.1, 0.05, 0.2):  # MXNet's own SGD goes wrong exactly when lr changes
        g = rng.standard_normal(6)
        p.grad()[:] = nd.array(g)
        opt.step(lr)
        w = reference.step(w, g, lr)
        np.testing.assert_allclose(p.data().asnumpy(), w, rtol=1e-5, atol=1e-6)


def test_asymmetric_pools_never_let_padding_win():
    """All-negative inputs: a zero-padded max-pool or a pad-counting average would differ."""
    model = _model("probe/maxpool2d")
    batch = model.synthetic_batch()
    batch["x"] = -np.abs(batch["x"]) - 1.0
    node = model.spec.nodes["pool"]
    (t, b), (l, r) = node.attrs["padding"]
    x = np.pad(batch["x"], ((0, 0), (0, 0), (t, b), (l, r)), constant_values=-np.inf)
    kh, kw = node.attrs["kernel"]
    sh, sw = node.attrs["stride"]
    _, ho, wo = node.shape
    expected = np.stack([np.stack([x[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw].max(axis=(2, 3))
                                   for j in range(wo)], -1) for i in range(ho)], -2)
    head = model.get_weights()
    flat = expected.reshape(len(expected), -1)
    logits = flat @ head["head.fc.weight"].T + head["head.fc.bias"]
    np.testing.assert_allclose(model.predict(batch), logits, rtol=1e-5, atol=1e-5)
