"""The MXNet training-program path's fast routes: its two batch norms against the PyTorch
reference, the multi-array update, and RMSProp's fused operators against the documented formula.

Programs normalise by MXNet's fused BatchNorm and update the running statistics from its batch
moments outside the graph; ``Model.EXACT_BATCH_STATISTICS`` switches to the two-pass moments,
which must keep every gradient of Inception-v3's tiny config at the consistency tolerance
(docs/consistency.md) where the fused kernel's float32 sums do not.
"""
import numpy as np
import pytest

from conftest import require_framework

require_framework("mxnet")
require_framework("torch")

from tbdzoo import consistency
from tbdzoo.backends.mxnet.model import Model
from tbdzoo.backends.registry import build_native
from tbdzoo.models import get_model


class ExactModel(Model):
    EXACT_BATCH_STATISTICS = True


@pytest.fixture(scope="module")
def reference():
    """Tiny Inception-v3 on PyTorch: weights, batch, gradients, and the weights and running
    statistics after one step."""
    model = build_native("inception_v3", "torch", config="tiny", device="cpu", dropout=0.0)
    weights, batch = model.get_weights(), model.synthetic_batch(seed=0)
    _, grads = model.loss_and_gradients(batch)
    model.train_step(batch)
    return weights, batch, grads, model.get_weights()


def _mxnet(cls, weights):
    model_def = get_model("inception_v3")
    model = cls(model_def, model_def.hparams("tiny", dropout=0.0), seed=1)
    model.set_weights(weights)
    return model


def test_exact_statistics_keep_every_gradient_at_the_consistency_tolerance(reference):
    weights, batch, expected, _ = reference
    _, grads = _mxnet(ExactModel, weights).loss_and_gradients(batch)
    floor = consistency.TOLERANCES["gradients"]["min_cosine"]
    worst = min((consistency.cosine(np.asarray(grads[n], np.float64),
                                    np.asarray(g, np.float64)), n) for n, g in expected.items())
    assert worst[0] > floor, worst


@pytest.mark.parametrize("cls", [Model, ExactModel], ids=["fused", "exact"])
def test_a_step_updates_the_running_statistics_as_the_spec_says(cls, reference):
    """New-batch weight 0.1 and the unbiased batch variance, from either batch norm's moments.
    The batch moments themselves differ by up to 2e-4 of a layer's largest (the fused kernel's
    sums, compounded over the layers before); a biased variance would move the auxiliary
    head's last layer, two values per channel, by a factor of two."""
    weights, batch, _, after = reference
    model = _mxnet(cls, weights)
    model.train_step(batch)
    ours = model.get_weights()
    names = [n for n in after if n.endswith(("running_mean", "running_var"))]
    assert len(names) == 2 * 94 + 2 * 2  # every batch norm of the trunk and the auxiliary head
    for name in names:
        assert not np.array_equal(after[name], weights[name]), name
        scale = float(np.abs(after[name]).max())
        np.testing.assert_allclose(ours[name], after[name], rtol=0, atol=1e-3 * scale,
                                   err_msg=name)


@pytest.mark.parametrize("scale_only", [False, True])
def test_the_multi_array_update_computes_a_y_plus_b_x(scale_only):
    """Over 130 arrays (three operator calls of at most 60), per-array a and b, to float32
    rounding of the exact value, as the one-array update."""
    from mxnet import nd

    from tbdzoo.backends.mxnet import optimizers
    rng = np.random.RandomState(0)
    shapes = [tuple(rng.randint(1, 9, size=rng.randint(1, 4))) for _ in range(130)]
    a = rng.uniform(0.5, 1.0, len(shapes))
    b = np.zeros(len(shapes)) if scale_only else rng.uniform(-2.0, 2.0, len(shapes))
    before = [rng.randn(*s).astype(np.float32) for s in shapes]
    xs = [rng.randn(*s).astype(np.float32) for s in shapes]
    ys = [nd.array(y) for y in before]
    optimizers.AxpbyAll(a, b, len(shapes), ys[0].context)(ys, [nd.array(x) for x in xs])
    for i, (y, y0, x) in enumerate(zip(ys, before, xs)):
        exact = a[i] * y0.astype(np.float64) + b[i] * x
        np.testing.assert_allclose(y.asnumpy(), exact, rtol=1e-6, atol=1e-6, err_msg=str(i))


def test_the_multi_array_update_refuses_mixed_scaling():
    from tbdzoo.backends.mxnet import optimizers
    with pytest.raises(ValueError, match="zero for every array or for none"):
        optimizers.AxpbyAll(1.0, [0.0, 1.0], 2, None)


# Two arrays updated one by one, three 1-D ones as one flat group (RMSProp's two routes).
RMSPROP_SHAPES = [(3, 4), (5,), (2, 1, 3), (2,), (4,)]
RMSPROP_CLIPS = {"none": None, "global_norm": {"kind": "global_norm", "value": 1.5},
                 "value": {"kind": "value", "value": 0.3}}


def _parameters(values):
    import mxnet as mx
    from mxnet import gluon
    out = []
    for i, v in enumerate(values):
        p = gluon.Parameter("p{}".format(i), shape=v.shape, init=mx.init.Zero())
        p.initialize()
        p.set_data(mx.nd.array(v))
        out.append(p)
    return out


@pytest.mark.parametrize("clip", sorted(RMSPROP_CLIPS))
@pytest.mark.parametrize("momentum,centered", [(0.9, False), (0.0, False), (0.8, True),
                                               (0.0, True)],
                         ids=["momentum", "plain", "centered-momentum", "centered"])
def test_rmsprop_follows_the_documented_formula_over_several_steps(momentum, centered, clip):
    """Five steps at changing rates, as model.py runs them (gradient_scale, then step), against
    the float64 reference of docs/optimizers.md over the concatenated parameters: eps inside
    the root, lr inside the momentum buffer, coupled weight decay after the clipping. The
    gradients grow and shrink so that the global norm clips some steps and not others."""
    from tbdzoo.backends.mxnet import optimizers
    from tbdzoo.reference.optimizers import trajectory as reference_trajectory
    # isort: split
    from mxnet import nd
    rng = np.random.RandomState(3)
    start = [rng.randn(*s).astype(np.float32) for s in RMSPROP_SHAPES]
    magnitudes, rates = (0.05, 2.0, 0.3, 4.0, 0.01), (0.1, 0.05, 0.2, 0.1, 0.03)
    grads = [[(m * rng.randn(*s)).astype(np.float32) for s in RMSPROP_SHAPES]
             for m in magnitudes]
    spec = {"kind": "rmsprop", "alpha": 0.9, "eps": 0.1, "momentum": momentum,
            "centered": centered, "weight_decay": 0.01}
    params = _parameters(start)
    opt = optimizers.RMSProp(params, **{k: v for k, v in spec.items() if k != "kind"})
    assert opt.flat is not None and len(opt.flat.params) == 3 and len(opt.units) == 2
    for step_grads, lr in zip(grads, rates):
        for p, g in zip(params, step_grads):
            p.grad()[:] = nd.array(g)
        opt.step(lr, grad_scale=optimizers.gradient_scale(params, RMSPROP_CLIPS[clip]))
    flat = [np.concatenate([a.ravel() for a in arrays]) for arrays in grads]
    expected = reference_trajectory(spec, np.concatenate([a.ravel() for a in start]), flat, rates,
                                    RMSPROP_CLIPS[clip])[-1]
    ours = np.concatenate([p.data().asnumpy().ravel() for p in params])
    moved = np.abs(expected - np.concatenate([a.ravel() for a in start]))
    assert np.median(moved) > 1e-2  # the steps are far above the tolerance
    np.testing.assert_allclose(ours, expected, rtol=2e-6, atol=2e-6)


def test_rmsprop_momentum_route_keeps_small_steps_exact():
    """Steps far below the weights' float32 resolution (tiny gradient, tiny rate): the
    momentum route recovers lr g / sqrt(v + eps) from w - 2^64 s, so every step still lands
    in the momentum buffer at float32 precision."""
    from tbdzoo.backends.mxnet import optimizers
    from tbdzoo.reference.optimizers import trajectory as reference_trajectory
    # isort: split
    start, grad = np.array([[100.0, -3.0], [0.5, 1e-3]], np.float32), np.float32(1e-6)
    spec = {"kind": "rmsprop", "alpha": 0.9, "eps": 1.0, "momentum": 0.9, "centered": False,
            "weight_decay": 0.0}
    (p,) = _parameters([start])
    opt = optimizers.RMSProp([p], **{k: v for k, v in spec.items() if k != "kind"})
    for _ in range(3):
        p.grad()[:] = grad
        opt.step(1e-4)
    expected_buffer = reference_trajectory(spec, np.zeros(4), [np.full(4, grad)] * 3, [1e-4] * 3)
    np.testing.assert_allclose(-opt.buffers[0].asnumpy().ravel(),
                               -(expected_buffer[-1] - expected_buffer[-2]), rtol=1e-5)


@pytest.mark.parametrize("kind,hp", [
    ("adam", {"beta1": 0.5, "beta2": 0.9, "eps": 1e-3, "weight_decay": 0.01}),
    ("sgd", {"momentum": 0.9, "nesterov": False, "weight_decay": 0.01}),
    ("sgd", {"momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    ("sgd", {"momentum": 0.0, "nesterov": False, "weight_decay": 0.01})],
    ids=["adam", "sgd-momentum", "sgd-nesterov", "sgd"])
def test_sgd_and_adam_take_the_global_norm_factor_as_their_gradient_scale(kind, hp):
    """The clipping factor enters SGD's and Adam's fused operators too (before weight decay)."""
    from tbdzoo.backends.mxnet import optimizers
    from tbdzoo.reference.optimizers import trajectory as reference_trajectory
    # isort: split
    from mxnet import nd
    rng = np.random.RandomState(0)
    start = rng.randn(6).astype(np.float32)
    grads, rates = [(3 * rng.randn(6)).astype(np.float32) for _ in range(4)], [0.1, 0.05, 0.2, 0.1]
    clip = {"kind": "global_norm", "value": 1.0}
    (p,) = _parameters([start])
    opt = {"adam": optimizers.Adam, "sgd": optimizers.SGD}[kind]([p], **hp)
    for g, lr in zip(grads, rates):
        p.grad()[:] = nd.array(g)
        opt.step(lr, grad_scale=optimizers.gradient_scale([p], clip))
    expected = reference_trajectory(dict(hp, kind=kind), start, grads, rates, clip)[-1]
    np.testing.assert_allclose(p.data().asnumpy(), expected, rtol=1e-5, atol=1e-6)
