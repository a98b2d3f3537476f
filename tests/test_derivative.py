"""The spec's input-gradient transformation against PyTorch's own double differentiation.

The transformation writes d(critic)/d(input) as ordinary nodes so that MXNet and CNTK, which
cannot differentiate twice, can train on a gradient penalty. Here PyTorch, which can, checks
both the gradient it builds and the second-order parameter gradients that flow through it.
"""
import numpy as np
import pytest

from tbdzoo.spec import Graph, initial_weights
from tbdzoo.spec.derivative import input_gradient

torch = pytest.importorskip("torch")
from tbdzoo.backends.torch.native import build as build_native


def critic():
    """A small residual 'down' critic with every op the WGAN-GP critic uses, and odd sizes,
    asymmetric padding and a strided convolution that drops the last row, on purpose."""
    g = Graph("critic")
    x = g.input("x", (3, 9, 8))
    h = g.add("conv0", "conv2d", x, filters=4, kernel=3, stride=2, padding=((1, 0), (0, 1)),
              use_bias=True)                                   # 9 x 8 -> 4 x 4, last row unread
    s = g.add("short.pool", "avgpool2d", h, kernel=2)
    s = g.add("short.conv", "conv2d", s, filters=6, kernel=1, use_bias=True)
    y = g.add("ln1", "channel_layernorm", h)
    y = g.add("relu1", "relu", y)
    y = g.add("conv1", "conv2d", y, filters=4, kernel=3, padding=1)
    y = g.add("ln2", "channel_layernorm", y)
    y = g.add("relu2", "relu", y)
    y = g.add("conv2", "conv2d", y, filters=6, kernel=3, padding=1, use_bias=True)
    y = g.add("pool", "avgpool2d", y, kernel=2)
    y = g.add("add", "add", [y, s])
    y = g.add("flat", "reshape", y, shape=(24,))
    g.add("out", "dense", y, units=1)
    return g


def second_order(loss, params):
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]


def module(graph, output, weights):
    graph.set_output(output)
    m = build_native(graph, weights).double()
    return m.train()


def randomised(graph, seed=1):
    rng = np.random.RandomState(seed)
    w = initial_weights(graph, 0)
    return {k: (v + 0.3 * rng.standard_normal(v.shape)).astype(np.float32) for k, v in w.items()}


def test_the_built_gradient_equals_autograd_and_so_do_the_penalty_gradients():
    g = critic()
    weights = randomised(g)
    grad = input_gradient(g, "out", "x", "gp")
    x = torch.from_numpy(np.random.RandomState(2).standard_normal((5, 3, 9, 8)))

    forward = module(g, "out", weights)
    xr = x.clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(forward(xr).sum(), xr, create_graph=True)
    penalty = ((expected.flatten(1).norm(dim=1) - 1) ** 2).mean()
    params = [p for _, p in sorted(forward.named_parameters())]
    expected_second = second_order(penalty, params)

    built = module(g, grad, weights)
    got = built(x)
    np.testing.assert_allclose(got.detach().numpy(), expected.detach().numpy(), rtol=1e-9, atol=1e-12)
    penalty = ((got.flatten(1).norm(dim=1) - 1) ** 2).mean()
    named = dict(built.named_parameters())
    got_second = second_order(penalty, [named[n] for n, _ in sorted(forward.named_parameters())])
    for (name, _), e, o in zip(sorted(forward.named_parameters()), expected_second, got_second):
        np.testing.assert_allclose(o.numpy(), e.numpy(), rtol=1e-8, atol=1e-12, err_msg=name)
    # the second-order terms reach the weights (biases after the last nonlinearity get none):
    # the check above could not pass by accident
    nonzero = {n for (n, _), e in zip(sorted(forward.named_parameters()), expected_second)
               if float(e.abs().max()) > 0}
    assert {n for n in nonzero if n.endswith("weight")} == {
        n for n, _ in forward.named_parameters() if n.endswith("weight")}


def test_the_gradient_shares_the_forward_parameters():
    g = critic()
    before = set(g.params())
    input_gradient(g, "out", "x", "gp")
    assert set(g.params()) == before


def test_an_op_without_a_rule_is_named():
    g = Graph("c")
    x = g.input("x", (2, 4, 4))
    y = g.add("pool", "maxpool2d", x, kernel=2)
    y = g.add("flat", "flatten", y)
    g.add("out", "dense", y, units=1)
    with pytest.raises(ValueError, match="'pool' \\(maxpool2d\\) has no rule"):
        input_gradient(g, "out", "x", "gp")


def test_input_grad_ops_refuse_parameters_of_their_own():
    g = Graph("c")
    g.input("dy", (4,))
    with pytest.raises(ValueError, match="shared"):
        g.add("dx", "dense_input_grad", "dy", in_features=3)
