"""CNTK source of a model: one layer-factory function per block kind, as ``cntk.layers`` writes
its layers.

Writes text only (CNTK is not imported here, and this module runs in the main interpreter):
tbdzoo/export/ plans the kinds, this module says what each layer and op is in CNTK, with the
formulas of this backend's ops.py, so the written model computes what the backend's does.
Like ``cntk.layers.Dense``, a block kind is a function that creates its parameters and returns
a callable; calling it on CNTK variables adds its graph as one CNTK block function (op name
the kind, name its path), as the backend's model is built (blocks.py). Parameters keep
tbdzoo's names and layouts (``layer1.0.conv1.weight``, dense weights (out, in)), so the
canonical ``.npz`` loads without conversion. The written file is valid Python 3.6 and imports
only CNTK and NumPy. The recurrent layers are CNTK recurrences over each example's valid
steps, as ops.py runs them; RoIAlign gathers from the batch's feature rows, its indices
offset per example by the file's ``prepare``, as this backend's model prepares a batch. An op
or layer not written here is refused, naming it.
"""
from collections import OrderedDict

from ...errors import UnsupportedOpError
from ...export.code import (
    Lines,
    add_build,
    add_forward,
    add_texts,
    add_title,
    arguments,
    class_doc,
    is_lit,
    lit,
    literal,
    member_ref,
    members_in_order,
    params_in_call_order,
    used_names,
    value,
)
from ...export.plan import Slot, attribute_slots, renamed_slots

FRAMEWORK = "CNTK"
EXTENSION = ".py"

_TYPES = {"conv2d": "Convolution2D", "dense": "Dense", "embedding": "Embedding",
          "layernorm": "LayerNormalization", "batchnorm": "BatchNormalization",
          "multi_head_attention": "MultiHeadAttention", "channel_layernorm": "ChannelLayerNorm",
          "lstm": "LSTM", "gru": "GRU", "additive_attention": "AdditiveAttention",
          "sequence_batchnorm": "SequenceBatchNorm", "frozen_batchnorm": "FrozenBatchNorm"}
_OPS = ("relu", "add", "maxpool2d", "avgpool2d", "global_avgpool", "flatten", "concat",
        "dropout", "positional_encoding", "tanh", "upsample_nearest", "reshape", "scale",
        "transpose", "stop_gradient", "ones_like", "clipped_relu", "lengths_after_conv",
        "roi_align", "to_batch")


def _refuse(op, where):
    raise UnsupportedOpError("the CNTK source writer does not write op {!r} ({}) yet; export "
                             "this model to PyTorch".format(op, where))


def layer_type(graph, node):
    if node.op == "batchnorm" and not node.attrs["track_running_stats"]:
        return "BatchStatisticsNorm"
    if node.op not in _TYPES:
        _refuse(node.op, node.name)
    return _TYPES[node.op]


# The constructors' arguments, by the spec's names (tbdzoo/export/plan.py: spec_slots)
_SLOT_NAMES = {
    "conv2d": "in_channels out_channels=filters kernel_size=kernel stride padding dilation "
              "groups bias=use_bias",
    "batchnorm": "channels eps",
    "sequence_batchnorm": "channels eps",
    "dense": "in_features out_features=units bias=use_bias",
    "layernorm": "features=channels eps"}
_CONVERT = {"kernel": tuple, "stride": tuple, "dilation": tuple,
            "padding": lambda pads: tuple(tuple(p) for p in pads)}


def layer_slots(graph, node):
    layer_type(graph, node)
    s = renamed_slots(graph, node, _SLOT_NAMES, _CONVERT)
    if node.op == "batchnorm" and node.attrs["track_running_stats"]:
        s["exact"] = Slot(graph.program is not None, "exact")
    if node.op == "embedding":   # Embedding's own argument, not read by the call
        s["scale"].call = False
    return s


def op_slots(graph, node):
    if node.op not in _OPS:
        _refuse(node.op, node.name)
    return attribute_slots(node)


# -- layers -----------------------------------------------------------------------------------
_DEFAULTS = {"stride": (1, 1), "padding": ((0, 0), (0, 0)), "dilation": (1, 1), "groups": 1,
             "bias": True, "eps": 1e-5, "exact": False, "scale": 1.0, "dropout": 0.0,
             "causal": False, "pad_id": 0, "num_layers": 1, "bidirectional": False,
             "merge": "concat"}
_POSITIONAL = {"Convolution2D": 3, "Dense": 2, "Embedding": 2, "BatchNormalization": 1,
               "BatchStatisticsNorm": 1, "LayerNormalization": 1, "MultiHeadAttention": 2,
               "ChannelLayerNorm": 1, "LSTM": 2, "GRU": 2, "AdditiveAttention": 3,
               "SequenceBatchNorm": 1, "FrozenBatchNorm": 1}


def _name_expr(path, index=None):
    """The name of the member at ``path`` below the block being built (``name``)."""
    if index is None:
        return "join(name, \"{}\")".format(path)
    return "join(name, \"{}.%d\" % {})".format(path, index)


def _constructor(member, shared=None, index=None):
    """``Convolution2D(join(name, "conv1"), 8, 16, (3, 3), stride=(2, 2))``; keywords left
    out at their defaults; ``shared``: {parameter: expression} of tied parameters."""
    parts = [_name_expr(member.path, index)]
    parts += arguments(list(member.values.items()), _POSITIONAL[member.type], _DEFAULTS)
    for k, expr in sorted((shared or {}).items()):
        parts.append("{}={}".format(k, expr))
    return "{}({})".format(member.type, ", ".join(parts))


def _item_text(member, index):
    if member.kind == "layer":
        return _constructor(member, index=index)
    if member.kind == "block":
        args = [value(member.values[p.name]) if p.family in ("channels", "vocab") else
                "{}={}".format(p.name, value(member.values[p.name]))
                for p in params_in_call_order(member.cls)]
        return "{}({})".format(member.cls.name, ", ".join([_name_expr(member.path, index)] + args))
    raise UnsupportedOpError("the CNTK source writer does not nest sequences ({})".format(
        member.path))


def _member_expr(member, depth=0):
    """The expression building ``member``; a sequence's runs of equal items (but for their
    index) written once, as a comprehension over the index."""
    if member.kind != "seq":
        return _item_text(member, None)
    pad = "    " * (depth + 1)
    runs = []   # [template text, first index, count]
    seq_path = member.path
    for i, item in enumerate(member.items):
        template = _item_text(_Renamed(item, seq_path), "i")
        if runs and runs[-1][0] == template:
            runs[-1][2] += 1
        else:
            runs.append([template, i, 1])
    texts = []
    for template, first, count in runs:
        if count == 1:
            texts.append(_item_text(member.items[first], None))
        else:
            texts.append(_comprehension(template, first, first + count, len(pad)))
    inline = "Sequential({}, [{}])".format(_name_expr(member.path), ", ".join(texts))
    if len(inline) <= 72:
        return inline
    return "Sequential({}, [\n{}{},\n{}])".format(
        _name_expr(member.path), pad, (",\n" + pad).join(_wrap(t, len(pad)) for t in texts),
        "    " * depth)


def _comprehension(template, start, stop, column):
    """``*[template for i in range(start, stop)]`` at ``column``, wrapped past 92 characters."""
    loop = " for i in range({}, {})]".format(start, stop)
    text = "*[" + _wrap(template, column + 2)
    if column + len(text.split("\n")[-1]) + len(loop) > 92:
        return text + "\n" + " " * (column + 1) + loop
    return text + loop


def _split_arguments(text):
    """The top-level comma-separated parts of ``text``."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return parts


def _wrap(text, column, width=92):
    """A one-line call ``text`` starting at ``column``, its arguments wrapped under its
    opening parenthesis past ``width`` characters."""
    if "\n" in text or column + len(text) <= width or not text.endswith(")") or "(" not in text:
        return text
    open_ = text.index("(")
    if text.startswith("*[") or (text.find("[") != -1 and text.find("[") < open_):
        return text
    head, body = text[:open_ + 1], text[open_ + 1:-1]
    hang = " " * (column + len(head))
    args = _split_arguments(body)
    lines, line, start = [], head, column   # start: the column the line begins at
    for i, arg in enumerate(args):
        piece = arg + ("," if i < len(args) - 1 else ")")
        candidate = line + ("" if line.endswith("(") else " ") + piece
        if start + len(candidate) > width and not line.endswith("("):
            lines.append(line)
            line, start = hang + piece, 0
        else:
            line = candidate
    lines.append(line)
    return "\n".join(lines)


class _Renamed:
    """A member seen at another path (a sequence's item, at its sequence's path)."""

    def __init__(self, member, path):
        self.__dict__.update(member.__dict__)
        self.path = path


def _layer_call(cls, member, ins):
    return "{}({})".format(member_ref(cls, member.path), ", ".join(ins))


# -- ops --------------------------------------------------------------------------------------
def _op(step, helpers):
    op, v, ins = step.op, step.values, step.ins

    def val(name):
        return value(v[name])
    x = ins[0] if ins else None
    if op == "relu":
        return "C.relu({})".format(x)
    if op == "add":
        return " + ".join(ins)
    if op == "maxpool2d":
        helpers.add("padding")
        helpers.add("max_pool2d")
        return "max_pool2d({}, {}, {}, {})".format(x, val("kernel"), val("stride"),
                                                  val("padding"))
    if op == "avgpool2d":
        helpers.add("padding")
        helpers.add("avg_pool2d")
        return "avg_pool2d({}, {}, {}, {}, {})".format(x, val("kernel"), val("stride"),
                                                      val("padding"), val("count_include_pad"))
    if op == "global_avgpool":
        return "C.reshape(C.reduce_mean({0}, axis=(1, 2)), ({0}.shape[0],))".format(x)
    if op == "flatten":
        return "C.reshape({0}, (int(np.prod({0}.shape)),))".format(x)
    if op == "concat":
        return "C.splice({}, axis={})".format(", ".join(ins), val("axis"))
    if op == "dropout":   # inverted dropout, active in training only
        if is_lit(v["rate"]):
            return "C.dropout({}, {})".format(x, val("rate")) if lit(v["rate"]) else x
        return "C.dropout({0}, {1}) if {1} else {0}".format(x, val("rate"))
    if op == "positional_encoding":
        helpers.add("positional_encoding")
        return "positional_encoding({})".format(x)
    if op == "tanh":
        return "C.tanh({})".format(x)
    if op == "upsample_nearest":
        helpers.add("upsample_nearest")
        return "upsample_nearest({}, {})".format(x, val("factor"))
    if op == "reshape":
        return "C.reshape({}, {})".format(x, val("shape"))
    if op == "scale":
        return "{} * float({})".format(x, val("factor"))
    if op == "transpose":
        if is_lit(v["perm"]):
            return "C.transpose({}, perm={})".format(x, list(lit(v["perm"])))
        return "C.transpose({}, perm=list({}))".format(x, val("perm"))
    if op == "stop_gradient":
        return "C.stop_gradient({})".format(x)
    if op == "ones_like":
        return "C.ones_like({})".format(x)
    if op == "clipped_relu":
        helpers.add("clipped_relu")
        return "clipped_relu({}, {})".format(x, val("ceiling"))
    if op == "roi_align":
        helpers.add("roi_align")
        return "roi_align({}, {}, {}, {}, {})".format(ins[0], ins[1], ins[2], val("output_size"),
                                                     val("sampling_ratio"))
    if op == "to_batch":
        return "C.to_batch(C.reshape(C.unpack_batch({0}), (-1,) + tuple({0}.shape[1:])))".format(x)
    if op == "lengths_after_conv":
        helpers.add("conv_lengths")
        return "conv_lengths({}, {}, {}, {}, {})".format(x, val("kernel"), val("stride"),
                                                        val("padding"), val("dilation"))
    _refuse(op, step.node.name if step.node is not None else step.path)


_HELPERS = OrderedDict()
_HELPERS["padding"] = '''
def auto_pad_matches(size, kernel, stride, pads):
    """True when CNTK's auto padding (it centres the kernel: (k - 1) // 2 cells before, and
    ceil(size / stride) outputs) gives exactly the windows of ``pads`` = (before, after) on
    one axis; CNTK also refuses a kernel larger than the unpadded input."""
    if kernel > size:
        return False
    before, after = pads
    out = (size + before + after - kernel) // stride + 1
    return before == (kernel - 1) // 2 and out == -(-size // stride)


def pad_modes(x, kernel, stride, padding, fill=0.0):
    """(x, auto_padding): per spatial axis no padding, CNTK's auto padding, or, where that
    cannot express ``padding`` ((top, bottom), (left, right)), C.pad with ``fill`` first."""
    modes, pattern = [False], [(0, 0)]
    for i in range(2):
        pads = tuple(padding[i])
        if pads == (0, 0):
            modes.append(False)
            pattern.append((0, 0))
        elif auto_pad_matches(x.shape[1 + i], kernel[i], stride[i], pads):
            modes.append(True)
            pattern.append((0, 0))
        else:
            modes.append(False)
            pattern.append(pads)
    if any(p != (0, 0) for p in pattern):
        x = C.pad(x, pattern=pattern, constant_value=fill)
    return x, modes
'''
_HELPERS["max_pool2d"] = '''
def max_pool2d(x, kernel, stride, padding):
    """Max pooling; explicit padding holds float32's lowest value, so it never wins."""
    x, modes = pad_modes(x, kernel, stride, padding, fill=LOWEST_FLOAT32)
    return C.pooling(x, C.MAX_POOLING, tuple(kernel), strides=tuple(stride), auto_padding=modes)
'''
_HELPERS["avg_pool2d"] = '''
def divisors(hw, kernel, stride, padding, count_include_pad):
    """What each average-pool window divides by, (Ho, Wo): its cells inside the input, plus
    its padded cells with count_include_pad."""
    counts = []
    for axis in range(2):
        size, k, s, (before, after) = hw[axis], kernel[axis], stride[axis], padding[axis]
        starts = np.arange((size + before + after - k) // s + 1) * s - before
        if count_include_pad:
            lo, hi = np.maximum(starts, -before), np.minimum(starts + k, size + after)
        else:
            lo, hi = np.maximum(starts, 0), np.minimum(starts + k, size)
        counts.append((hi - lo).astype(np.float64))
    return np.outer(counts[0], counts[1]).astype(np.float32)


def avg_pool2d(x, kernel, stride, padding, count_include_pad):
    """CNTK's average pooling where its auto padding gives the same windows; otherwise the
    full-window average of the zero-padded input, rescaled to each window's divisor."""
    kernel, stride = tuple(kernel), tuple(stride)
    padded, modes = pad_modes(x, kernel, stride, padding)
    if padded is x:
        return C.pooling(x, C.AVG_POOLING, kernel, strides=stride, auto_padding=modes,
                         include_pad=bool(count_include_pad))
    scale = (kernel[0] * kernel[1]) / divisors(x.shape[1:], kernel, stride, padding,
                                               count_include_pad)
    x = C.pad(x, pattern=[(0, 0)] + [tuple(p) for p in padding])
    y = C.pooling(x, C.AVG_POOLING, kernel, strides=stride, auto_padding=[False] * 3)
    if np.all(scale == 1.0):
        return y
    return y * C.constant(scale[None].astype(np.float32))
'''
_HELPERS["positional_encoding"] = '''
def positional_encoding(x):
    """x + PE, PE[p, 2i] = sin(p / 10000^(2i/D)), PE[p, 2i+1] = cos(...), made in float64."""
    length, dim = x.shape
    position = np.arange(length, dtype=np.float64)[:, None]
    rate = np.power(10000.0, -np.arange(0, dim, 2, dtype=np.float64) / dim)
    table = np.zeros((length, dim), np.float64)
    table[:, 0::2] = np.sin(position * rate)
    table[:, 1::2] = np.cos(position * rate[: dim // 2])
    return x + C.constant(table.astype(np.float32))
'''
_HELPERS["upsample_nearest"] = '''
def upsample_nearest(x, factor):
    """Each pixel repeated factor x factor times in place: (C, H, 1, W, 1) times ones."""
    c, h, w = x.shape
    ones = C.constant(np.ones((1, 1, factor, 1, factor), np.float32))
    return C.reshape(C.reshape(x, (c, h, 1, w, 1)) * ones, (c, h * factor, w * factor))
'''
_HELPERS["clipped_relu"] = '''
def clipped_relu(x, ceiling):
    """min(max(x, 0), ceiling): relu, then the ceiling by selection."""
    top = C.constant(ceiling, dtype=np.float32)
    return C.element_select(C.greater_equal(x, top), top, C.relu(x))
'''
_HELPERS["conv_lengths"] = '''
def conv_lengths(lengths, kernel, stride, padding, dilation):
    """The valid steps left of each float32 length after a convolution along time; at least 1."""
    before, after = padding
    span = lengths + float(before + after - dilation * (kernel - 1) - 1)
    out = C.floor(C.element_divide(span, float(stride))) + 1.0
    return C.stop_gradient(C.element_max(out, 1.0))
'''
_HELPERS["roi_align"] = '''
def roi_align(features, indices, weights, output_size, sampling_ratio):
    """RoIAlign from precomputed taps: ``indices`` and ``weights`` (R, S, 4), S = oh * ow * sr
    * sr samples per RoI, each the bilinear mix of four feature cells; each bin averages its
    sr * sr samples. Returns (R, C, oh, ow) per example. CNTK 2.7 gathers from no reference
    with a batch axis, so the batch's (N H W, C) feature rows are one static table and the
    indices must count from example n's first row, n H W (``indices`` an input variable fed
    as prepare() gives it)."""
    c, h, w = features.shape
    rois, samples, _ = indices.shape
    (oh, ow), sr = output_size, sampling_ratio
    rows = C.reshape(C.unpack_batch(C.reshape(C.transpose(features, (1, 2, 0)), (h * w, c))),
                     (-1, c))
    taps = C.gather(rows, C.reshape(indices, (rois * samples * 4,)))
    taps = taps * C.reshape(weights, (rois * samples * 4, 1))
    out = C.reduce_sum(C.reshape(taps, (rois * oh * ow, sr * sr * 4, c)), axis=1)
    return C.transpose(C.reshape(out, (rois, oh, ow, c)), (0, 3, 1, 2)) / float(sr * sr)
'''

_LAYERS = OrderedDict()
_LAYERS["linear"] = '''
def linear(x, weight, bias=None):
    """x W^T + b on the last axis, W (out, in) as tbdzoo stores it."""
    shape = x.shape
    if len(shape) > 2:
        x = C.reshape(x, (-1, shape[-1]))
    y = C.times_transpose(x, weight)
    if len(shape) > 2:
        y = C.reshape(y, tuple(shape[:-1]) + (weight.shape[0],))
    return y + bias if bias is not None else y
'''
_LAYERS["Convolution2D"] = '''
def Convolution2D(name, in_channels, out_channels, kernel_size, stride=(1, 1),
                  padding=((0, 0), (0, 0)), dilation=(1, 1), groups=1, bias=True, weight=None):
    """A 2-d convolution of (C, H, W) examples, kernel (out, in / groups, kh, kw); padding
    ((top, bottom), (left, right)) by CNTK's auto padding where that gives the same windows,
    else by C.pad. CNTK 2.7 has no dilated convolution on the CPU: a dilated kernel is the
    kernel with dilation - 1 zeros between its taps."""
    layer = Block("Convolution2D", name)
    layer.weight = weight if weight is not None else parameter(
        name + ".weight", (out_channels, in_channels // groups) + tuple(kernel_size))
    layer.bias = parameter(name + ".bias", (out_channels,), 0.0) if bias else None

    def convolution(x):
        w, kernel = layer.weight, tuple(kernel_size)
        if tuple(dilation) != (1, 1):
            (dh, dw), (kh, kw) = dilation, kernel
            spread = C.reshape(w, (out_channels, in_channels // groups, kh, 1, kw, 1))
            spread = C.pad(spread, pattern=[(0, 0)] * 3 + [(0, dh - 1), (0, 0), (0, dw - 1)])
            kernel = ((kh - 1) * dh + 1, (kw - 1) * dw + 1)
            w = C.slice(C.reshape(spread, (out_channels, in_channels // groups, kh * dh,
                                           kw * dw)), [2, 3], [0, 0], list(kernel))
        x, modes = pad_modes(x, kernel, stride, padding)
        y = C.convolution(w, x, strides=(1,) + tuple(stride), auto_padding=modes,
                          groups=groups)
        if layer.bias is not None:
            y = y + C.reshape(layer.bias, (out_channels, 1, 1))
        return y
    layer.forward = convolution
    return layer
'''
_LAYERS["BatchNormalization"] = '''
def BatchNormalization(name, channels, eps=1e-5, exact=False):
    """Batch normalisation of (C, ...) examples: CNTK's batch_normalization (running
    statistics in inference, CNTK's own running update, time constant 5000, in training);
    with exact=True (tbdzoo's training programs) the inference formula from CNTK ops:
    (x - running_mean) / sqrt(running_var + eps) * gamma + beta."""
    layer = Block("BatchNormalization", name)
    layer.gamma = parameter(name + ".gamma", (channels,), 1.0)
    layer.beta = parameter(name + ".beta", (channels,), 0.0)
    layer.running_mean = statistic(name + ".running_mean", (channels,), 0.0)
    layer.running_var = statistic(name + ".running_var", (channels,), 1.0)
    layer.count = C.constant(1.0, shape=(), name=name + ".running_count")

    def normalization(x):
        shape = (x.shape[0],) + (1,) * (len(x.shape) - 1)
        if exact:
            mean = C.reshape(layer.running_mean, shape)
            variance = C.reshape(layer.running_var, shape)
            return (x - mean) * C.reciprocal(C.sqrt(variance + eps)) * \\
                C.reshape(layer.gamma, shape) + C.reshape(layer.beta, shape)
        return C.batch_normalization(x, layer.gamma, layer.beta, layer.running_mean,
                                     layer.running_var, spatial=len(x.shape) > 1,
                                     normalization_time_constant=5000, epsilon=eps,
                                     running_count=layer.count)
    layer.forward = normalization
    return layer
'''
_LAYERS["BatchStatisticsNorm"] = '''
def BatchStatisticsNorm(name, channels, eps=1e-5):
    """Batch normalisation without running statistics: the batch's own mean and biased
    variance over the batch and spatial axes, in training and inference alike."""
    layer = Block("BatchNormalization", name)
    layer.gamma = parameter(name + ".gamma", (channels,), 1.0)
    layer.beta = parameter(name + ".beta", (channels,), 0.0)

    def normalization(x):
        batch, spatial = C.Axis.default_batch_axis(), tuple(range(1, len(x.shape)))

        def mean(v):
            return C.reduce_mean(C.reduce_mean(v, axis=spatial) if spatial else v, axis=batch)
        average = mean(x)
        variance = mean(C.square(x - average))
        shape = (x.shape[0],) + (1,) * (len(x.shape) - 1)
        return (x - average) * C.reciprocal(C.sqrt(variance + eps)) * \\
            C.reshape(layer.gamma, shape) + C.reshape(layer.beta, shape)
    layer.forward = normalization
    return layer
'''
_LAYERS["Dense"] = '''
def Dense(name, in_features, out_features, bias=True, weight=None):
    """y = x W^T + b on the last axis, W (out, in)."""
    layer = Block("Dense", name)
    layer.weight = weight if weight is not None else parameter(
        name + ".weight", (out_features, in_features))
    layer.bias = parameter(name + ".bias", (out_features,), 0.0) if bias else None
    layer.forward = lambda x: linear(x, layer.weight, layer.bias)
    return layer
'''
_LAYERS["Embedding"] = '''
def Embedding(name, vocab, dim, scale=1.0, weight=None):
    """Rows of a (vocab, dim) table for float32 token ids, times ``scale``."""
    layer = Block("Embedding", name)
    layer.weight = weight if weight is not None else parameter(name + ".weight", (vocab, dim))

    def embedding(ids):
        out = C.gather(layer.weight, ids)
        return out * scale if scale != 1.0 else out
    layer.forward = embedding
    return layer
'''
_LAYERS["LayerNormalization"] = '''
def LayerNormalization(name, features, eps=1e-5):
    """(x - mean) / sqrt(var + eps) * gamma + beta over the last axis (cntk.layers' own adds
    eps to the standard deviation)."""
    layer = Block("LayerNormalization", name)
    layer.gamma = parameter(name + ".gamma", (features,), 1.0)
    layer.beta = parameter(name + ".beta", (features,), 0.0)

    def normalization(x):
        centred = x - C.reduce_mean(x, axis=-1)
        variance = C.reduce_mean(C.square(centred), axis=-1)
        return centred * C.reciprocal(C.sqrt(variance + eps)) * layer.gamma + layer.beta
    layer.forward = normalization
    return layer
'''
_LAYERS["MultiHeadAttention"] = '''
def MultiHeadAttention(name, d_model, num_heads, dropout=0.0, causal=False, pad_id=0):
    """Multi-head attention of (T, D) queries over (S, D) sources: the logits of keys whose
    token is pad_id, and with causal=True of keys after each query, are set to -1e9 before
    the softmax; scores scaled by 1 / sqrt(D / num_heads). Called (query, source, tokens)."""
    layer = Block("AttentionModel", name)
    for k in ("q", "k", "v", "o"):
        setattr(layer, "W_" + k, parameter(name + ".W_" + k, (d_model, d_model)))
        setattr(layer, "b_" + k, parameter(name + ".b_" + k, (d_model,), 0.0))

    def attention(query, source, tokens):
        t, s, dh = query.shape[0], source.shape[0], d_model // num_heads
        q = linear(query, layer.W_q, layer.b_q)
        k = linear(source, layer.W_k, layer.b_k)
        v = linear(source, layer.W_v, layer.b_v)
        masked = C.equal(tokens, pad_id)
        if causal:
            later = np.triu(np.ones((t, s), np.float32), 1)
            masked = C.greater(masked + C.constant(later), 0.5)
        fill, root = C.constant(-1e9), math.sqrt(dh)
        contexts = []
        for h in range(num_heads):
            q_h, k_h, v_h = (C.slice(a, 1, h * dh, (h + 1) * dh) for a in (q, k, v))
            scores = C.element_select(masked, fill, C.times_transpose(q_h, k_h) / root)
            weights = C.softmax(scores, axis=-1)
            if dropout:
                weights = C.dropout(weights, dropout)
            contexts.append(C.times(weights, v_h))
        context = contexts[0] if num_heads == 1 else C.splice(*contexts, axis=1)
        return linear(context, layer.W_o, layer.b_o)
    layer.forward = attention
    return layer
'''
_LAYERS["ChannelLayerNorm"] = '''
def ChannelLayerNorm(name, channels, eps=1e-5):
    """Each (C, H, W) example normalised by one mean and biased variance, then scaled and
    shifted per channel."""
    layer = Block("ChannelLayerNorm", name)
    layer.gamma = parameter(name + ".gamma", (channels,), 1.0)
    layer.beta = parameter(name + ".beta", (channels,), 0.0)

    def normalization(x):
        axes = tuple(range(len(x.shape)))
        centred = x - C.reduce_mean(x, axis=axes)
        xhat = centred * C.reciprocal(C.sqrt(C.reduce_mean(C.square(centred), axis=axes) + eps))
        shape = (channels,) + (1,) * (len(x.shape) - 1)
        return xhat * C.reshape(layer.gamma, shape) + C.reshape(layer.beta, shape)
    layer.forward = normalization
    return layer
'''
_LAYERS["Ragged"] = '''
def valid_steps(lengths, steps):
    """(steps,) 1.0 where t < length, 0.0 at padded steps, per example."""
    return C.less(C.constant(np.arange(steps, dtype=np.float32)), lengths)


class Ragged(object):
    """A padded (T, D) example as a CNTK sequence of its valid steps (``sequence``), and the
    way back to (T, H) with zeros at the padded steps (``padded``)."""

    def __init__(self, x, lengths):
        steps, features = x.shape
        self.steps = steps
        valid = C.reshape(valid_steps(lengths, steps), (steps, 1))
        full = C.to_sequence(C.splice(x, valid, axis=1))
        self.condition = C.slice(full, 0, features, features + 1)
        self.sequence = C.sequence.gather(C.slice(full, 0, 0, features), self.condition)

    def padded(self, y):
        full = C.sequence.scatter(y, self.condition)
        unpacked = C.sequence.unpack(full, padding_value=0.0, no_mask_output=True)
        return C.reshape(unpacked, (self.steps, y.shape[0]))


def recurrence(step, inputs, units, states, backwards):
    """CNTK's recurrence over the sequence ``inputs``: ``step(previous states, input)`` gives
    the new states, which start at zero; a backward direction runs from each sequence's last
    valid step (future_value). Returns the states as sequences."""
    placeholders = [C.placeholder(shape=(units,), dynamic_axes=inputs.dynamic_axes)
                    for _ in range(states)]
    delay = C.sequence.future_value if backwards else C.sequence.past_value
    new = step([delay(p) for p in placeholders], inputs)
    C.combine([n.output for n in new]).replace_placeholders(
        dict((p, n.output) for p, n in zip(placeholders, new)))
    return [n.output for n in new]


def recurrent_layers(kind, name, input_size, hidden_size, num_layers, bidirectional, merge,
                     weights, biases, direction):
    """The block of a stack of recurrent layers: per layer and direction (``l0.fw.``) the
    per-gate input weights ``w_`` (H, X) and recurrent weights ``u_`` (H, H) and ``biases``;
    ``direction(sequence, parameters, prefix, backwards)`` runs one. Directions are
    concatenated between layers, merged as ``merge`` says after the last."""
    layer = Block(kind, name)
    directions = ("fw", "bw") if bidirectional else ("fw",)
    layer.weights = OrderedDict()
    for index in range(num_layers):
        width = input_size if index == 0 else hidden_size * len(directions)
        for d in directions:
            prefix = "l{}.{}.".format(index, d)
            for gate in weights:
                for kind_, shape in (("w_", (hidden_size, width)),
                                     ("u_", (hidden_size, hidden_size))):
                    layer.weights[prefix + kind_ + gate] = parameter(
                        name + "." + prefix + kind_ + gate, shape)
            for bias in biases:
                layer.weights[prefix + bias] = parameter(name + "." + prefix + bias,
                                                         (hidden_size,), 0.0)

    def layers(x, lengths):
        ragged = Ragged(x, lengths)
        sequence = ragged.sequence
        for index in range(num_layers):
            outputs = [direction(sequence, layer.weights, "l{}.{}.".format(index, d), d == "bw")
                       for d in directions]
            if len(outputs) == 1:
                sequence = outputs[0]
            elif index == num_layers - 1 and merge == "sum":
                sequence = outputs[0] + outputs[1]
            else:
                sequence = C.splice(outputs[0], outputs[1], axis=0)
        return ragged.padded(sequence)
    layer.forward = layers
    return layer


def fused(p, prefix, kind, gates):
    """The per-gate (H, X) matrices of one layer and direction as one (gates * H, X)."""
    return C.splice(*[p[prefix + kind + g] for g in gates], axis=0)


def gate(v, index, units):
    return C.slice(v, 0, index * units, (index + 1) * units)
'''
_LAYERS["LSTM"] = '''
def LSTM(name, input_size, hidden_size, num_layers=1, bidirectional=False, merge="concat"):
    """LSTM layers over padded (T, D) examples with their float32 lengths: gates i, f, g, o,
    one bias per gate, c' = f c + i g, h' = o tanh(c'); outputs past a length are 0."""
    def direction(x, p, prefix, backwards):
        projected = C.times_transpose(x, fused(p, prefix, "w_", "ifgo")) + \\
            C.splice(*[p[prefix + "b_" + g] for g in "ifgo"], axis=0)
        recurrent = fused(p, prefix, "u_", "ifgo")

        def step(previous, xw):
            h, c = previous
            gates = xw + C.times_transpose(h, recurrent)
            i = C.sigmoid(gate(gates, 0, hidden_size))
            f = C.sigmoid(gate(gates, 1, hidden_size))
            g = C.tanh(gate(gates, 2, hidden_size))
            o = C.sigmoid(gate(gates, 3, hidden_size))
            cell = f * c + i * g
            return [o * C.tanh(cell), cell]
        return recurrence(step, projected, hidden_size, 2, backwards)[0]
    return recurrent_layers("LSTM", name, input_size, hidden_size, num_layers, bidirectional,
                            merge, "ifgo", ("b_i", "b_f", "b_g", "b_o"), direction)
'''
_LAYERS["GRU"] = '''
def GRU(name, input_size, hidden_size, num_layers=1, bidirectional=False, merge="concat"):
    """GRU layers over padded (T, D) examples with their float32 lengths: gates r, z, n, the
    reset applied after the recurrent product (n = tanh(W_n x + b_in + r (U_n h + b_hn)));
    outputs past a length are 0."""
    def direction(x, p, prefix, backwards):
        projected = C.times_transpose(x, fused(p, prefix, "w_", "rzn")) + \\
            C.splice(p[prefix + "b_r"], p[prefix + "b_z"], p[prefix + "b_in"], axis=0)
        recurrent = fused(p, prefix, "u_", "rzn")

        def step(previous, xw):
            h, = previous
            hu = C.times_transpose(h, recurrent)
            r = C.sigmoid(gate(xw, 0, hidden_size) + gate(hu, 0, hidden_size))
            z = C.sigmoid(gate(xw, 1, hidden_size) + gate(hu, 1, hidden_size))
            n = C.tanh(gate(xw, 2, hidden_size) +
                       r * (gate(hu, 2, hidden_size) + p[prefix + "b_hn"]))
            return [(1.0 - z) * n + z * h]
        return recurrence(step, projected, hidden_size, 1, backwards)[0]
    return recurrent_layers("GRU", name, input_size, hidden_size, num_layers, bidirectional,
                            merge, "rzn", ("b_r", "b_z", "b_in", "b_hn"), direction)
'''
_LAYERS["AdditiveAttention"] = '''
def AdditiveAttention(name, query_size, memory_size, units):
    """Bahdanau attention without biases: e[t, s] = v . tanh(W_q q_t + W_m m_s), -1e9 past the
    memory's length, softmax over s; returns sum_s alpha[t, s] m_s. Called (query, memory,
    lengths)."""
    layer = Block("AttentionModel", name)
    layer.w_query = parameter(name + ".w_query", (units, query_size))
    layer.w_memory = parameter(name + ".w_memory", (units, memory_size))
    layer.v = parameter(name + ".v", (units,), 0.0)

    def attention(query, memory, lengths):
        t, s = query.shape[0], memory.shape[0]
        q = C.times_transpose(query, layer.w_query)            # (T, A)
        m = C.times_transpose(memory, layer.w_memory)          # (S, A)
        hidden = C.tanh(C.reshape(q, (t, 1, units)) + C.reshape(m, (1, s, units)))
        scores = C.reshape(C.times(C.reshape(hidden, (t * s, units)),
                                   C.reshape(layer.v, (units, 1))), (t, s))
        padded = C.reshape(1.0 - valid_steps(lengths, s), (1, s))
        scores = C.element_select(padded, C.constant(-1e9), scores)
        return C.times(C.softmax(scores, axis=-1), memory)
    layer.forward = attention
    return layer
'''
_LAYERS["SequenceBatchNorm"] = '''
def SequenceBatchNorm(name, channels, eps=1e-5):
    """Batch normalisation of the features of (T, D) examples, for inference: each valid step
    normalised by the running statistics, scaled and shifted; padded steps give 0. Called
    (x, lengths)."""
    layer = Block("SequenceBatchNorm", name)
    layer.gamma = parameter(name + ".gamma", (channels,), 1.0)
    layer.beta = parameter(name + ".beta", (channels,), 0.0)
    layer.running_mean = statistic(name + ".running_mean", (channels,), 0.0)
    layer.running_var = statistic(name + ".running_var", (channels,), 1.0)

    def normalization(x, lengths):
        mask = C.reshape(valid_steps(lengths, x.shape[0]), (x.shape[0], 1))
        y = (x - layer.running_mean) * C.reciprocal(C.sqrt(layer.running_var + eps)) * \\
            layer.gamma + layer.beta
        return y * mask
    layer.forward = normalization
    return layer
'''
_LAYERS["FrozenBatchNorm"] = '''
def FrozenBatchNorm(name, channels, eps=1e-5):
    """Batch normalisation with fixed statistics and affine parameters (constants, not
    trained): x * scale + shift, scale = gamma / sqrt(running_var + eps)."""
    layer = Block("FrozenBatchNorm", name)
    for k, fill in (("gamma", 1.0), ("beta", 0.0), ("running_mean", 0.0), ("running_var", 1.0)):
        setattr(layer, k, statistic(name + "." + k, (channels,), fill))

    def normalization(x):
        scale = layer.gamma * C.reciprocal(C.sqrt(layer.running_var + eps))
        shift = layer.beta - layer.running_mean * scale
        shape = (x.shape[0],) + (1,) * (len(x.shape) - 1)
        return x * C.reshape(scale, shape) + C.reshape(shift, shape)
    layer.forward = normalization
    return layer
'''

_RUNTIME = '''
def join(name, path):
    """The name of ``path`` below the block named ``name`` (the model's is '')."""
    return name + "." + path if name else path


def parameter(name, shape, fill=None):
    """A trainable parameter named as tbdzoo names it: ``fill``, or Glorot-uniform."""
    if fill is not None or len(shape) < 2:
        return C.parameter(shape=shape, init=fill or 0.0, name=name)
    return C.parameter(shape=shape, init=C.glorot_uniform(), name=name)


def statistic(name, shape, fill):
    """A running statistic (not trained), named as tbdzoo names it."""
    return C.constant(np.full(shape, fill, np.float32), name=name)


class Block(object):
    """A layer or block: its parameters, layers and blocks are its attributes (a sequence's
    its items). Called on CNTK variables, it adds ``forward``'s graph as one CNTK block
    function (``C.as_block``, op name ``kind``, name ``name``) over placeholders of the
    inputs' shapes, and returns its output(s)."""

    def __init__(self, kind, name, forward=None):
        self.kind, self.name, self.forward, self.items = kind, name, forward, []

    def __getitem__(self, index):
        return self.items[index]

    def __len__(self):
        return len(self.items)

    def append(self, item):
        self.items.append(item)

    def __call__(self, *inputs):
        inputs = [v.output if isinstance(v, C.Function) else v for v in inputs]
        distinct = []
        for v in inputs:
            if not any(v == d for d in distinct):
                distinct.append(v)
        holders = [C.placeholder(shape=v.shape, dynamic_axes=v.dynamic_axes) for v in distinct]
        outs = self.forward(*[holders[next(i for i, d in enumerate(distinct) if v == d)]
                              for v in inputs])
        outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
        inner = []
        for v in outs:
            v = v.output if isinstance(v, C.Function) else v
            if v.is_placeholder or any(v == u for u in inner):
                v = C.alias(v).output   # a block's output is made inside it, once
            inner.append(v)
        composite = C.combine(inner) if len(inner) > 1 else C.as_composite(inner[0].owner)
        block = C.as_block(composite, list(zip(holders, distinct)), self.kind, self.name)
        return block.outputs[0] if len(inner) == 1 else tuple(block.outputs)

    def parameters(self):
        """{tbdzoo name: CNTK parameter or constant} of the block and all below it."""
        out = OrderedDict()
        values = list(vars(self).values()) + self.items
        for v in values + [w for v in values if isinstance(v, dict) for w in v.values()]:
            if isinstance(v, Block):
                out.update(v.parameters())
            elif isinstance(v, (C.Parameter, C.Constant)) and \\
                    not v.name.endswith(".running_count"):
                out[v.name] = v
        return out


def Sequential(name, items):
    """The blocks ``items``, each called on the previous one's output."""
    block = Block("Sequential", name)
    for item in items:
        block.append(item)

    def chain(x):
        for item in block.items:
            x = item(x)
        return x
    block.forward = chain
    return block
'''

_LOAD = '''
def load(model, path):
    """Loads tbdzoo's canonical weights file (.npz) into ``model``: the parameters' names are
    tbdzoo's, and so are their layouts."""
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files if k != "__manifest__"}
    params = model.parameters()
    missing = sorted(set(params) - set(arrays))
    unused = sorted(set(arrays) - set(params))
    if missing or unused:
        raise ValueError("{} does not fit this model: nothing in the file for {}; not in the "
                         "model: {}".format(path, missing or "-", unused or "-"))
    for name, variable in params.items():
        variable.value = np.ascontiguousarray(arrays[name], np.float32).reshape(variable.shape)
    return model


def prepare(arrays):
    """The arrays to feed, by input name, from tbdzoo's batch (also by input name): float32,
    and each RoIAlign's indices offset by n H W for example n (ROI_INDICES: input -> H W),
    so that one gather over the whole batch's feature rows reads each example's own map."""
    out = {}
    for name, array in arrays.items():
        array = np.asarray(array, np.float32)
        if name in ROI_INDICES:
            offsets = np.arange(len(array), dtype=np.float32) * float(ROI_INDICES[name])
            array = array + offsets.reshape((-1,) + (1,) * (array.ndim - 1))
        out[name] = array
    return out


def function(model):
    """The model as one cntk.Function of input variables named INPUTS (token ids and lengths
    as float32), its blocks inside as CNTK block functions."""
    inputs = [C.input_variable(shape, np.float32, name=name) for name, shape in INPUTS.items()]
    out = model.forward(*inputs)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    return C.combine(outs, name=model.kind)
'''


def _helper_names(plan):
    used_types, helpers = used_names(plan, _op)
    if "Convolution2D" in used_types:
        helpers.add("padding")
    return used_types, helpers


def _write_kind(cls, lines, plan):
    params = params_in_call_order(cls)
    root = cls is plan.root
    args = ["name=\"\""] if root else ["name"] + [p.name for p in params]
    lines.add("def {}({}):".format(cls.name, ", ".join(args))).indent()
    lines.add('"""' + class_doc(cls, plan, _root_doc) + '"""')
    lines.add("self = Block(\"{}\", name)".format(cls.kind))
    shares = {}
    for layer, suffix, owner, owner_suffix in cls.ties:
        shares.setdefault(layer, {})[suffix] = "{}.{}".format(member_ref(cls, owner),
                                                             owner_suffix)
    ordered = sorted(members_in_order(cls), key=lambda m: m.path in shares)
    for m in ordered:
        expr = _constructor(m, shares[m.path]) if m.path in shares else _member_expr(m)
        if m.optional is not None:
            expr = "{} if {} else None".format(expr, m.optional.name)
        if cls.base == "list" and "." not in m.path:
            lhs = "self.append("
            lines.add(lhs + _wrap(expr + ")", len(lhs))[:-1] + ")")
        else:
            lhs = "{} = ".format(member_ref(cls, m.path))
            lines.add(lhs + _wrap(expr, len(lhs)))
    lines.add()
    lines.add("def forward({}):".format(", ".join(cls.inputs))).indent()
    add_forward(cls, lines, lambda step: _op(step, set()), _layer_call)
    lines.dedent()
    lines.add("self.forward = forward")
    lines.add("return self")
    lines.dedent().add().add()


def _root_doc(cls, plan):
    g = plan.graph
    out = ["{}, as tbdzoo's specification builds it.".format(cls.kind), "",
           "Called with CNTK variables ({}):".format(", ".join(cls.inputs))]
    written = set(g.program.written_inputs()) if g.program is not None else set()
    for name, node in zip(cls.inputs, cls.input_nodes):
        inp = g.inputs[node]
        note = ",\n      from the training program's targets step" if node in written else ""
        shape = "of shape ({})".format(", ".join(str(d) for d in inp.shape)) \
            if inp.shape else "scalar"
        out.append("  {}: float32 {} per example{}".format(name, shape, note))
    rows = "\n    per RoI (its batch axis has N R rows)" \
        if any(n.op == "to_batch" for n in g.nodes.values()) else " per example"
    out.append("and returns {} of shape ({}){}.".format(
        g.output, ", ".join(str(d) for d in g.shape_of(g.output)), rows))
    for path, block in getattr(plan, "parts", ()):
        out.append("Also a part of the model, not called by forward:")
        out.append("  self.{}({}) -> {}".format(path, ", ".join(block.inputs),
                                             ", ".join(block.outputs)))
    return "\n".join(out) + "\n"


def write(plan, model_name, config, version):
    used_types, helpers = _helper_names(plan)
    root = plan.root
    graph = plan.graph
    lines = Lines()
    add_title(lines, "CNTK", model_name, version, config, root)
    lines.add("    f = function(model)            # a cntk.Function of input variables INPUTS")
    lines.add("    feed = prepare({{\"{}\": ..., ...}})   # NumPy arrays by input name".format(
        root.inputs[0]))
    lines.add("    out = f.eval({a: feed[a.name] for a in f.arguments})")
    lines.add("")
    lines.add("Each block kind is a function that creates its parameters and returns the block;")
    lines.add("called on CNTK variables a block adds its graph as one CNTK block function. The")
    lines.add("parameters are named as tbdzoo names them (``layer1.0.conv1.weight``), in its")
    lines.add("layouts. Needs only CNTK 2.7 (Python 3.6) and NumPy.")
    lines.add('"""')
    lines.add("import math  # noqa: F401")
    lines.add("from collections import OrderedDict").add()
    lines.add("import cntk as C")
    lines.add("import numpy as np").add()
    lines.add("# The model's inputs and each one's shape per example (the batch is CNTK's axis)")
    lines.add("INPUTS = OrderedDict([")
    for name, node in zip(root.inputs, root.input_nodes):
        lines.add("    (\"{}\", {}),".format(name, literal(tuple(graph.inputs[node].shape))))
    lines.add("])")
    rois = OrderedDict()
    for node in graph.nodes.values():
        if node.op == "roi_align" and node.inputs[1] in graph.inputs:
            _, h, w = graph.shape_of(node.inputs[0])
            rois[node.inputs[1]] = h * w
    lines.add("# RoIAlign's indices inputs and the cells (H W) of the feature map each indexes")
    lines.add("ROI_INDICES = {{{}}}".format(", ".join("\"{}\": {}".format(k, v)
                                                     for k, v in rois.items())))
    lines.add("LOWEST_FLOAT32 = {!r}".format(-3.4028234663852886e+38)).add().add()
    lines.add(_RUNTIME.strip("\n")).add().add()
    add_texts(lines, _HELPERS, helpers)
    needs = {"linear": {"Dense", "MultiHeadAttention"},
             "Ragged": {"LSTM", "GRU", "AdditiveAttention", "SequenceBatchNorm"}}
    for name, text in _LAYERS.items():
        if name in used_types or used_types & needs.get(name, set()):
            lines.add(text.strip("\n")).add().add()
    for cls in plan.classes:
        _write_kind(cls, lines, plan)
    add_build(lines, root, _LOAD)
    return lines.text()
