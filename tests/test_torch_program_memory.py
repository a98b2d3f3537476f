"""What the PyTorch backend does to keep a training program's memory down changes no number:
the layer-norm input gradient's plain-op form (what torch.compile runs) agrees with the eager
kernel and relu_grad's mixed-precision form with PyTorch's ReLU backward, to second order; and
an objective's largest term runs first."""
import pytest

torch = pytest.importorskip("torch")
from tbdzoo.backends.torch import ops
from tbdzoo.backends.torch.model import _largest_first


def _second_order(fn, *tensors):
    """The op's value, and the gradients of a fixed random projection of it."""
    out = fn()
    weight = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(1))
    return out, torch.autograd.grad((out * weight).sum(), tensors, allow_unused=True)


def test_layernorm_input_grad_formula_matches_the_kernel():
    g = torch.Generator().manual_seed(0)
    x, dy = (torch.randn(3, 4, 5, 6, dtype=torch.float64, generator=g).requires_grad_() for _ in range(2))
    gamma = torch.randn(4, dtype=torch.float64, generator=g).requires_grad_()
    kernel, kernel_grads = _second_order(
        lambda: ops.channel_layernorm_input_grad([dy, x], {"gamma": gamma}, {"eps": 1e-5}, True), x, dy, gamma)
    formula, formula_grads = _second_order(
        lambda: ops._channel_layernorm_input_grad_formula(dy, x, gamma, 1e-5), x, dy, gamma)
    torch.testing.assert_close(formula, kernel, rtol=0, atol=1e-12)
    for a, b in zip(formula_grads, kernel_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_relu_grad_reads_input_or_output_in_any_dtype():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, 4, generator=g)
    dy = torch.randn(2, 3, 4, 4, generator=g, dtype=torch.float64).requires_grad_()
    expected = dy.detach() * (x > 0).double()
    same_dtype, (g_same,) = _second_order(lambda: ops.relu_grad([dy, torch.relu(x).double()], {}, {}, True), dy)
    mixed, (g_mixed,) = _second_order(lambda: ops.relu_grad([dy, x], {}, {}, True), dy)
    torch.testing.assert_close(same_dtype, expected, rtol=0, atol=0)
    torch.testing.assert_close(mixed, expected, rtol=0, atol=0)
    torch.testing.assert_close(g_same, g_mixed, rtol=0, atol=0)


def test_an_objective_runs_its_largest_term_first():
    """WGAN-GP's penalty reads the most of the graph, so its nodes are recorded before the plain
    critic passes and autograd's backward pass frees those passes first."""
    from tbdzoo.backends.registry import build_native
    model = build_native("wgan", "torch", config="tiny", device="cpu")
    outputs = [v for name, _ in model.program.objectives["critic"]
               for v in model.program.losses[name]["inputs"].values()]
    assert outputs[-1].startswith("penalty")  # the model lists the penalty last
    order = [name for unit in model.native.plan(_largest_first(model.spec, outputs))
             for name in unit.outs]
    last_penalty = max(i for i, n in enumerate(order) if n.startswith(("critic@mixed", "penalty")))
    first_real = min(i for i, n in enumerate(order) if n.startswith("critic."))
    assert last_penalty < first_real
