"""The PyTorch backend's recurrent ops and CTC loss against independent computations.

The fused kernels (torch._VF over packed sequences, fed the canonical per-gate tensors) are
compared in float64 with a plain step-by-step implementation differentiated by autograd, so the
gradients reaching each canonical parameter are checked, not only the forward values; CTC is
compared with the NumPy alpha recursion and its finite differences. The probes' whole-model
comparison with the NumPy reference is in tests/test_numpy_reference.py.
"""
import numpy as np
import pytest

from conftest import require_framework

require_framework("torch")

import torch

import tbdzoo
from tbdzoo import reference as ref
from tbdzoo.backends.torch import ops
from tbdzoo.errors import BatchError
from tbdzoo.spec import Graph


def _canonical_params(op, attrs, d, seed=0):
    g = Graph("g")
    g.input("x", (5, d))
    g.input("x_lengths", (), "int32")
    g.add("rnn", op, ["x", "x_lengths"], **attrs)
    rng = np.random.RandomState(seed)
    return g.nodes["rnn"].attrs, {
        name[len("rnn."):]: torch.tensor(rng.standard_normal(spec.shape) * 0.5,
                                         dtype=torch.float64, requires_grad=True)
        for name, spec in g.params().items()}


def _unrolled(op, x, lengths, p, a):
    """The contract's cell equations, one step at a time, with masks instead of packing."""
    n, t, _ = x.shape
    dirs = ("fw", "bw") if a["bidirectional"] else ("fw",)
    for layer in range(a["num_layers"]):
        outs = []
        for d in dirs:
            q = "l{}.{}.".format(layer, d)
            h = x.new_zeros(n, a["units"])
            c = x.new_zeros(n, a["units"])
            out = [None] * t
            for step in range(t):
                # the backward direction reads t' = length - 1 - step, within each length
                index = (lengths - 1 - step).clamp(min=0) if d == "bw" else torch.full_like(lengths, step)
                valid = (step < lengths).to(x.dtype)[:, None]
                xt = x[torch.arange(n), index]
                if op == "lstm":
                    def gate(k, xt=xt, h=h, q=q):
                        return xt @ p[q + "w_" + k].T + h @ p[q + "u_" + k].T + p[q + "b_" + k]
                    c_new = torch.sigmoid(gate("f")) * c + torch.sigmoid(gate("i")) * torch.tanh(gate("g"))
                    h_new = torch.sigmoid(gate("o")) * torch.tanh(c_new)
                    c = valid * c_new + (1 - valid) * c
                else:
                    r = torch.sigmoid(xt @ p[q + "w_r"].T + h @ p[q + "u_r"].T + p[q + "b_r"])
                    z = torch.sigmoid(xt @ p[q + "w_z"].T + h @ p[q + "u_z"].T + p[q + "b_z"])
                    nn_ = torch.tanh(xt @ p[q + "w_n"].T + p[q + "b_in"] + r * (h @ p[q + "u_n"].T + p[q + "b_hn"]))
                    h_new = (1 - z) * nn_ + z * h
                h = valid * h_new + (1 - valid) * h
                out[step] = (index, valid * h_new)
            placed = x.new_zeros(n, t, a["units"])
            for index, value in out:
                placed = placed.index_put((torch.arange(n), index), value, accumulate=True)
            outs.append(placed)
        last = layer == a["num_layers"] - 1
        x = outs[0] + outs[1] if last and len(outs) == 2 and a["merge"] == "sum" else torch.cat(outs, -1)
    return x


_KERNEL_CASES = [
    ("lstm", {"units": 3}),
    ("lstm", {"units": 3, "num_layers": 2, "bidirectional": True, "merge": "sum"}),
    ("gru", {"units": 2, "bidirectional": True}),
    ("gru", {"units": 2, "num_layers": 2, "bidirectional": True, "merge": "sum"}),
    ("lstm", {"units": 3, "num_layers": 2}),
    ("gru", {"units": 2}),
]


@pytest.mark.parametrize("op, attrs, route", [(op, attrs, "packed") for op, attrs in _KERNEL_CASES] + [
    (op, attrs, "padded") for op, attrs in _KERNEL_CASES if not attrs.get("bidirectional")])
def test_fused_kernel_matches_unrolled_cells_forward_and_gradients(op, attrs, route, monkeypatch):
    """Both routes into the kernel: packed valid steps (the CPU, and bidirectional layers) and,
    for a unidirectional recurrence, the padded batch with its padding zeroed (CUDA's route,
    forced here on the CPU)."""
    if route == "padded":
        monkeypatch.setattr(ops, "_runs_padded", lambda x, a: True)
    a, p = _canonical_params(op, attrs, d=4)
    rng = np.random.RandomState(1)
    x = torch.tensor(rng.standard_normal((3, 5, 4)), requires_grad=True)
    lengths = torch.tensor([5, 2, 4])
    fused = getattr(ops, op)([x, lengths], p, a, True)
    plain = _unrolled(op, x, lengths, p, a)
    torch.testing.assert_close(fused, plain, rtol=1e-10, atol=1e-12)
    weights = torch.tensor(rng.standard_normal(fused.shape))
    names = list(p)
    got = torch.autograd.grad((fused * weights).sum(), [x] + [p[k] for k in names])
    want = torch.autograd.grad((plain * weights).sum(), [x] + [p[k] for k in names])
    for name, g, w in zip(["x"] + names, got, want):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-12, msg=name)
    # padded steps: exactly 0 out, exactly no gradient in
    assert torch.all(fused[1, 2:] == 0) and torch.all(got[0][1, 2:] == 0)


def test_fused_kernel_matches_the_numpy_reference_in_float32():
    a, p = _canonical_params("lstm", {"units": 3, "bidirectional": True, "forget_bias": 1.0}, d=2)
    x = np.random.RandomState(2).standard_normal((2, 5, 2))
    lengths = np.array([3, 5])
    got = ops.lstm([torch.tensor(x, dtype=torch.float32), torch.tensor(lengths)],
                   {k: v.detach().float() for k, v in p.items()}, a, False)
    want = ref.recurrent([x, lengths], {k: v.detach().numpy() for k, v in p.items()}, a,
                         ref.lstm_step)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)


def test_clipped_relu_gradient_is_zero_at_both_ends():
    x = torch.tensor([-1.0, 0.0, 0.5, 1.0, 2.0], requires_grad=True)
    y = ops.clipped_relu([x], {}, {"ceiling": 1.0}, True)
    assert y.tolist() == [0.0, 0.0, 0.5, 1.0, 1.0]
    y.sum().backward()
    assert x.grad.tolist() == [0.0, 0.0, 1.0, 0.0, 0.0]


def test_attention_gives_padded_memory_no_weight_and_no_gradient():
    rng = np.random.RandomState(3)
    p = {"w_query": torch.tensor(rng.standard_normal((4, 3))),
         "w_memory": torch.tensor(rng.standard_normal((4, 2))), "v": torch.tensor(rng.standard_normal(4))}
    query = torch.tensor(rng.standard_normal((2, 3, 3)))
    memory = torch.tensor(rng.standard_normal((2, 4, 2)), requires_grad=True)
    lengths = torch.tensor([4, 2])
    out = ops.additive_attention([query, memory, lengths], p, {}, True)
    want = ref.additive_attention(query.numpy(), memory.detach().numpy(), lengths.numpy(),
                                  {k: v.numpy() for k, v in p.items()})
    np.testing.assert_allclose(out.detach().numpy(), want, rtol=1e-12)
    out.sum().backward()
    assert torch.all(memory.grad[1, 2:] == 0) and torch.all(memory.grad[1, :2] != 0)


def test_sequence_batchnorm_updates_running_statistics_over_valid_steps():
    rng = np.random.RandomState(4)
    x = rng.standard_normal((2, 4, 3))
    lengths = np.array([4, 1])
    p = {"gamma": torch.ones(3, dtype=torch.float64), "beta": torch.zeros(3, dtype=torch.float64),
         "running_mean": torch.zeros(3, dtype=torch.float64),
         "running_var": torch.ones(3, dtype=torch.float64)}
    a = {"eps": 1e-5, "momentum": 0.1, "track_running_stats": True}
    out = ops.sequence_batchnorm([torch.tensor(x), torch.tensor(lengths)], p, a, True)
    valid = np.concatenate([x[0, :4], x[1, :1]])
    np.testing.assert_allclose(p["running_mean"].numpy(), 0.1 * valid.mean(0), rtol=1e-12)
    np.testing.assert_allclose(p["running_var"].numpy(), 0.9 + 0.1 * valid.var(0, ddof=1), rtol=1e-12)
    assert torch.all(out[1, 1:] == 0)
    np.testing.assert_allclose(out.numpy(), ref.sequence_batchnorm(
        x, lengths, {"gamma": np.ones(3), "beta": np.zeros(3)}, a, True), rtol=1e-12)


def test_lengths_after_conv_matches_the_formula_and_keeps_at_least_one():
    a = {"kernel": 11, "stride": 3, "padding": (0, 2), "dilation": 2}
    lengths = np.arange(1, 40)
    got = ops.lengths_after_conv([torch.tensor(lengths)], {}, a, False)
    assert got.tolist() == ref.lengths_after_conv(lengths, a).tolist()
    assert got.min().item() == 1


def test_ctc_matches_the_alpha_recursion_and_its_finite_differences():
    rng = np.random.RandomState(5)
    logits = rng.standard_normal((3, 6, 4))
    labels = np.array([[1, 1, 2], [3, 0, 0], [2, 3, 0]])
    input_lengths, label_lengths = np.array([6, 2, 4]), np.array([3, 1, 2])
    z = torch.tensor(logits, requires_grad=True)
    loss = ops.loss("ctc", {"logits": z, "labels": torch.tensor(labels),
                            "input_lengths": torch.tensor(input_lengths),
                            "label_lengths": torch.tensor(label_lengths)}, {"blank": 0})
    assert loss.item() == pytest.approx(ref.ctc(logits, labels, input_lengths, label_lengths),
                                        rel=1e-10)
    loss.backward()
    eps, numeric = 1e-6, np.zeros_like(logits)
    for index in np.ndindex(*logits.shape):
        up, down = logits.copy(), logits.copy()
        up[index] += eps
        down[index] -= eps
        numeric[index] = (ref.ctc(up, labels, input_lengths, label_lengths) -
                          ref.ctc(down, labels, input_lengths, label_lengths)) / (2 * eps)
    np.testing.assert_allclose(z.grad.numpy(), numeric, atol=1e-7)
    assert np.all(z.grad.numpy()[1, 2:] == 0)  # frames past an input length get nothing


def test_bad_lengths_and_labels_fail_before_the_framework_sees_them():
    model = tbdzoo.build("probe/ctc", backend="torch", config="tiny", device="cpu")
    batch = model.synthetic_batch(seed=0)
    too_long = dict(batch, x_lengths=np.array([10, 3, 3], np.int32))
    with pytest.raises(BatchError, match=r"batch\['x_lengths'\]\[0\] = 10 is outside \[1, 9\], "
                                         r"the padded length of input 'x'"):
        model.loss_and_gradients(too_long)
    zero = dict(batch, x_lengths=np.array([9, 0, 3], np.int32))
    with pytest.raises(BatchError, match=r"batch\['x_lengths'\]\[1\] = 0 is outside"):
        model.predict(zero)
    graph_lengths = dict(batch, x_lengths=np.array([9, 3, 3], np.int32))
    model.spec.nodes["frame_lengths"].attrs["stride"] = 1  # 9 frames into a 5-step GRU
    with pytest.raises(BatchError, match=r"batch\['x_lengths'\]\[0\] = 9 gives length 9 \(lengths "
                                         r"'frame_lengths'\), outside \[1, 5\], the padded "
                                         r"length of the sequence node 'rnn' \(gru\) reads"):
        model.predict(graph_lengths)
    model.spec.nodes["frame_lengths"].attrs["stride"] = 2
    crowded = dict(batch, labels=np.array([[1, 1, 1]] * 3, np.int32),
                   labels_lengths=np.array([3, 3, 3], np.int32), x_lengths=np.array([9, 9, 4], np.int32))
    with pytest.raises(ValueError, match="example 2: 3 labels need 5 frames"):
        model.loss_and_gradients(crowded)
