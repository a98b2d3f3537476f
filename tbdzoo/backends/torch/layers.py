"""The spec's layer nodes as PyTorch layers.

torch.nn's own layer wherever its computation is the spec's: ``Conv2d``, ``Linear``,
``LayerNorm``, and ``BatchNorm1d`` / ``BatchNorm2d`` (subclasses that do not advance the step
counter, ``_Uncounted``). Where torch.nn has no layer with the spec's
semantics, a small ``nn.Module`` of the same shape named after the op (``Embedding`` with its
scale, ``MultiHeadAttention``, ``ChannelLayerNorm``, ``SequenceBatchNorm``,
``FrozenBatchNorm2d``, ``AdditiveAttention``, ``LSTM`` / ``GRU`` over lengths), whose forward is
the op's function in tbdzoo/backends/torch/ops.py.

Parameter names are PyTorch's where a torch.nn layer has them (BatchNorm's ``weight`` and
``bias`` for the spec's ``gamma`` and ``beta``): ``RENAMES`` maps the canonical suffixes.
"""
from collections import OrderedDict

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..common import pooling
from . import ops, recurrent

# canonical suffix -> the layer's attribute, where they differ
_NORM = {"gamma": "weight", "beta": "bias"}
RENAMES = {"batchnorm": _NORM, "layernorm": _NORM, "channel_layernorm": _NORM,
           "sequence_batchnorm": _NORM, "frozen_batchnorm": _NORM}


def attribute(op, suffix):
    """The attribute of a layer of ``op`` that holds the canonical parameter ``suffix``."""
    return RENAMES.get(op, {}).get(suffix, suffix)


class OpLayer(nn.Module):
    """A layer torch.nn lacks: the parameters under their canonical names (renamed by
    ``RENAMES``), the op's own function as forward."""

    op = None

    def __init__(self, attrs, params, tied=()):
        """``params``: {suffix: (tensor, trainable)} owned here; ``tied``: the suffixes of
        parameters owned by another layer (set by ``tie``)."""
        super().__init__()
        self.attrs = attrs
        self.suffixes = list(params) + list(tied)
        for suffix, (value, trainable) in params.items():
            if trainable:
                self.register_parameter(attribute(self.op, suffix), nn.Parameter(value))
            else:
                self.register_buffer(attribute(self.op, suffix), value)

    def forward(self, *inputs):
        p = {s: getattr(self, attribute(self.op, s)) for s in self.suffixes}
        return getattr(ops, self.op)(list(inputs), p, self.attrs, self.training)

    def extra_repr(self):
        return ", ".join("{}={}".format(k, v) for k, v in self.attrs.items()
                         if k not in ("shared", "init", "weight_init"))


class Embedding(nn.Embedding):
    """``nn.Embedding`` whose output is multiplied by ``scale`` (sqrt(d_model) in the
    Transformer)."""

    def __init__(self, num_embeddings, embedding_dim, scale=1.0):
        super().__init__(num_embeddings, embedding_dim)
        self.scale = scale

    def forward(self, tokens):
        out = super().forward(tokens)
        return out * self.scale if self.scale != 1.0 else out

    def extra_repr(self):
        return super().extra_repr() + (", scale={:g}".format(self.scale) if self.scale != 1.0 else "")


class PaddedConv2d(nn.Conv2d):
    """``nn.Conv2d`` after zero padding that differs top/bottom or left/right (TensorFlow's
    'SAME' on an even input), which ``nn.Conv2d``'s symmetric padding cannot express."""

    def __init__(self, *args, pads=((0, 0), (0, 0)), **kwargs):
        super().__init__(*args, padding=0, **kwargs)
        self.pads = pads

    def forward(self, x):
        return super().forward(ops._pad(x, self.pads))

    def extra_repr(self):
        return super().extra_repr() + ", pads={}".format(self.pads)


class _Uncounted:
    """torch.nn's BatchNorm without its step counter: ``num_batches_tracked`` stays in the
    state (torchvision's state_dicts load strictly) but is not advanced, since the spec's
    momentum is fixed and PyTorch reads the counter only when momentum is None. Counting cost
    one small kernel per BatchNorm and step: 53 in a ResNet-50 step, 0.3% of it on an H200."""

    def forward(self, x):
        self._check_input_dim(x)
        track = self.track_running_stats
        return F.batch_norm(x, self.running_mean if track else None,
                            self.running_var if track else None, self.weight, self.bias,
                            self.training or not track, self.momentum, self.eps)


class BatchNorm1d(_Uncounted, nn.BatchNorm1d):
    """``nn.BatchNorm1d`` (see ``_Uncounted``)."""


class BatchNorm2d(_Uncounted, nn.BatchNorm2d):
    """``nn.BatchNorm2d`` (see ``_Uncounted``)."""


def _op_class(op):
    name = "".join(w.capitalize() for w in op.split("_"))
    return type(name, (OpLayer,), {"op": op, "__module__": __name__})


class FrozenBatchNorm2d(OpLayer):
    """BatchNorm with fixed statistics and affine parameters, all buffers (torchvision's
    ``FrozenBatchNorm2d``: its state_dict keys, and a torchvision ResNet's
    ``num_batches_tracked`` is ignored on load)."""

    op = "frozen_batchnorm"

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        state_dict.pop(prefix + "num_batches_tracked", None)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class SequenceBatchNorm(OpLayer):
    """BatchNorm over the valid steps of a padded sequence batch: ``forward(x, lengths)``."""

    op = "sequence_batchnorm"


_CUSTOM = {"frozen_batchnorm": FrozenBatchNorm2d, "sequence_batchnorm": SequenceBatchNorm}
for _op in ("multi_head_attention", "channel_layernorm", "additive_attention"):
    _CUSTOM[_op] = _op_class(_op)


class _Recurrent(recurrent.RecurrentWeights):
    """An lstm/gru node: PyTorch's weight names (``weight_ih_l0``...), flat as cuDNN wants
    them, ``forward(x, lengths)`` over the valid steps (ops.lstm / ops.gru)."""

    def __init__(self, op, attrs, input_size, canonical):
        super().__init__(op, attrs, input_size, canonical)
        self.attrs = attrs

    def forward(self, x, lengths):
        return getattr(ops, self.op)([x, lengths], {"flat_weights": self.flat_weights},
                                     self.attrs, self.training)

    def extra_repr(self):
        return "{}, {}, num_layers={}, bidirectional={}".format(
            self.input_size, self.units, self.num_layers, self.bidirectional)


LSTM = type("LSTM", (_Recurrent,), {"__module__": __name__})
GRU = type("GRU", (_Recurrent,), {"__module__": __name__})


def make(graph, node, weights):
    """The layer of ``node``, holding its own parameters from ``weights`` (canonical name ->
    array); shared parameters are tied afterwards by the caller (``tie``)."""
    a = node.attrs
    shapes = [graph.shape_of(i) for i in node.inputs]
    names = graph.param_names(node)
    own = OrderedDict((s, full) for s, full in names.items() if full == node.name + "." + s)
    trainable = {n: p.trainable for n, p in graph.params().items()}

    def value(full):
        return torch.from_numpy(np.array(weights[full], np.float32))

    if node.op in ("lstm", "gru"):
        return (LSTM if node.op == "lstm" else GRU)(
            node.op, a, shapes[0][-1], {s: weights[full] for s, full in names.items()})
    if node.op == "conv2d":
        sym = pooling.symmetric(a["padding"])
        args = (shapes[0][0], a["filters"], a["kernel"], a["stride"])
        kw = dict(dilation=a["dilation"], groups=a["groups"], bias=a["use_bias"])
        layer = nn.Conv2d(*args, padding=sym, **kw) if sym is not None \
            else PaddedConv2d(*args, pads=a["padding"], **kw)
    elif node.op == "batchnorm":
        cls = BatchNorm2d if len(shapes[0]) == 3 else BatchNorm1d
        layer = cls(shapes[0][0], eps=a["eps"], momentum=a["momentum"],
                    track_running_stats=a["track_running_stats"])
    elif node.op == "dense":
        layer = nn.Linear(shapes[0][-1], a["units"], bias=a["use_bias"])
    elif node.op == "embedding":
        layer = Embedding(a["vocab"], a["dim"], scale=a["scale"])
    elif node.op == "layernorm":
        layer = nn.LayerNorm(shapes[0][-1], eps=a["eps"])
    else:
        cls = _CUSTOM.get(node.op) or _op_class(node.op)
        return cls(a, OrderedDict((s, (value(full), trainable[full])) for s, full in own.items()),
                   [s for s in names if s not in own])
    with torch.no_grad():
        for suffix in list(names):
            name = attribute(node.op, suffix)
            if suffix in own:
                getattr(layer, name).copy_(value(own[suffix]))
            else:
                delattr(layer, name)  # tied by ``tie`` to its owner's tensor
    return layer


def tie(graph, node, layer, locate):
    """Point ``layer``'s shared parameters at their owners' tensors (weight tying:
    ``generator.weight is embed.weight``); ``locate(canonical) -> (module, attribute)``."""
    for suffix, full in graph.param_names(node).items():
        if full != node.name + "." + suffix:
            module, name = locate(full)
            setattr(layer, attribute(node.op, suffix), getattr(module, name))
