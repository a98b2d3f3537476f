"""A recurrent node's parameters held as ``nn.LSTM`` / ``nn.GRU`` hold them after
``flatten_parameters()``: per layer and direction ``weight_ih`` (gates H, D_l), ``weight_hh``,
``bias_ih`` and ``bias_hh``, leaf parameters whose storage is one flat buffer (on a GPU laid out
by cuDNN itself), passed to the fused kernel as they are. cuDNN then neither compacts the
weights on every call nor routes their gradients through concatenations.

The canonical per-gate tensors (docs/spec.md, "Recurrent nodes") are row blocks of these
parameters, converted at the boundary (docs/backends.md). cuDNN's biases that the spec does not
have (LSTM's ``bias_hh``; GRU's b_hr and b_hz, the first two blocks of ``bias_hh``) stay exactly
zero: LSTM's ``bias_hh`` never requires a gradient, and GRU's ``bias_hh`` gradient is zeroed in
those blocks before it accumulates, so every optimizer, weight decay and clipping sees zeros.
"""
from collections import OrderedDict

import numpy as np
import torch
from torch import nn

# The canonical tensor in each H-row block of PyTorch's tensors; None: a bias cuDNN has and the
# spec does not (held at zero).
LAYOUT = {
    "lstm": OrderedDict([("weight_ih", ("w_i", "w_f", "w_g", "w_o")),
                         ("weight_hh", ("u_i", "u_f", "u_g", "u_o")),
                         ("bias_ih", ("b_i", "b_f", "b_g", "b_o")),
                         ("bias_hh", (None, None, None, None))]),
    "gru": OrderedDict([("weight_ih", ("w_r", "w_z", "w_n")),
                        ("weight_hh", ("u_r", "u_z", "u_n")),
                        ("bias_ih", ("b_r", "b_z", "b_in")),
                        ("bias_hh", (None, None, "b_hn"))]),
}
_CUDNN_MODE = {"lstm": "LSTM", "gru": "GRU"}


def directions(attrs):
    return ("fw", "bw") if attrs["bidirectional"] else ("fw",)


def native_name(kind, layer, direction):
    """PyTorch's own name: weight_ih_l0, bias_hh_l1_reverse."""
    return "{}_l{}{}".format(kind, layer, "_reverse" if direction == "bw" else "")


class _ZeroRows:
    """Gradient hook: the first ``rows`` entries (the absent biases) are zero."""

    def __init__(self, rows):
        self.rows = rows

    def __call__(self, grad):
        return torch.cat((grad.new_zeros(self.rows), grad[self.rows:]))


class RecurrentWeights(nn.Module):
    """One lstm/gru node's parameters in PyTorch's layout, flat; ``flat_weights`` is the list
    ``torch._VF.lstm`` / ``gru`` take (layer-major, forward before backward)."""

    def __init__(self, op, attrs, input_size, canonical):
        """``canonical``: {suffix (l0.fw.w_i): float32 array} of the node's spec parameters."""
        super().__init__()
        self.op, self.input_size, self.units = op, input_size, attrs["units"]
        self.num_layers, self.bidirectional = attrs["num_layers"], attrs["bidirectional"]
        self.names, self.blocks = [], OrderedDict()  # blocks: suffix -> (native name, rows)
        h = self.units
        for layer in range(self.num_layers):
            for d in directions(attrs):
                q = "l{}.{}.".format(layer, d)
                for kind, parts in LAYOUT[op].items():
                    name = native_name(kind, layer, d)
                    values = []
                    for k, part in enumerate(parts):
                        if part is None:
                            values.append(np.zeros((h,), np.float32))
                        else:
                            values.append(np.asarray(canonical[q + part], np.float32))
                            self.blocks[q + part] = (name, slice(k * h, (k + 1) * h))
                    absent = sum(1 for part in parts if part is None)
                    param = nn.Parameter(torch.from_numpy(np.concatenate(values)),
                                         requires_grad=absent < len(parts))
                    if 0 < absent < len(parts):  # GRU's bias_hh: b_hr, b_hz absent, b_hn trained
                        param.register_hook(_ZeroRows(absent * h))
                    self.register_parameter(name, param)
                    self.names.append(name)
        self.flatten()

    @property
    def flat_weights(self):
        return [getattr(self, n) for n in self.names]

    def canonical_rows(self, suffix):
        """(PyTorch tensor name, its rows that are the canonical tensor ``suffix``)."""
        return self.blocks[suffix]

    def absent_elements(self):
        """{parameter: elements of it that are cuDNN's extra zero biases}."""
        h = self.units
        return OrderedDict((getattr(self, native_name("bias_hh", layer, d)),
                            h * sum(1 for part in LAYOUT[self.op]["bias_hh"] if part is None))
                           for layer in range(self.num_layers)
                           for d in (("fw", "bw") if self.bidirectional else ("fw",)))

    @torch.no_grad()
    def flatten(self):
        """Every parameter a view into one buffer: cuDNN's own layout on a GPU (what
        ``nn.RNNBase.flatten_parameters`` does), on the CPU the parameters back to back."""
        weights = self.flat_weights
        first = weights[0]
        if first.is_cuda and torch.backends.cudnn.is_acceptable(first) \
                and torch._use_cudnn_rnn_flatten_weight():
            from torch.backends.cudnn import rnn as cudnn_rnn
            with torch.cuda.device_of(first):
                torch._cudnn_rnn_flatten_weight(
                    weights, 4, self.input_size, cudnn_rnn.get_cudnn_mode(_CUDNN_MODE[self.op]),
                    self.units, 0, self.num_layers, True, self.bidirectional)
            return
        flat = torch.empty(sum(w.numel() for w in weights), dtype=first.dtype, device=first.device)
        offset = 0
        for w in weights:
            n = w.numel()
            flat[offset:offset + n].copy_(w.reshape(-1))
            w.set_(flat.untyped_storage(), offset, w.shape, _contiguous_strides(w.shape))
            offset += n

    def _apply(self, fn, *args, **kwargs):
        """.to() / .cuda() replace each parameter's storage: lay them out flat again after."""
        out = super()._apply(fn, *args, **kwargs)
        self.flatten()
        return out


def _contiguous_strides(shape):
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))
