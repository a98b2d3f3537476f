"""PyTorch source of a model: ``torch.nn`` layers in one class per block kind.

Writes text only (PyTorch is not imported here): tbdzoo/export/ plans the classes, this module
says what each layer and op is in PyTorch. The formulas follow this backend's ops.py, so the
written model computes what the backend computes: symmetric padding in the layer, other
padding (and max-pool padding wider than half the window) applied before it, -1e9 on masked
attention logits, BatchNorm with PyTorch's momentum convention (the spec's).
"""
from collections import OrderedDict

from ...errors import UnsupportedOpError
from ...export.code import (
    Lines,
    add_build,
    add_forward,
    add_members,
    add_texts,
    add_title,
    arguments,
    class_doc,
    is_lit,
    layer_padding,
    lit,
    literal,
    member_expr,
    member_ref,
    pair,
    params_in_call_order,
    root_doc,
    scaled_call,
    symmetric,
    used_names,
    value,
)
from ...export.plan import Slot, attribute_slots, renamed_slots

FRAMEWORK = "PyTorch"
EXTENSION = ".py"

_TYPES = {"conv2d": "nn.Conv2d", "dense": "nn.Linear", "embedding": "nn.Embedding",
          "layernorm": "nn.LayerNorm", "multi_head_attention": "MultiheadAttention",
          "channel_layernorm": "ChannelLayerNorm", "lstm": "LSTM", "gru": "GRU",
          "additive_attention": "AdditiveAttention", "sequence_batchnorm": "SequenceBatchNorm",
          "frozen_batchnorm": "FrozenBatchNorm2d"}

# Where a layer's own parameter is kept, by the spec's suffix (for tied parameters).
_NATIVE_PARAM = {"batchnorm": {"gamma": "weight", "beta": "bias"},
                 "layernorm": {"gamma": "weight", "beta": "bias"},
                 "frozen_batchnorm": {"gamma": "weight", "beta": "bias"}}


def layer_type(graph, node):
    if node.op == "batchnorm":
        return "nn.BatchNorm2d" if len(graph.shape_of(node.inputs[0])) == 3 else "nn.BatchNorm1d"
    if node.op not in _TYPES:
        raise UnsupportedOpError("the PyTorch source writer has no layer for op {!r} ({})".format(
            node.op, node.name))
    return _TYPES[node.op]


# The constructors' arguments, by the spec's names (tbdzoo/export/plan.py: spec_slots)
_SLOT_NAMES = {
    "conv2d": "in_channels out_channels=filters kernel_size=kernel stride padding dilation "
              "groups bias=use_bias",
    "batchnorm": "num_features=channels eps momentum track_running_stats",
    "sequence_batchnorm": "num_features=channels eps momentum track_running_stats",
    "frozen_batchnorm": "num_features=channels eps",
    "dense": "in_features out_features=units bias=use_bias",
    "embedding": "num_embeddings=vocab embedding_dim=dim scale",
    "layernorm": "normalized_shape=channels eps",
    "multi_head_attention": "embed_dim=d_model num_heads dropout causal pad_id",
    "channel_layernorm": "num_channels=channels eps"}
_CONVERT = {"kernel": pair, "stride": pair, "dilation": pair,
            "padding": layer_padding}


def layer_slots(graph, node):
    """The constructor's values of the layer computing ``node``."""
    layer_type(graph, node)
    s = renamed_slots(graph, node, _SLOT_NAMES, _CONVERT)
    if node.op == "conv2d" and symmetric(node.attrs["padding"]) is None:
        (t, b), (left, r) = node.attrs["padding"]
        s["pad"] = Slot((left, r, t, b), "pad", call=True)
    return s


def op_slots(graph, node):
    """The attributes an op's code reads (each may differ between instances of a class)."""
    return attribute_slots(node)


# -- layers -----------------------------------------------------------------------------------
_DEFAULTS = {"stride": 1, "padding": 0, "dilation": 1, "groups": 1, "bias": True, "eps": 1e-5,
             "momentum": 0.1, "track_running_stats": True, "num_layers": 1,
             "bidirectional": False, "merge": "concat", "dropout": 0.0, "causal": False,
             "pad_id": 0}
_POSITIONAL = {"conv2d": 3, "dense": 2, "embedding": 2, "batchnorm": 1, "sequence_batchnorm": 1,
               "frozen_batchnorm": 1, "layernorm": 1, "multi_head_attention": 2,
               "channel_layernorm": 1, "lstm": 2, "gru": 2, "additive_attention": 3}


def _constructor(member):
    """``nn.Conv2d(8, 16, 3, stride=2, bias=False)``: keywords left out at their defaults."""
    values = [(k, v) for k, v in member.values.items() if k not in ("pad", "scale")]
    parts = arguments(values, _POSITIONAL[member.op], _DEFAULTS)
    return "{}({})".format(member.type, ", ".join(parts))


def _layer_call(cls, member, ins):
    ref = member_ref(cls, member.path)
    op = member.op
    if op == "conv2d" and "pad" in member.values:
        pad = member.values["pad"]
        return "{}(F.pad({}, {}))".format(ref, ins[0], value(pad, True))
    if op == "embedding":
        return scaled_call(ref, ins[0], member.values["scale"])
    return "{}({})".format(ref, ", ".join(ins))


def _member_expr(member, depth=0):
    """The expression building ``member``."""
    return member_expr(member, _constructor, "nn.Sequential(", ")", "*({} for _ in range({}))", depth)


# -- ops --------------------------------------------------------------------------------------
def _op(step, helpers):
    """The expression computing an op step (adding any helper it needs to ``helpers``)."""
    op, v, ins = step.op, step.values, step.ins

    def val(name):
        return value(v[name], True)

    def all_lit(*names):
        return all(is_lit(v[n]) for n in names)
    x = ins[0] if ins else None
    if op == "relu":
        return "F.relu({})".format(x)
    if op == "add":
        return " + ".join(ins)
    if op in ("maxpool2d", "avgpool2d"):
        if all_lit("kernel", "stride", "padding") and op == "maxpool2d" and \
                not _explicit(lit(v["padding"]), lit(v["kernel"])):
            pad = symmetric(lit(v["padding"]))
            args = [x, literal(pair(lit(v["kernel"]))), literal(pair(lit(v["stride"])))]
            if pad != (0, 0):
                args.append(literal(pair(pad)))
            return "F.max_pool2d({})".format(", ".join(args))
        if all_lit("kernel", "stride", "padding") and op == "avgpool2d" and \
                not _explicit(lit(v["padding"]), lit(v["kernel"])):
            pad = symmetric(lit(v["padding"]))
            args = [x, literal(pair(lit(v["kernel"]))), literal(pair(lit(v["stride"])))]
            if pad != (0, 0):
                args.append(literal(pair(pad)))
                if not is_lit(v["count_include_pad"]) or not lit(v["count_include_pad"]):
                    args.append("count_include_pad=" + val("count_include_pad"))
            return "F.avg_pool2d({})".format(", ".join(args))
        helpers.add("pool2d")
        if op == "maxpool2d":
            return "max_pool2d({}, {}, {}, {})".format(x, val("kernel"), val("stride"),
                                                      val("padding"))
        return "avg_pool2d({}, {}, {}, {}, {})".format(x, val("kernel"), val("stride"),
                                                      val("padding"), val("count_include_pad"))
    if op == "global_avgpool":
        return "{}.mean(dim=(2, 3))".format(x)
    if op == "flatten":
        return "torch.flatten({}, 1)".format(x)
    if op == "positional_encoding":
        helpers.add("positional_encoding")
        return "positional_encoding({})".format(x)
    if op == "dropout":
        return "F.dropout({}, {}, self.training)".format(x, val("rate"))
    if op == "concat":
        axis = str(lit(v["axis"]) + 1) if is_lit(v["axis"]) else val("axis") + " + 1"
        return "torch.cat([{}], dim={})".format(", ".join(ins), axis)
    if op == "tanh":
        return "torch.tanh({})".format(x)
    if op == "upsample_nearest":
        return "F.interpolate({}, scale_factor={}, mode=\"nearest\")".format(x, val("factor"))
    if op == "reshape":
        if is_lit(v["shape"]):
            return "{}.reshape({}.shape[0], {})".format(
                x, x, ", ".join(str(d) for d in lit(v["shape"])))
        return "{}.reshape(({}.shape[0],) + tuple({}))".format(x, x, val("shape"))
    if op == "scale":
        return "{} * {}".format(x, val("factor"))
    if op == "stop_gradient":
        return "{}.detach()".format(x)
    if op == "ones_like":
        return "torch.ones_like({})".format(x)
    if op == "lerp":
        return "{2}.reshape(-1, *[1] * ({0}.dim() - 1)) * {0} + (1 - {2}.reshape(-1, *[1] * ({0}.dim() - 1))) * {1}".format(*ins)  # noqa: E501
    if op == "clipped_relu":
        return "F.hardtanh({}, 0.0, {})".format(x, val("ceiling"))
    if op == "transpose":
        if is_lit(v["perm"]):
            return "{}.permute(0, {})".format(x, ", ".join(str(i + 1) for i in lit(v["perm"])))
        return "{}.permute(0, *[i + 1 for i in {}])".format(x, val("perm"))
    if op == "lengths_after_conv":
        helpers.add("conv_lengths")
        return "conv_lengths({}, {}, {}, {}, {})".format(x, val("kernel"), val("stride"),
                                                        val("padding"), val("dilation"))
    if op == "roi_align":
        helpers.add("roi_align")
        return "roi_align({}, {}, {}, {}, {})".format(ins[0], ins[1], ins[2],
                                                     val("output_size"), val("sampling_ratio"))
    if op == "to_batch":
        return "{}.flatten(0, 1)".format(x)
    raise UnsupportedOpError("the PyTorch source writer has no code for op {!r} ({})".format(
        op, step.node.name if step.node is not None else step.path))


def _explicit(padding, kernel):
    sym = symmetric(padding)
    kernel = (kernel, kernel) if isinstance(kernel, int) else tuple(kernel)
    return sym is None or 2 * max(sym) > min(kernel)


# -- helpers written into the file, as needed ----------------------------------------------------
_HELPERS = OrderedDict()
_HELPERS["pool2d"] = '''
def _pad(x, padding, fill=0.0):
    """Pads ((top, bottom), (left, right)) around the last two axes."""
    (top, bottom), (left, right) = padding
    return F.pad(x, (left, right, top, bottom), value=fill)


def max_pool2d(x, kernel, stride, padding):
    """Max-pooling where padded cells never win."""
    return F.max_pool2d(_pad(x, padding, -math.inf), kernel, stride)


def avg_pool2d(x, kernel, stride, padding, count_include_pad):
    """Average pooling with any padding; without count_include_pad each window divides by
    its cells inside the input."""
    summed = F.avg_pool2d(_pad(x, padding), kernel, stride)
    if count_include_pad:
        return summed
    ones = _pad(torch.ones_like(x[:1, :1]), padding)
    return summed / F.avg_pool2d(ones, kernel, stride)
'''
_HELPERS["positional_encoding"] = '''
def positional_encoding(x):
    """Adds the sinusoid table: PE[p, 2i] = sin(p / 10000^(2i/D)), PE[p, 2i+1] = cos(...)."""
    length, dim = x.shape[1], x.shape[2]
    position = torch.arange(length, dtype=torch.float64, device=x.device)[:, None]
    rate = torch.pow(10000.0, -torch.arange(0, dim, 2, dtype=torch.float64, device=x.device) / dim)
    table = torch.zeros(length, dim, dtype=torch.float64, device=x.device)
    table[:, 0::2] = torch.sin(position * rate)
    table[:, 1::2] = torch.cos(position * rate[: dim // 2])
    return x + table.float().to(x.dtype)
'''
_HELPERS["conv_lengths"] = '''
def conv_lengths(lengths, kernel, stride, padding, dilation):
    """Valid lengths after a convolution along time, at least 1."""
    before, after = padding
    return ((lengths + (before + after - dilation * (kernel - 1) - 1)) // stride + 1).clamp(min=1)
'''
_HELPERS["roi_align"] = '''
def roi_align(features, indices, weights, output_size, sampling_ratio):
    """RoIAlign from precomputed taps: indices and weights (N, R, S, 4), S = oh * ow * sr * sr
    samples per RoI, each the bilinear mix of four feature cells; each bin averages its sr * sr
    samples. One sparse mixing matrix times the batch's feature rows; (N, R, C, oh, ow)."""
    n, c, h, w = features.shape
    rois = indices.shape[1]
    (oh, ow), sr = output_size, sampling_ratio
    rows = features.float().permute(0, 2, 3, 1).reshape(n * h * w, c)
    bins = n * rois * oh * ow
    columns = indices.long() + torch.arange(n, device=features.device).view(n, 1, 1, 1) * (h * w)
    targets = torch.arange(bins, device=features.device).view(bins, 1).expand(bins, sr * sr * 4)
    mixing = torch.sparse_coo_tensor(
        torch.stack([targets.reshape(-1), columns.reshape(-1)]),
        weights.float().reshape(-1) / float(sr * sr), (bins, n * h * w))
    out = torch.sparse.mm(mixing, rows).view(n, rois, oh, ow, c)
    return out.permute(0, 1, 4, 2, 3).to(features.dtype)
'''
_LAYER_HELPERS = OrderedDict()
_LAYER_HELPERS["MultiheadAttention"] = '''
class MultiheadAttention(nn.MultiheadAttention):
    """nn.MultiheadAttention on batch-first (N, T, D) values; keys whose token is pad_id, and
    with causal=True the keys after each query, are masked with -1e9 before the softmax."""

    def __init__(self, embed_dim, num_heads, dropout=0.0, causal=False, pad_id=0):
        super().__init__(embed_dim, num_heads, dropout=dropout, batch_first=True)
        self.causal, self.pad_id = causal, pad_id

    def forward(self, query, source, tokens):
        n, t, s = query.shape[0], query.shape[1], source.shape[1]
        mask = torch.zeros(n, 1, 1, s, dtype=query.dtype, device=query.device)
        mask = mask.masked_fill((tokens == self.pad_id)[:, None, None, :], -1e9)
        if self.causal:
            later = torch.ones(t, s, dtype=torch.bool, device=query.device).triu(1)
            mask = mask.masked_fill(later, -1e9)
        mask = mask.expand(n, self.num_heads, t, s).reshape(n * self.num_heads, t, s)
        return super().forward(query, source, source, attn_mask=mask, need_weights=False)[0]
'''
_LAYER_HELPERS["ChannelLayerNorm"] = '''
class ChannelLayerNorm(nn.Module):
    """Normalises each example over (C, H, W) with one mean and (biased) variance, then
    scales and shifts per channel."""

    def __init__(self, num_channels, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(num_channels))
        self.beta = nn.Parameter(torch.zeros(num_channels))

    def forward(self, x):
        y = F.layer_norm(x, x.shape[1:], eps=self.eps)
        return y * self.gamma[:, None, None] + self.beta[:, None, None]
'''
_RECURRENT = '''
class {name}(nn.{name}):
    """nn.{name} over a padded batch-first (N, T, D) batch with each example's length: the
    valid steps run packed, outputs past a length are 0; merge='sum' adds the directions."""

    def __init__(self, input_size, hidden_size, num_layers=1, bidirectional=False,
                 merge="concat"):
        super().__init__(input_size, hidden_size, num_layers=num_layers, batch_first=True,
                         bidirectional=bidirectional)
        self.merge = merge

    def forward(self, x, lengths):
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True,
                                                   enforce_sorted=False)
        out = super().forward(packed)[0]
        out = nn.utils.rnn.pad_packed_sequence(out, batch_first=True,
                                               total_length=x.shape[1])[0]
        if self.merge == "sum":
            out = out[..., :self.hidden_size] + out[..., self.hidden_size:]
        return out
'''
_LAYER_HELPERS["LSTM"] = _RECURRENT.format(name="LSTM")
_LAYER_HELPERS["GRU"] = _RECURRENT.format(name="GRU")
_LAYER_HELPERS["AdditiveAttention"] = '''
class AdditiveAttention(nn.Module):
    """Bahdanau attention without biases: e[t, s] = v . tanh(W_q q_t + W_m m_s), -1e9 past
    each memory's length, softmax over s; returns sum_s alpha[t, s] m_s."""

    def __init__(self, query_size, memory_size, units):
        super().__init__()
        self.w_query = nn.Parameter(torch.zeros(units, query_size))
        self.w_memory = nn.Parameter(torch.zeros(units, memory_size))
        self.v = nn.Parameter(torch.zeros(units))

    def forward(self, query, memory, lengths):
        keys = F.linear(memory, self.w_memory)
        queries = F.linear(query, self.w_query)
        scores = torch.matmul(torch.tanh(queries[:, :, None, :] + keys[:, None, :, :]), self.v)
        padded = torch.arange(memory.shape[1], device=memory.device)[None, None, :] >= \\
            lengths[:, None, None]
        weights = torch.softmax(scores.masked_fill(padded, -1e9), dim=-1)
        return torch.bmm(weights, memory)
'''
_LAYER_HELPERS["SequenceBatchNorm"] = '''
class SequenceBatchNorm(nn.BatchNorm1d):
    """BatchNorm of the features of (N, T, D) over the valid steps only (statistics from them
    in training); padded steps give 0."""

    def forward(self, x, lengths):
        valid = torch.arange(x.shape[1], device=x.device)[None, :] < lengths[:, None]
        out = x.new_zeros(x.shape)
        out[valid] = super().forward(x[valid])
        return out
'''
_LAYER_HELPERS["FrozenBatchNorm2d"] = '''
class FrozenBatchNorm2d(nn.Module):
    """BatchNorm with fixed statistics and affine parameters (buffers), the same in training
    and inference: x * scale + shift, scale = weight / sqrt(running_var + eps)."""

    def __init__(self, num_features, eps=1e-5):
        super().__init__()
        self.eps = eps
        for name, fill in (("weight", 1.0), ("bias", 0.0), ("running_mean", 0.0),
                           ("running_var", 1.0)):
            self.register_buffer(name, torch.full((num_features,), fill))

    def forward(self, x):
        scale = self.weight * torch.rsqrt(self.running_var + self.eps)
        shift = self.bias - self.running_mean * scale
        return torch.addcmul(shift.view(1, -1, 1, 1), x, scale.view(1, -1, 1, 1))
'''

_LOAD = '''
def _canonical(module):
    """Each parameter and buffer of ``module`` (its own name) -> the canonical names, relative
    to the module's path, it is made of (an int: that many zeros)."""
    if isinstance(module, (nn.LSTM, nn.GRU)):
        lstm = isinstance(module, nn.LSTM)
        gates = ("i", "f", "g", "o") if lstm else ("r", "z", "n")
        h, out = module.hidden_size, {}
        for layer in range(module.num_layers):
            for d in range(2 if module.bidirectional else 1):
                q, end = "l{}.{}.".format(layer, ("fw", "bw")[d]), \\
                    "_l{}{}".format(layer, ("", "_reverse")[d])
                out["weight_ih" + end] = [q + "w_" + g for g in gates]
                out["weight_hh" + end] = [q + "u_" + g for g in gates]
                if lstm:
                    out["bias_ih" + end] = [q + "b_" + g for g in gates]
                    out["bias_hh" + end] = [4 * h]
                else:
                    out["bias_ih" + end] = [q + "b_r", q + "b_z", q + "b_in"]
                    out["bias_hh" + end] = [2 * h, q + "b_hn"]
        return out
    if isinstance(module, nn.MultiheadAttention):
        return {"in_proj_weight": ["W_q", "W_k", "W_v"], "in_proj_bias": ["b_q", "b_k", "b_v"],
                "out_proj.weight": ["W_o"], "out_proj.bias": ["b_o"]}
    renamed = {"weight": "gamma", "bias": "beta"} if isinstance(module, NORMS) else {}
    own = [n for n, _ in module.named_parameters(recurse=False)] + \\
        [n for n, _ in module.named_buffers(recurse=False) if n != "num_batches_tracked"]
    return {n: [renamed.get(n, n)] for n in own}


def load(model, path):
    """Loads tbdzoo's canonical weights file (.npz) into ``model``: every tensor of the file
    into its place, or ValueError naming what does not match."""
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files if k != "__manifest__"}
    tensors = dict(model.named_parameters())
    tensors.update(model.named_buffers())
    loaded, used = set(), set()
    with torch.no_grad():
        for prefix, module in model.named_modules():
            at = prefix + "." if prefix else ""
            for native, parts in _canonical(module).items():
                tensor = tensors.get(at + native)
                names = [at + p for p in parts if not isinstance(p, int)]
                if tensor is None or id(tensor) in loaded or not all(n in arrays for n in names):
                    continue
                value = np.concatenate([np.zeros(p, np.float32) if isinstance(p, int)
                                        else arrays[at + p].reshape(-1) for p in parts])
                tensor.copy_(torch.from_numpy(value).reshape(tensor.shape))
                loaded.add(id(tensor))
                used.update(names)
    missing = [n for n, t in tensors.items()
               if id(t) not in loaded and not n.endswith("num_batches_tracked")]
    unused = sorted(set(arrays) - used)
    if missing or unused:
        raise ValueError("{} does not fit this model: nothing in the file for {}; not in the "
                         "model: {}".format(path, missing or "-", unused or "-"))
    return model
'''


def _write_class(cls, lines, plan):
    base = "nn.ModuleList" if cls.base == "list" else "nn.Module"
    lines.add("class {}({}):".format(cls.name, base)).indent()
    doc = class_doc(cls, plan, _root_doc)
    lines.add('"""' + doc + '"""').add()
    params = params_in_call_order(cls)
    sig = ", ".join(["self"] + [p.name for p in params])
    lines.add("def __init__({}):".format(sig)).indent()
    lines.add("super().__init__()")
    for p in params:
        if p.call:
            lines.add("self.{0} = {0}".format(p.name))
    add_members(cls, lines, _member_expr, "self.append({})")
    for layer, suffix, owner, owner_suffix in cls.ties:
        lines.add("{}.{} = {}.{}  # shared".format(
            member_ref(cls, layer), _native_param(plan.graph, layer, suffix),
            member_ref(cls, owner), _native_param(plan.graph, owner, owner_suffix)))
    lines.dedent().add()
    lines.add("def forward({}):".format(", ".join(["self"] + cls.inputs))).indent()
    add_forward(cls, lines, lambda step: _op(step, set()), _layer_call)
    lines.dedent().dedent().add().add()


def _native_param(graph, layer, suffix):
    return _NATIVE_PARAM.get(graph.nodes[layer].op, {}).get(suffix, suffix)


def _root_doc(cls, plan):
    return root_doc(cls, plan, "forward", lambda dtype: "int64" if dtype == "int32" else dtype)


def write(plan, model_name, config, version):
    """The whole source file of ``plan``."""
    used_types, helpers = used_names(plan, _op)
    lines = Lines()
    root = plan.root
    add_title(lines, "PyTorch", model_name, version, config, root)
    lines.add("    model.eval()")
    lines.add("    out = model({})".format(", ".join(root.inputs)))
    lines.add("")
    lines.add("Parameters are named as tbdzoo names them (``layer1.0.conv1.weight``); BatchNorm's")
    lines.add("gamma and beta are PyTorch's weight and bias. Needs only PyTorch and NumPy.")
    lines.add('"""')
    lines.add("import math  # noqa: F401").add()
    lines.add("import numpy as np")
    lines.add("import torch")
    lines.add("from torch import nn")
    lines.add("from torch.nn import functional as F").add()
    lines.add("INPUTS = {}".format(literal(tuple(root.inputs))))
    lines.add()
    add_texts(lines, _HELPERS, helpers)
    add_texts(lines, _LAYER_HELPERS, used_types)
    norms = ["nn.modules.batchnorm._BatchNorm", "nn.LayerNorm"] + \
        (["FrozenBatchNorm2d"] if "FrozenBatchNorm2d" in used_types else [])
    lines.add("# Layers whose weight and bias are the spec's gamma and beta.")
    lines.add("NORMS = ({})".format(", ".join(norms))).add().add()
    for cls in plan.classes:
        _write_class(cls, lines, plan)
    add_build(lines, root, _LOAD)
    return lines.text()
