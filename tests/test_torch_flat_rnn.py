"""The PyTorch backend holds each recurrent node's weights as nn.LSTM / nn.GRU do after
flatten_parameters(): leaf tensors in one flat buffer, read and written per gate at the boundary
(tbdzoo/backends/torch/recurrent.py, docs/backends.md). The per-gate tensors, their gradients
and the weights files are what they were when the per-gate tensors were concatenated on every
call; cuDNN's biases that the spec does not have stay exactly zero."""
import itertools

import numpy as np
import pytest

from conftest import random_weights, require_framework

require_framework("torch")

import torch
from torch import nn

import tbdzoo
from tbdzoo.backends.torch import ops
from tbdzoo.backends.torch.recurrent import RecurrentWeights
from tbdzoo.profiling import memory
from tbdzoo.spec import Graph

# seq2seq: stacked LSTMs; deepspeech2: bidirectional GRUs (b_hn inside cuDNN's bias_hh)
MODELS = ["seq2seq", "deepspeech2"]


def _holders(model):
    return [m for m in model.native.modules() if isinstance(m, RecurrentWeights)]


def _absent_rows(holder, param):
    """The entries of a bias_hh that are cuDNN's extra biases: LSTM all, GRU b_hr and b_hz."""
    return param[:4 * holder.units] if holder.op == "lstm" else param[:2 * holder.units]


@pytest.mark.parametrize("name", MODELS)
def test_recurrent_parameters_are_views_into_one_buffer_in_pytorchs_layout(name):
    model = tbdzoo.build(name, backend="torch", config="tiny", device="cpu")
    holders = _holders(model)
    assert holders
    for holder in holders:
        weights = holder.flat_weights
        assert all(w.is_leaf for w in weights)
        assert len({w.untyped_storage().data_ptr() for w in weights}) == 1
        for before, after in itertools.pairwise(weights):
            assert after.data_ptr() == before.data_ptr() + before.numel() * before.element_size()
        # PyTorch's own names and shapes: the state loads into the module a hand-written loop uses
        native = (nn.LSTM if holder.op == "lstm" else nn.GRU)(
            holder.input_size, holder.units, holder.num_layers, batch_first=True,
            bidirectional=holder.bidirectional)
        native.load_state_dict({n: p for n, p in holder.named_parameters() if "." not in n})


@pytest.mark.parametrize("name", MODELS)
def test_a_training_step_leaves_the_absent_biases_exactly_zero(name):
    model = tbdzoo.build(name, backend="torch", config="tiny", device="cpu")
    model.set_weights(random_weights(model))
    batch = model.prepare_batch(model.synthetic_batch())
    for _ in range(3):
        model.train_step(batch)
    for holder in _holders(model):
        for param in holder.absent_elements():
            assert torch.all(_absent_rows(holder, param) == 0)
            if holder.op == "lstm":  # no gradient at all: never in an optimizer
                assert not param.requires_grad
            else:  # the step's (clipped) gradient: zero there, so the global norm is the spec's
                assert torch.all(_absent_rows(holder, param.grad) == 0)
                assert torch.any(param.grad[2 * holder.units:] != 0)  # b_hn is trained
    trained = {id(p) for group in model._group_params.values() for p in group}
    absent = [p for h in _holders(model) for p in h.absent_elements() if h.op == "lstm"]
    assert not any(id(p) in trained for p in absent)


@pytest.mark.parametrize("op, attrs", [
    ("lstm", {"units": 3, "num_layers": 2, "bidirectional": True}),
    ("gru", {"units": 2, "num_layers": 2, "bidirectional": True, "merge": "sum"}),
])
def test_per_gate_gradients_equal_the_concatenated_path(op, attrs):
    """The flat parameters' gradients, cut into gates, are bit for bit those that reach the
    per-gate tensors when the kernel is fed their concatenation (the former path)."""
    g = Graph("g")
    g.input("x", (5, 4))
    g.input("x_lengths", (), "int32")
    g.add("rnn", op, ["x", "x_lengths"], **attrs)
    a, rng = g.nodes["rnn"].attrs, np.random.RandomState(0)
    canonical = {n[len("rnn."):]: rng.standard_normal(s.shape).astype(np.float32)
                 for n, s in g.params().items()}
    holder = RecurrentWeights(op, a, 4, canonical)
    per_gate = {k: torch.tensor(v, requires_grad=True) for k, v in canonical.items()}
    x = torch.tensor(rng.standard_normal((3, 5, 4)), dtype=torch.float32)
    lengths = torch.tensor([5, 2, 4])
    weight = torch.tensor(rng.standard_normal((3, 5, attrs["units"] * (1 if a["merge"] == "sum" else 2))),
                          dtype=torch.float32)
    flat_out = getattr(ops, op)([x, lengths], {"flat_weights": holder.flat_weights}, a, True)
    cat_out = getattr(ops, op)([x, lengths], per_gate, a, True)
    assert torch.equal(flat_out, cat_out)
    (flat_out * weight).sum().backward()
    (cat_out * weight).sum().backward()
    for suffix, tensor in per_gate.items():
        native, rows = holder.canonical_rows(suffix)
        assert torch.equal(getattr(holder, native).grad[rows], tensor.grad), suffix


@pytest.mark.parametrize("name", MODELS)
def test_weights_round_trip_per_gate_and_through_a_file(name, tmp_path):
    model = tbdzoo.build(name, backend="torch", config="tiny", device="cpu")
    weights = random_weights(model)
    model.set_weights(weights)
    got = model.get_weights()
    assert list(got) == list(model.spec.params())
    for n, value in weights.items():
        np.testing.assert_array_equal(got[n], value, err_msg=n)
    model.save_weights(str(tmp_path / "w.npz"))
    other = tbdzoo.build(name, backend="torch", config="tiny", device="cpu", seed=7)
    other.load_weights(str(tmp_path / "w.npz"))
    for n, value in other.get_weights().items():
        np.testing.assert_array_equal(value, weights[n], err_msg=n)
    for holder in _holders(other):  # written through views: still one buffer, extras still 0
        assert len({w.untyped_storage().data_ptr() for w in holder.flat_weights}) == 1
        assert all(torch.all(_absent_rows(holder, p) == 0) for p in holder.absent_elements())
    _, grads = model.loss_and_gradients(model.synthetic_batch())
    assert list(grads) == model.trainable_names()
    for n, g in grads.items():
        assert g.shape == weights[n].shape, n


@pytest.mark.parametrize("name", MODELS)
def test_memory_figures_count_the_spec_parameters_only(name):
    model = tbdzoo.build(name, backend="torch", config="tiny", device="cpu")
    measured = model.measure_memory(model.prepare_batch(model.synthetic_batch()))
    analytic = memory.analytic(model.spec, model.hparams, model.hparams["batch_size"], 0)
    for category in ("weights", "gradients", "optimizer_state"):
        assert measured[category] == analytic[category], category


def test_sequence_batchnorm_keeps_fp32_statistics_under_bf16_autocast():
    """Statistics and the running update in float32 over the valid steps only; the output in
    the input's dtype, as ``BatchNorm1d`` under autocast gives it."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, 5, generator=g).bfloat16()
    lengths = torch.tensor([7, 3, 5])
    p = {"gamma": torch.rand(5, generator=g), "beta": torch.rand(5, generator=g),
         "running_mean": torch.zeros(5), "running_var": torch.ones(5)}
    a = {"eps": 1e-5, "momentum": 0.1, "track_running_stats": True}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = ops.sequence_batchnorm([x, lengths], p, a, True)
    valid = torch.cat([x[0, :7], x[1, :3], x[2, :5]]).double()
    torch.testing.assert_close(p["running_mean"].double(), 0.1 * valid.mean(0), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(p["running_var"].double(), 0.9 + 0.1 * valid.var(0), rtol=1e-6, atol=1e-7)
    assert y.dtype == torch.bfloat16 and torch.all(y[1, 3:] == 0)
