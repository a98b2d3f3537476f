"""MXNet nodes whose float32 results must be as exact as PyTorch's (docs/consistency.md): the
training-mode batch norm and the log-softmax, against float64 NumPy. MXNet's own fused BatchNorm
(batch variance ~1e-5 relative off on a 2 x 149 x 149 channel) and ``log_softmax`` (3.5e-6 off)
each moved tiny Inception-v3's first-step loss past the consistency tolerance."""
from collections import namedtuple

import numpy as np
import pytest

from conftest import require_framework

require_framework("mxnet")

from tbdzoo.backends.mxnet import ops

# isort: split
from mxnet import autograd, nd

Node = namedtuple("Node", "name op attrs")
ATTRS = {"eps": 1e-3, "momentum": 0.1, "track_running_stats": True}


def _batchnorm_in_training(x, gamma, beta, dy):
    """(y, batch mean, batch variance, dx, dgamma) from ops.batchnorm in a train block's mode."""
    channels = x.shape[1]
    node = Node("bn", "batchnorm", ATTRS)
    constants = {k: nd.array(v, dtype=v.dtype)
                 for k, v in ops.constants_for(node, [x.shape[1:]]).items()}
    ctx = ops.GraphContext(constants, exact_bn_stats=True)
    ctx.node_name, ctx.in_shapes = node.name, [x.shape[1:]]
    xs, g = nd.array(x), nd.array(gamma)
    xs.attach_grad()
    g.attach_grad()
    params = {"gamma": g, "beta": nd.array(beta), "running_mean": nd.zeros(channels),
              "running_var": nd.ones(channels)}
    with autograd.record(train_mode=True):
        y = ops.batchnorm(nd, [xs], params, ATTRS, ctx)
    y.backward(nd.array(dy))
    (mean, variance), = ctx.bn_stats
    return (y.asnumpy(), mean.asnumpy(), variance.asnumpy(), xs.grad.asnumpy(),
            g.grad.asnumpy())


@pytest.mark.parametrize("shape, offset", [((2, 4, 149, 149), 3.0), ((8, 16, 17, 17), 0.5)])
def test_training_batchnorm_is_exact_to_float32_rounding(shape, offset):
    rng = np.random.RandomState(0)
    x = (rng.randn(*shape) * 0.7 + offset).astype(np.float32)
    gamma = rng.uniform(0.5, 1.5, shape[1]).astype(np.float32)
    beta = rng.randn(shape[1]).astype(np.float32)
    dy = rng.randn(*shape).astype(np.float32)
    y, mean, variance, dx, dgamma = _batchnorm_in_training(x, gamma, beta, dy)

    axes = (0, 2, 3)
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    mean64, var64 = x64.mean(axes), x64.var(axes)
    def c(v):
        return v[None, :, None, None]
    xhat = (x64 - c(mean64)) / np.sqrt(c(var64) + ATTRS["eps"])
    y64 = xhat * c(gamma) + c(beta)
    dx64 = c(gamma) / np.sqrt(c(var64) + ATTRS["eps"]) * (
        dy64 - c(dy64.mean(axes)) - xhat * c((dy64 * xhat).mean(axes)))
    # MXNet's fused float32 kernel: variance 9e-6 to 2e-5 relative off, y 2e-5 to 5e-5
    np.testing.assert_allclose(mean, mean64, rtol=0, atol=1e-6 * (offset + 1))
    np.testing.assert_allclose(variance, var64, rtol=5e-7)
    assert np.abs(y - y64).max() < 3e-6
    assert np.abs(dx - dx64).max() < 2e-6 * np.abs(dx64).max()
    np.testing.assert_allclose(dgamma, (dy64 * xhat).sum(axes), rtol=1e-5)


def test_log_softmax_is_exact_to_float32_rounding():
    rng = np.random.RandomState(0)
    x = rng.randn(64, 10).astype(np.float32)
    x64 = x.astype(np.float64)
    m = x64.max(-1, keepdims=True)
    expected = x64 - m - np.log(np.exp(x64 - m).sum(-1, keepdims=True))
    xs = nd.array(x)
    xs.attach_grad()
    weights = rng.randn(64, 10)
    with autograd.record():
        out = ops.log_softmax(nd, xs)
    out.backward(nd.array(weights))
    assert np.abs(out.asnumpy() - expected).max() < 5e-7  # MXNet's log_softmax: 3.5e-6
    softmax = np.exp(expected)
    grad64 = weights - softmax * weights.sum(-1, keepdims=True)
    np.testing.assert_allclose(xs.grad.asnumpy(), grad64, rtol=1e-5, atol=1e-6)
