"""Faster R-CNN with ``execution="compiled"`` on the PyTorch backend (docs/models/faster_rcnn.md,
"Compiled"): Dynamo traces the forward half the targets step reads and the rest of the step
(RoIAlign, the box head, the losses) as one graph each, without a graph break, compiles nothing
again in later steps, and the steps' losses are the eager steps'."""
import functools
from unittest import mock

import numpy as np
import pytest

from conftest import require_framework

require_framework("torch")

import torch
import torch._dynamo

from tbdzoo.backends.registry import build_native

NAME = "faster_rcnn"


class _Graphs:
    """A Dynamo backend that counts the graphs it is given (and their ops) before handing each
    to ``backend``."""

    def __init__(self, backend):
        self.backend, self.ops = backend, []

    def __call__(self, gm, example_inputs):
        self.ops.append(sum(1 for n in gm.graph.nodes if n.op.startswith("call_")))
        return torch._dynamo.backends.registry.lookup_backend(self.backend)(gm, example_inputs)


def _compiled_and_eager_steps(backend, steps, **overrides):
    """(losses of the compiled model's steps, the eager model's, graphs compiled per step)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    graphs = _Graphs(backend)
    with mock.patch.object(torch, "compile", functools.partial(torch.compile, backend=graphs)):
        compiled = build_native(NAME, "torch", config="tiny", seed=0, device="cpu",
                                execution="compiled", **overrides)
    eager = build_native(NAME, "torch", config="tiny", seed=0, device="cpu", **overrides)
    batch = eager.synthetic_batch(seed=1)
    losses, counts = [], []
    try:
        for _ in range(steps):
            losses.append((compiled.train_step(batch), eager.train_step(batch)))
            counts.append(len(graphs.ops))
    finally:
        compiled.close()
        eager.close()
    return losses, counts, graphs


def test_the_compiled_step_is_two_graphs_without_a_break_or_a_recompilation():
    losses, counts, graphs = _compiled_and_eager_steps("aot_eager", 3)
    assert dict(torch._dynamo.utils.counters["graph_break"]) == {}
    # the forward half up to the RPN's outputs, then RoIAlign, the box head and the losses
    assert counts == [2, 2, 2], counts
    assert all(n > 50 for n in graphs.ops), graphs.ops
    for step, (a, b) in enumerate(losses):
        assert a == pytest.approx(b, rel=1e-5), (step, a, b)


def test_a_compiled_bf16_step_runs_roialign_inside_the_graph_under_autocast():
    losses, counts, _ = _compiled_and_eager_steps("aot_eager", 2, precision="bf16")
    assert dict(torch._dynamo.utils.counters["graph_break"]) == {}
    assert counts == [2, 2]
    for a, b in losses:
        assert np.isfinite(a) and a == pytest.approx(b, rel=0.05)


@pytest.mark.slow
def test_inductors_compiled_steps_give_the_eager_steps_losses():
    losses, counts, _ = _compiled_and_eager_steps("inductor", 2)
    assert counts == [2, 2]
    for a, b in losses:
        assert a == pytest.approx(b, rel=1e-4)
