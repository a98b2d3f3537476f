"""Keras source of a model: ``keras.layers`` in one Layer class per block kind, NHWC images.

Writes text only (TensorFlow is not imported here): tbdzoo/export/ plans the classes, this
module says what each layer and op is in Keras, with the formulas of this backend's ops.py
(every value with three axes per example NHWC, inside and at the model's boundary;
flattening, reshaping and transposing in the spec's (C, H, W) order; max-pool padding and
masked attention logits that never win; BatchNorm momentum as Keras counts it: the weight of
the old statistics). Keras' own layers where they compute the spec's op (Conv2D, Dense,
BatchNormalization, Embedding, LayerNormalization, MultiHeadAttention, LSTM, GRU,
AdditiveAttention), a small ``layers.Layer`` written into the file where Keras has none
(ChannelLayerNorm, SequenceBatchNorm, FrozenBatchNorm, ...), each computing with the ops the
backend's own kernel does, so that the file reproduces the backend's values bit for bit:
BatchStatisticsNorm sums its statistics in two stages as ops.py's two-pass BatchNorm of
training programs does, and a convolution whose pads neither 'same' nor 'valid' gives is a
PaddedConv2D (Keras' Conv2D handing the pads to TensorFlow's kernel, as ops.conv2d does; the
one place the file imports TensorFlow itself). A layer or op the writer has no Keras code for
(a grouped convolution) is refused, naming the op.
"""
from collections import OrderedDict

from ...errors import UnsupportedOpError
from ...export.code import (
    Lines,
    add_build,
    add_forward,
    add_texts,
    add_title,
    all_members,
    arguments,
    class_doc,
    is_lit,
    lit,
    literal,
    member_expr,
    member_ref,
    members_in_order,
    pair,
    params_in_call_order,
    scaled_call,
    used_names,
    value,
)
from ...export.plan import Slot, attribute_slots, renamed_slots
from ...spec.tree import SEQUENTIAL, build_tree

FRAMEWORK = "Keras"
EXTENSION = ".py"

_TYPES = {"conv2d": "layers.Conv2D", "dense": "layers.Dense",
          "batchnorm": "layers.BatchNormalization", "embedding": "layers.Embedding",
          "layernorm": "layers.LayerNormalization",
          "multi_head_attention": "MultiHeadAttention", "channel_layernorm": "ChannelLayerNorm",
          "lstm": "LSTM", "gru": "GRU", "additive_attention": "AdditiveAttention",
          "sequence_batchnorm": "SequenceBatchNorm", "frozen_batchnorm": "FrozenBatchNorm"}
_OPS = ("relu", "add", "maxpool2d", "avgpool2d", "global_avgpool", "flatten", "dropout",
        "concat", "tanh", "scale", "positional_encoding", "upsample_nearest", "reshape",
        "clipped_relu", "lengths_after_conv", "transpose", "roi_align", "to_batch")
# Attributes Keras' layers keep for themselves: a member of that name is kept as name + "_".
_KERAS_ATTRIBUTES = {"input", "output", "inputs", "outputs", "layers", "weights", "variables",
                     "name", "dtype", "trainable", "built", "losses", "metrics", "optimizer",
                     "loss", "call", "build", "path", "supports_masking", "input_spec"}


def _refuse(node):
    raise UnsupportedOpError("the Keras source writer does not write op {!r} ({}) yet; export "
                             "this model to PyTorch or MXNet".format(node.op, node.name))


def _same_pads(size, kernel, stride, dilation):
    """TensorFlow's 'SAME' pads of one axis (the odd pixel after), as the backend's ops.py
    picks them: a convolution whose pads are these runs as 'SAME'."""
    effective = dilation * (kernel - 1) + 1
    out = -(-size // stride)
    total = max((out - 1) * stride + effective - size, 0)
    return (total // 2, total - total // 2)


def _padding_mode(graph, node):
    """'valid' or 'same' where TensorFlow's padding of that name gives the convolution's pads
    (as the backend's ops.padding_mode decides), else None."""
    a = node.attrs
    if a["padding"] == ((0, 0), (0, 0)):
        return "valid"
    _, h, w = graph.shape_of(node.inputs[0])
    same = tuple(_same_pads(size, k, st, d) for size, k, st, d in zip(
        (h, w), a["kernel"], a["stride"], a["dilation"]))
    return "same" if same == tuple(tuple(p) for p in a["padding"]) else None


_EXPLICIT = [None, frozenset()]   # the last graph asked about and its PaddedConv2D layers


def _explicitly_padded(graph):
    """The convolutions written as PaddedConv2D: those at a place (a block kind and the path
    below it) where some instance's pads are neither 'same' nor 'valid', so that one class
    holds every instance of the kind (ResNet's Bottleneck.conv2, 'same' at stride 1 and
    PyTorch's symmetric pads at stride 2)."""
    if _EXPLICIT[0] is graph:
        return _EXPLICIT[1]
    places = OrderedDict()   # (kind, path below it) -> convolution nodes

    def walk(block, kind, prefix):
        for path, name in block.layers.items():
            if graph.nodes[name].op == "conv2d":
                places.setdefault((kind, prefix + path), []).append(name)
        for local, child in block.children.items():   # a Sequential is its holder's members
            if child.kind == SEQUENTIAL:
                walk(child, kind, prefix + local + ".")
            else:
                walk(child, child.kind, "")
    root = build_tree(graph)
    walk(root, root.kind, "")
    out = frozenset(n for names in places.values()
                    if any(_padding_mode(graph, graph.nodes[m]) is None for m in names)
                    for n in names)
    _EXPLICIT[:] = [graph, out]
    return out


def layer_type(graph, node):
    if node.op == "conv2d" and node.attrs["groups"] == 1 and \
            node.name in _explicitly_padded(graph):
        return "PaddedConv2D"
    if node.op == "batchnorm":
        if len(graph.shape_of(node.inputs[0])) != 3:
            _refuse(node)
        return "layers.BatchNormalization" if node.attrs["track_running_stats"] else \
            "BatchStatisticsNorm"
    if node.op not in _TYPES:
        _refuse(node)
    if (node.op == "conv2d" and node.attrs["groups"] != 1) or \
            (node.op == "frozen_batchnorm" and len(graph.shape_of(node.inputs[0])) != 3):
        _refuse(node)
    return _TYPES[node.op]


# The constructors' arguments, by the spec's names (tbdzoo/export/plan.py: spec_slots)
_SLOT_NAMES = {
    "conv2d": "filters kernel_size=kernel strides=stride padding dilation_rate=dilation "
              "use_bias",
    "dense": "units use_bias",
    "batchnorm": "momentum epsilon=eps",
    "sequence_batchnorm": "momentum epsilon=eps",
    "embedding": "input_dim=vocab output_dim=dim scale",
    "layernorm": "epsilon=eps",
    "multi_head_attention": "num_heads key_dim=d_model dropout causal pad_id",
    "channel_layernorm": "epsilon=eps",
    "frozen_batchnorm": "epsilon=eps",
    "lstm": "units=hidden_size num_layers bidirectional merge",
    "gru": "units=hidden_size num_layers bidirectional merge",
    "additive_attention": "units"}
_STATISTICS_NAMES = dict(_SLOT_NAMES, batchnorm="epsilon=eps")
_CONVERT = {"kernel": pair, "stride": pair, "dilation": pair,
            "momentum": lambda momentum: 1.0 - momentum}   # Keras': the old statistics' weight


def layer_slots(graph, node):
    kind = layer_type(graph, node)
    names = _STATISTICS_NAMES if kind == "BatchStatisticsNorm" else _SLOT_NAMES
    s = renamed_slots(graph, node, names, _CONVERT)
    if node.op == "conv2d":
        mode = _padding_mode(graph, node)
        if kind == "PaddedConv2D" and mode is None:
            mode = tuple(tuple(p) for p in node.attrs["padding"])
        s["padding"] = Slot(mode, "padding")
    elif node.op == "multi_head_attention":   # each head's size
        s["key_dim"] = Slot(s["key_dim"].value // node.attrs["num_heads"], "channels")
    return s


def op_slots(graph, node):
    if node.op not in _OPS:
        _refuse(node)
    out = attribute_slots(node)
    out["rank"] = Slot(len(graph.shape_of(node.inputs[0])), "rank", call=True)
    if node.op in ("flatten", "reshape", "to_batch"):
        out["in_shape"] = Slot(tuple(graph.shape_of(node.inputs[0])), "in_shape", call=True)
    return out


# -- layers -----------------------------------------------------------------------------------
_DEFAULTS = {"strides": 1, "padding": "valid", "dilation_rate": 1, "use_bias": True,
             "dropout": 0.0, "causal": False, "pad_id": 0, "epsilon": 1e-3, "num_layers": 1,
             "bidirectional": False, "merge": "concat"}


def _keywords(v, names):
    """``name=value`` for each of ``names`` not at Keras' default."""
    return arguments([(k, v[k]) for k in names], 0, _DEFAULTS)


def _constructor(member):
    v = member.values
    if member.op == "conv2d":
        parts = [value(v["filters"]), value(v["kernel_size"])] + _keywords(
            v, ("strides", "padding", "dilation_rate", "use_bias"))
    elif member.op == "dense":
        parts = [value(v["units"])] + _keywords(v, ("use_bias",))
    elif member.op == "embedding":
        parts = [value(v["input_dim"]), value(v["output_dim"])]
    elif member.op == "multi_head_attention":
        parts = [value(v["num_heads"]), value(v["key_dim"])] + _keywords(
            v, ("dropout", "causal", "pad_id"))
    elif member.op in ("lstm", "gru"):
        parts = [value(v["units"])] + _keywords(v, ("num_layers", "bidirectional", "merge"))
    elif member.op == "additive_attention":
        parts = [value(v["units"])]
    elif member.type in ("layers.BatchNormalization", "SequenceBatchNorm"):
        parts = ["momentum={}".format(value(v["momentum"])),
                 "epsilon={}".format(value(v["epsilon"]))]
    else:
        parts = ["epsilon={}".format(value(v["epsilon"]))]
    return "{}({})".format(member.type, ", ".join(parts))


def _attribute_path(path):
    """tbdzoo's local path with the names Keras keeps for itself renamed (``input_``)."""
    return ".".join(p + "_" if p in _KERAS_ATTRIBUTES else p for p in path.split("."))


def _ref(cls, path):
    """How a class's code reaches its member at ``path`` (``self.output_``,
    ``self[0].bn``)."""
    return member_ref(cls, _attribute_path(path))


def _layer_call(cls, member, ins):
    ref = _ref(cls, member.path)
    if member.type in ("layers.BatchNormalization", "MultiHeadAttention", "SequenceBatchNorm"):
        return "{}({}, training=training)".format(ref, ", ".join(ins))
    if member.op == "embedding":
        return scaled_call(ref, ins[0], member.values["scale"])
    return "{}({})".format(ref, ", ".join(ins))


def _member_expr(member, depth=0):
    """The expression building ``member``."""
    return member_expr(member, _constructor, "keras.Sequential([", "])",
                       "*[{} for _ in range({})]", depth)


def _axis(axis, rank):
    """The NHWC tensor's axis of the spec's example ``axis`` (rank: the example's axes)."""
    if rank == 3:
        return {0: 3, 1: 1, 2: 2}[axis]
    return axis + 1


def _transpose_axes(perm, rank):
    """The axes of one transpose of the tensor computing the spec's ``perm`` of its examples'
    axes: a rank-3 value is NHWC before and after (the spec's (C, H, W) order in between)."""
    axes = (0,) + tuple(p + 1 for p in perm)
    if rank != 3:
        return axes
    to_spec, to_nhwc = (0, 3, 1, 2), (0, 2, 3, 1)
    return tuple(to_spec[axes[to_nhwc[i]]] for i in range(4))


def _size(shape):
    size = 1
    for d in shape:
        size *= d
    return size


# -- ops --------------------------------------------------------------------------------------
def _op(step, helpers):
    op, v, ins = step.op, step.values, step.ins

    def need_lit(*names):
        for n in names:
            if not is_lit(v[n]):
                raise UnsupportedOpError(
                    "the Keras source writer needs {} of op {!r} to be the same in every "
                    "instance of a class".format(n, op))
        return [lit(v[n]) for n in names]
    x = ins[0] if ins else None
    if op == "relu":
        return "ops.relu({})".format(x)
    if op == "add":
        return " + ".join(ins)
    if op == "maxpool2d":
        kernel, stride, padding = need_lit("kernel", "stride", "padding")
        if padding != ((0, 0), (0, 0)):
            x = "pad({}, {}, -np.inf)".format(x, literal(padding))
        return "ops.max_pool({}, {}, {}, padding=\"valid\")".format(
            x, literal(tuple(kernel)), literal(tuple(stride)))
    if op == "avgpool2d":
        kernel, stride, padding, include = need_lit("kernel", "stride", "padding",
                                                    "count_include_pad")
        if padding == ((0, 0), (0, 0)) or include:
            if padding != ((0, 0), (0, 0)):
                x = "pad({}, {})".format(x, literal(padding))
            return "ops.average_pool({}, {}, {}, padding=\"valid\")".format(
                x, literal(tuple(kernel)), literal(tuple(stride)))
        helpers.add("avg_pool")
        return "avg_pool({}, {}, {}, {})".format(x, literal(tuple(kernel)),
                                                literal(tuple(stride)), literal(padding))
    if op == "global_avgpool":
        return "ops.mean({}, axis=(1, 2))".format(x)
    if op == "flatten":
        shape, = need_lit("in_shape")
        if len(shape) == 3:
            x = "ops.transpose({}, (0, 3, 1, 2))".format(x)   # the spec's (C, H, W) order
        return "ops.reshape({}, (-1, {}))".format(x, _size(shape))
    if op == "reshape":
        shape, in_shape = need_lit("shape", "in_shape")
        if len(in_shape) == 3:   # an NHWC image: read in the spec's (C, H, W) order
            x = "ops.transpose({}, (0, 3, 1, 2))".format(x)
        x = "ops.reshape({}, {})".format(x, literal((-1,) + tuple(shape)))
        if len(shape) == 3:   # an image again: NHWC
            x = "ops.transpose({}, (0, 2, 3, 1))".format(x)
        return x
    if op == "dropout":
        helpers.add("dropout")
        return "dropout({}, {}, training)".format(x, value(v["rate"], True))
    if op == "concat":
        axis, rank = need_lit("axis", "rank")
        return "ops.concatenate([{}], axis={})".format(", ".join(ins), _axis(axis, rank))
    if op == "tanh":
        return "ops.tanh({})".format(x)
    if op == "scale":
        return "{} * {}".format(x, value(v["factor"], True))
    if op == "positional_encoding":
        helpers.add("positional_encoding")
        return "positional_encoding({})".format(x)
    if op == "clipped_relu":
        return "ops.clip({}, 0.0, {})".format(x, value(v["ceiling"], True))
    if op == "lengths_after_conv":
        helpers.add("conv_lengths")
        return "conv_lengths({}, {}, {}, {}, {})".format(
            x, value(v["kernel"], True), value(v["stride"], True), value(v["padding"], True),
            value(v["dilation"], True))
    if op == "transpose":
        perm, rank = need_lit("perm", "rank")
        axes = _transpose_axes(perm, rank)
        return x if axes == tuple(range(rank + 1)) else \
            "ops.transpose({}, {})".format(x, literal(axes))
    if op == "roi_align":
        helpers.add("roi_align")
        size, ratio = need_lit("output_size", "sampling_ratio")
        return "roi_align({}, {}, {}, {}, {})".format(ins[0], ins[1], ins[2],
                                                     literal(tuple(size)), ratio)
    if op == "to_batch":
        shape, = need_lit("in_shape")
        if len(shape) == 3:
            raise UnsupportedOpError("the Keras source writer does not write to_batch of "
                                     "images yet; export this model to PyTorch or MXNet")
        x = "ops.reshape({}, {})".format(x, literal((-1,) + tuple(shape[1:])))
        return "ops.transpose({}, (0, 2, 3, 1))".format(x) if len(shape) == 4 else x
    if op == "upsample_nearest":
        factor, = need_lit("factor")
        return "ops.repeat(ops.repeat({}, {}, axis=1), {}, axis=2)".format(x, factor, factor)
    raise UnsupportedOpError("the Keras source writer does not write op {!r} yet; export this "
                             "model to PyTorch or MXNet".format(op))


_HELPERS = OrderedDict()
_HELPERS["avg_pool"] = '''
def avg_pool(x, pool_size, strides, padding):
    """Average pooling where each window divides by its cells inside the input."""
    ones = ops.ones_like(x[:1, :, :, :1])
    return ops.divide(ops.average_pool(pad(x, padding), pool_size, strides, padding="valid"),
                      ops.average_pool(pad(ones, padding), pool_size, strides, padding="valid"))
'''
_HELPERS["dropout"] = '''
def dropout(x, rate, training):
    """Inverted dropout in training, the identity otherwise."""
    return keras.random.dropout(x, rate) if training and rate else x
'''
_HELPERS["conv_lengths"] = '''
def conv_lengths(lengths, kernel, stride, padding, dilation):
    """Valid lengths after a convolution along time, at least 1."""
    before, after = padding
    return ops.maximum((lengths + (before + after - dilation * (kernel - 1) - 1)) // stride + 1,
                       1)
'''
_HELPERS["roi_align"] = '''
def roi_align(features, indices, weights, output_size, sampling_ratio):
    """RoIAlign from precomputed taps. features NHWC (N, H, W, C); indices and weights are
    (N, R, S, 4) and arrive NHWC as every value with three axes per example does
    ((N, S, 4, R)). Each of the S = oh * ow * sr * sr samples of a RoI is the bilinear mix of
    four feature cells (indices into its example's H * W cells); each bin averages its
    sr * sr samples. Returns (N, R, C, oh, ow)."""
    indices = ops.transpose(indices, (0, 3, 1, 2))
    weights = ops.transpose(weights, (0, 3, 1, 2))
    h, w, c = features.shape[1], features.shape[2], features.shape[3]
    rois = indices.shape[1]
    (oh, ow), sr = output_size, sampling_ratio
    offsets = ops.reshape(ops.arange(ops.shape(features)[0]) * (h * w), (-1, 1, 1, 1))
    cells = ops.reshape(ops.cast(indices, "int32") + offsets, (-1,))
    taps = ops.take(ops.reshape(features, (-1, c)), cells, axis=0)
    taps = taps * ops.reshape(ops.cast(weights, features.dtype), (-1, 1))
    out = ops.sum(ops.reshape(taps, (-1, rois, oh, ow, sr * sr * 4, c)), axis=4) / float(sr * sr)
    return ops.transpose(out, (0, 1, 4, 2, 3))
'''
_HELPERS["positional_encoding"] = '''
def positional_encoding(x):
    """Adds the sinusoid table to (N, T, D): PE[p, 2i] = sin(p / 10000^(2i/D)),
    PE[p, 2i+1] = cos(p / 10000^(2i/D)), computed in float64 and added in float32."""
    length, dim = x.shape[1], x.shape[2]
    position = np.arange(length, dtype=np.float64)[:, None]
    rate = np.power(10000.0, -np.arange(0, dim, 2, dtype=np.float64) / dim)
    table = np.zeros((length, dim), np.float64)
    table[:, 0::2] = np.sin(position * rate)
    table[:, 1::2] = np.cos(position * rate[: dim // 2])
    return x + table.astype(np.float32)
'''

_LAYER_HELPERS = OrderedDict()
_LAYER_HELPERS["MultiHeadAttention"] = '''
class MultiHeadAttention(layers.MultiHeadAttention):
    """keras.layers.MultiHeadAttention called with the tokens of its keys: keys whose token is
    pad_id, and with causal=True the keys after each query, are masked."""

    def __init__(self, num_heads, key_dim, dropout=0.0, causal=False, pad_id=0, **kwargs):
        super().__init__(num_heads, key_dim, dropout=dropout, **kwargs)
        self.causal, self.pad_id = causal, pad_id

    def build(self, query_shape, value_shape, tokens_shape=None):
        super().build(query_shape, value_shape)

    def call(self, query, value, tokens, training=None):
        keep = ops.not_equal(tokens, self.pad_id)[:, None, :]
        keep = ops.broadcast_to(keep, (ops.shape(query)[0], query.shape[1], value.shape[1]))
        return super().call(query, value, attention_mask=keep, use_causal_mask=self.causal,
                            training=training)
'''
_LAYER_HELPERS["TiedDense"] = '''
class TiedDense(layers.Layer):
    """A dense layer without bias whose kernel is an Embedding's table, transposed: one logit
    per row of the table (a tied output projection)."""

    def __init__(self, embedding, **kwargs):
        super().__init__(**kwargs)
        self.embedding = embedding

    def call(self, x):
        return ops.matmul(x, ops.transpose(self.embedding.embeddings))
'''
_LAYER_HELPERS["ChannelLayerNorm"] = '''
class ChannelLayerNorm(layers.Layer):
    """Normalises each NHWC example over (H, W, C) with one mean and (biased) variance, then
    scales and shifts per channel."""

    def __init__(self, epsilon=1e-5, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = epsilon

    def build(self, input_shape):
        self.gamma = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="gamma")
        self.beta = self.add_weight(shape=(input_shape[-1],), initializer="zeros", name="beta")

    def call(self, x):
        centred = x - ops.mean(x, axis=(1, 2, 3), keepdims=True)
        variance = ops.mean(ops.square(centred), axis=(1, 2, 3), keepdims=True)
        return centred * ops.rsqrt(variance + self.epsilon) * self.gamma + self.beta
'''
_LAYER_HELPERS["BatchStatisticsNorm"] = '''
class BatchStatisticsNorm(layers.Layer):
    """BatchNorm that keeps no running statistics: the batch's own mean and (biased) variance
    normalise it in training and in inference alike. Each statistic is a mean over W, then
    over the batch and H: two short float32 sums instead of one long one."""

    def __init__(self, epsilon=1e-5, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = epsilon

    def build(self, input_shape):
        self.gamma = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="gamma")
        self.beta = self.add_weight(shape=(input_shape[-1],), initializer="zeros", name="beta")

    def call(self, x):
        mean = ops.mean(ops.mean(x, axis=2), axis=(0, 1))
        variance = ops.mean(ops.mean(ops.square(x - mean), axis=2), axis=(0, 1))
        return (x - mean) * (self.gamma * ops.rsqrt(variance + self.epsilon)) + self.beta
'''
_LAYER_HELPERS["PaddedConv2D"] = '''
class PaddedConv2D(layers.Conv2D):
    """keras.layers.Conv2D whose padding may also be the pads ((top, bottom), (left, right))
    that neither 'same' nor 'valid' gives (PyTorch's symmetric pads on a stride-2
    convolution): those are handed to TensorFlow's convolution kernel as explicit paddings."""

    def __init__(self, filters, kernel_size, padding="valid", **kwargs):
        pads = None if isinstance(padding, str) else tuple(tuple(p) for p in padding)
        super().__init__(filters, kernel_size, padding="valid" if pads else padding, **kwargs)
        self.pads = pads

    def call(self, x):
        if self.pads is None:
            return super().call(x)
        (top, bottom), (left, right) = self.pads
        y = tf.nn.conv2d(x, self.kernel, (1,) + tuple(self.strides) + (1,),
                         [[0, 0], [top, bottom], [left, right], [0, 0]],
                         dilations=(1,) + tuple(self.dilation_rate) + (1,))
        return tf.nn.bias_add(y, self.bias) if self.use_bias else y

    def compute_output_shape(self, input_shape):
        if self.pads is None:
            return super().compute_output_shape(input_shape)
        sizes = [None if size is None else
                 (size + sum(pads) - rate * (kernel - 1) - 1) // stride + 1
                 for size, pads, kernel, stride, rate in zip(
                     input_shape[1:3], self.pads, self.kernel_size, self.strides,
                     self.dilation_rate)]
        return (input_shape[0], sizes[0], sizes[1], self.filters)

    def get_config(self):
        config = super().get_config()
        if self.pads is not None:
            config["padding"] = self.pads
        return config
'''
_RECURRENT = '''
class Recurrent(layers.Layer):
    """Stacked Keras recurrent layers over a padded (N, T, D) batch with each example's length:
    steps past a length are masked (they keep the state) and give 0; a bidirectional layer runs
    a go_backwards copy, so each sequence's backward pass starts at its own last step;
    merge='sum' adds the last layer's directions, else they are concatenated."""

    RNN = None   # the Keras layer of one direction
    GATES = ""   # the order of its gates in its fused kernels, as tbdzoo names them

    def __init__(self, units, num_layers=1, bidirectional=False, merge="concat", **kwargs):
        super().__init__(**kwargs)
        self.units, self.merge, self.directions = units, merge, 2 if bidirectional else 1
        self.rnns = [self.RNN(units, return_sequences=True, go_backwards=d == 1)
                     for _ in range(num_layers) for d in range(self.directions)]

    def call(self, x, lengths):
        mask = ops.arange(x.shape[1])[None, :] < ops.expand_dims(lengths, 1)
        keep = ops.cast(mask, x.dtype)[:, :, None]
        for start in range(0, len(self.rnns), self.directions):
            outs = [self.rnns[start](x, mask=mask) * keep]
            if self.directions == 2:   # go_backwards gives its outputs last step first
                outs.append(ops.flip(self.rnns[start + 1](x, mask=mask), axis=1) * keep)
            last = start + self.directions == len(self.rnns)
            if len(outs) == 1:
                x = outs[0]
            else:
                x = outs[0] + outs[1] if last and self.merge == "sum" else \\
                    ops.concatenate(outs, axis=-1)
        return x

    def canonical(self, name, array):
        """The variable, the index of its part and the value of tbdzoo's per-gate parameter
        ``name`` (``l0.fw.w_i``: layer 0, forward, input weights (units, in) of gate i)."""
        layer, direction, suffix = name.split(".")
        cell = self.rnns[int(layer[1:]) * self.directions + ("fw", "bw").index(direction)].cell
        kind, gate = suffix.split("_")
        h = self.units
        if kind in ("w", "u"):
            columns = slice(self.GATES.index(gate) * h, (self.GATES.index(gate) + 1) * h)
            variable = cell.kernel if kind == "w" else cell.recurrent_kernel
            return variable, (slice(None), columns), array.T
        return self.bias(cell, gate, array)
'''
_LAYER_HELPERS["Recurrent"] = _RECURRENT
_LAYER_HELPERS["LSTM"] = '''
class LSTM(Recurrent):
    """keras.layers.LSTM, stacked, with lengths (see Recurrent)."""

    RNN = layers.LSTM
    GATES = "ifgo"

    def bias(self, cell, gate, array):
        i = self.GATES.index(gate)
        return cell.bias, slice(i * self.units, (i + 1) * self.units), array
'''
_LAYER_HELPERS["GRU"] = '''
class GRU(Recurrent):
    """keras.layers.GRU (reset after the recurrent matmul), stacked, with lengths (see
    Recurrent). Keras orders the gates z, r, n; the input biases are its bias[0], the
    recurrent bias of n (b_hn) its bias[1] (those of z and r are 0)."""

    RNN = layers.GRU
    GATES = "zrn"

    def bias(self, cell, gate, array):
        row, gate = (1, "n") if gate == "hn" else (0, gate[-1])
        i = self.GATES.index(gate)
        return cell.bias, (row, slice(i * self.units, (i + 1) * self.units)), array
'''
_LAYER_HELPERS["AdditiveAttention"] = '''
class AdditiveAttention(layers.Layer):
    """Bahdanau attention: keras.layers.AdditiveAttention (its scale the spec's v) on the
    projected queries and memory keys, e[t, s] = v . tanh(W_q q_t + W_m m_s), masked past each
    memory's length; returns sum_s softmax_s(e)[t, s] m_s."""

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.w_query = layers.Dense(units, use_bias=False)
        self.w_memory = layers.Dense(units, use_bias=False)
        self.score = layers.AdditiveAttention()

    def call(self, query, memory, lengths):
        valid = ops.arange(memory.shape[1])[None, :] < ops.expand_dims(lengths, 1)
        return self.score([self.w_query(query), memory, self.w_memory(memory)],
                          mask=[None, valid])

    def canonical(self, name, array):
        """The variable, index (None: all) and value of tbdzoo's parameter ``name``."""
        if name == "v":
            return self.score.scale, None, array
        return getattr(self, name).kernel, None, array.T
'''
_LAYER_HELPERS["SequenceBatchNorm"] = '''
class SequenceBatchNorm(layers.Layer):
    """BatchNorm of the features of (N, T, D) with each example's length: in training the
    statistics of the valid steps normalise (and move the moving ones, momentum the weight of
    the old, the variance unbiased), in inference the moving ones; padded steps give 0."""

    def __init__(self, momentum=0.99, epsilon=1e-3, **kwargs):
        super().__init__(**kwargs)
        self.momentum, self.epsilon = momentum, epsilon

    def build(self, x_shape, lengths_shape=None):
        size = (x_shape[-1],)
        self.gamma = self.add_weight(shape=size, initializer="ones", name="gamma")
        self.beta = self.add_weight(shape=size, initializer="zeros", name="beta")
        self.moving_mean = self.add_weight(shape=size, initializer="zeros", name="moving_mean",
                                           trainable=False)
        self.moving_variance = self.add_weight(shape=size, initializer="ones",
                                               name="moving_variance", trainable=False)

    def call(self, x, lengths, training=None):
        mask = ops.arange(x.shape[1])[None, :] < ops.expand_dims(lengths, 1)
        keep = ops.cast(mask, x.dtype)[:, :, None]
        if training:
            count = ops.sum(keep)
            mean = ops.sum(x * keep, axis=(0, 1)) / count
            variance = ops.sum(ops.square((x - mean) * keep), axis=(0, 1)) / count
            m = self.momentum
            unbiased = variance * count / ops.maximum(count - 1.0, 1.0)
            self.moving_mean.assign(m * self.moving_mean + (1.0 - m) * mean)
            self.moving_variance.assign(m * self.moving_variance + (1.0 - m) * unbiased)
        else:
            mean, variance = self.moving_mean, self.moving_variance
        y = (x - mean) * (self.gamma * ops.rsqrt(variance + self.epsilon)) + self.beta
        return y * keep
'''
_LAYER_HELPERS["FrozenBatchNorm"] = '''
class FrozenBatchNorm(layers.Layer):
    """BatchNorm with fixed statistics and affine parameters (none trained), the same in
    training and inference: x * scale + shift, scale = gamma / sqrt(moving_variance + eps)."""

    def __init__(self, epsilon=1e-5, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = epsilon

    def build(self, input_shape):
        for name, fill in (("gamma", "ones"), ("beta", "zeros"), ("moving_mean", "zeros"),
                           ("moving_variance", "ones")):
            setattr(self, name, self.add_weight(shape=(input_shape[-1],), initializer=fill,
                                                name=name, trainable=False))

    def call(self, x):
        scale = self.gamma * ops.rsqrt(self.moving_variance + self.epsilon)
        return x * scale + (self.beta - self.moving_mean * scale)
'''
_LAYER_HELPERS["LayerList"] = '''
class LayerList(layers.Layer):
    """Layers numbered 0, 1, ... (tbdzoo's ``encoder.0``), reached as self[i]."""

    def __init__(self, items, **kwargs):
        super().__init__(**kwargs)
        self.items = list(items)

    def __getitem__(self, index):
        return self.items[index]
'''

_LOAD = '''
def _find(model, path):
    """The layer at tbdzoo's module path (``layer1.0.conv1``)."""
    layer = model
    for part in path.split("."):
        layer = _child(layer, part)
    return layer


def _child(layer, part):
    if part.isdigit():
        return layer.layers[int(part)] if isinstance(layer, keras.Sequential) else \\
            layer[int(part)]
    return getattr(layer, RENAMED.get(part, part))


def _native(model, name, array):
    """The Keras variable holding tbdzoo's parameter ``name``, the index of the part of it
    that parameter is (None: all of it) and the array in the variable's layout. A layer with a
    ``canonical`` method maps the names below it itself."""
    layer, parts = model, name.split(".")
    while len(parts) > 1 and not (hasattr(layer, "canonical") and not isinstance(
            getattr(layer, parts[0], None), layers.Layer)):
        layer = _child(layer, parts.pop(0))
    suffix = ".".join(parts)
    if hasattr(layer, "canonical"):
        return layer.canonical(suffix, array)
    if isinstance(layer, layers.Conv2D):
        return (layer.kernel, None, array.transpose(2, 3, 1, 0)) if suffix == "weight" else \\
            (layer.bias, None, array)
    if isinstance(layer, layers.Dense):
        return (layer.kernel, None, array.T) if suffix == "weight" else (layer.bias, None, array)
    if isinstance(layer, layers.Embedding):
        return layer.embeddings, None, array
    if isinstance(layer, layers.MultiHeadAttention):   # W_q (out, in) -> (in, heads, size)
        heads, size = layer.num_heads, layer.key_dim
        dense = {"q": layer.query_dense, "k": layer.key_dense, "v": layer.value_dense,
                 "o": layer.output_dense}[suffix[-1]]
        if suffix == "W_o":
            return dense.kernel, None, array.T.reshape(heads, size, -1)
        if suffix.startswith("W"):
            return dense.kernel, None, array.T.reshape(-1, heads, size)
        return dense.bias, None, array if suffix == "b_o" else array.reshape(heads, size)
    names = {"running_mean": "moving_mean", "running_var": "moving_variance"}
    return getattr(layer, names.get(suffix, suffix)), None, array


def load(model, path):
    """Loads tbdzoo's canonical weights file (.npz) into ``model`` (built first by a call on
    zeros): convolution kernels OIHW -> HWIO, dense weights (out, in) -> kernels (in, out)."""
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files if k != "__manifest__"}
    model(*[np.zeros((1,) + shape, dtype) for shape, dtype in INPUT_SHAPES])
    for part, shapes in PARTS:   # parts call() does not reach are built on their own
        _find(model, part)(*[np.zeros((1,) + shape, dtype) for shape, dtype in shapes])
    values = {}   # id -> [variable, its new value]: parts of a fused variable not in the file are 0
    for name, array in arrays.items():
        variable, index, value = _native(model, name, array)
        entry = values.setdefault(id(variable), [variable, np.zeros(variable.shape, "float32")])
        if index is None:
            entry[1] = value
        else:
            entry[1][index] = value
    for variable, value in values.values():
        variable.assign(value)
    done = set(values)
    missing = [v.path for v in model.weights if id(v) not in done]
    if missing:
        raise ValueError("{} does not fit this model: nothing in the file for {}".format(
            path, missing))
    return model
'''


def _tied_members(cls, plan):
    """Member path -> the expression of a layer that uses another's parameters: the owner
    itself where it is the same kind of layer, a TiedDense reading an Embedding's table."""
    g, out = plan.graph, OrderedDict()
    ties = OrderedDict()
    for layer, suffix, owner, owner_suffix in cls.ties:
        ties.setdefault(layer, []).append((suffix, owner, owner_suffix))
    order = list(cls.members)
    for layer, shared in ties.items():
        node, owners = g.nodes[layer], set(o for _, o, _ in shared)
        owner = shared[0][1]
        own = set(g.param_names(node)) - set(s for s, _, _ in shared)
        owner_node = g.nodes[owner]
        if len(owners) != 1 or layer not in cls.members or owner not in cls.members or \
                order.index(owner) > order.index(layer):
            raise UnsupportedOpError("the Keras source writer shares parameters only with a "
                                     "layer built before ({} reads {})".format(layer, owner))
        if not own and node.op == owner_node.op and all(s == o for s, _, o in shared) and \
                _constructor(cls.members[layer]) == _constructor(cls.members[owner]):
            out[layer] = _ref(cls, owner)
        elif node.op == "dense" and owner_node.op == "embedding" and not own and \
                shared == [("weight", owner, "weight")]:
            out[layer] = "TiedDense({})".format(_ref(cls, owner))
        else:
            raise UnsupportedOpError("the Keras source writer does not share {}'s parameters "
                                     "{} with {} ({})".format(layer, [s for s, _, _ in shared],
                                                              owner, owner_node.op))
    return out


def _write_class(cls, lines, plan):
    if cls.base == "list":
        base = "LayerList"
    else:
        base = "keras.Model" if cls is plan.root else "layers.Layer"
    lines.add("class {}({}):".format(cls.name, base)).indent()
    lines.add('"""' + class_doc(cls, plan, _root_doc) + '"""').add()
    params = params_in_call_order(cls)
    lines.add("def __init__({}):".format(", ".join(["self"] + [p.name for p in params]
                                                  + ["**kwargs"])))
    lines.indent()
    tied = _tied_members(cls, plan)
    members = members_in_order(cls)
    if cls.base == "list":
        items = [m for m in members if "." not in m.path]
        if any(m.optional is not None for m in items):
            raise UnsupportedOpError("the Keras source writer has no optional items in a list "
                                     "of layers ({})".format(cls.name))
        texts = [_member_expr(m, 1) for m in items]
        inline = "super().__init__([{}], **kwargs)".format(", ".join(texts))
        if len(inline) <= 88 and "\n" not in inline:
            lines.add(inline)
        else:
            lines.add("super().__init__([")
            lines.add("    " + ",\n    ".join(texts) + ",")
            lines.add("], **kwargs)")
        members = [m for m in members if "." in m.path]
    else:
        lines.add("super().__init__(**kwargs)")
    for p in params:
        if p.call:
            lines.add("self.{0} = {0}".format(p.name))
    for m in members:
        expr = tied[m.path] if m.path in tied else _member_expr(m)
        if m.optional is not None:
            expr = "{} if {} else None".format(expr, m.optional.name)
        lines.add("{} = {}{}".format(_ref(cls, m.path), expr,
                                     "  # shared" if m.path in tied else ""))
    lines.dedent().add()
    lines.add("def call({}):".format(", ".join(["self"] + cls.inputs + ["training=None"])))
    lines.indent()
    add_forward(cls, lines, lambda step: _op(step, set()), _layer_call,
                "{}({}, training=training)", _ref)
    lines.dedent().dedent().add().add()


def _used(plan):
    """The layer classes written into the file and the helper functions the ops need."""
    types, helpers = used_names(plan, _op)
    for cls in plan.classes:
        if cls.base == "list":
            types.add("LayerList")
        if cls.ties:
            types.update(e.split("(")[0] for e in _tied_members(cls, plan).values())
    if types & {"LSTM", "GRU"}:
        types.add("Recurrent")
    return types, helpers


def _nhwc(shape):
    return tuple(shape[1:]) + (shape[0],) if len(shape) == 3 else tuple(shape)


def _is_image(graph, name):
    """Whether an input with three axes per example is read by a convolution or pooling."""
    return any(name in node.inputs[:1] and node.op in ("conv2d", "maxpool2d", "avgpool2d")
               for node in graph.nodes.values())


def _root_doc(cls, plan):
    g = plan.graph
    written = set(g.program.written_inputs()) if g.program is not None else set()
    out = ["{}, as tbdzoo's specification builds it.".format(cls.kind), "",
           "Called with ({}):".format(", ".join(cls.inputs))]
    for name, node in zip(cls.inputs, cls.input_nodes):
        inp = g.inputs[node]
        notes = [] if len(inp.shape) != 3 else ["NHWC"] if _is_image(g, node) else \
            ["the spec's ({}), channels last as an image's".format(
                ", ".join(str(d) for d in inp.shape))]
        if node in written:
            notes.append("from the targets step")
        line = "  {}: {} of shape (N, {})".format(
            name, inp.dtype, ", ".join(str(d) for d in _nhwc(inp.shape))).replace(", )", ")")
        note = " ({})".format("; ".join(notes)) if notes else ""
        out.extend([line + note] if len(line + note) <= 88 else [line, "   " + note])
    out.append("and returns {} of shape (N, {}).".format(
        g.output, ", ".join(str(d) for d in _nhwc(g.shape_of(g.output)))).replace(", )", ")"))
    if any(node in written for node in cls.input_nodes):
        out.append("The targets step is a function you supply between the parts (tbdzoo's "
                   "is NumPy code in")
        out.append("tbdzoo.models.{}); it reads the parts' outputs.".format(g.name))
    for path, block in getattr(plan, "parts", ()):
        out.append("Also a part of the model, not called by call(): self.{}({}) -> {}."
                   .format(path, ", ".join(block.inputs), ", ".join(block.outputs)))
    return "\n".join(out) + "\n"


def write(plan, model_name, config, version):
    root = plan.root
    g = plan.graph
    lines = Lines()
    add_title(lines, "Keras", model_name, version, config, root)
    lines.add("    out = model({})   # images NHWC".format(", ".join(root.inputs)))
    lines.add("")
    lines.add("Layers sit where tbdzoo's parameter names say (``layer1.0.conv1`` is")
    lines.add("model.layer1.layers[0].conv1; a name Keras keeps for itself gets a trailing _,")
    lines.add("see RENAMED). Needs only Keras (with TensorFlow) and NumPy.")
    lines.add('"""')
    types, helpers = _used(plan)
    lines.add("import keras")
    lines.add("import numpy as np")
    if "PaddedConv2D" in types:   # TensorFlow's kernel for pads Keras' padding cannot give
        lines.add("import tensorflow as tf")
    lines.add("from keras import layers, ops").add()
    shapes = tuple((_nhwc(g.inputs[n].shape), g.inputs[n].dtype) for n in root.input_nodes)
    lines.add("INPUTS = {}".format(literal(tuple(root.inputs))))
    lines.add("INPUT_SHAPES = {}  # per example, with dtypes".format(literal(shapes)))
    parts = tuple((path, tuple((_nhwc(g.shape_of(i)), g.dtype_of(i)) for i in block.inputs))
                  for path, block in getattr(plan, "parts", ()))
    lines.add("PARTS = {}  # members call() does not reach, with their inputs".format(
        literal(parts)))
    renamed = sorted(set(part for cls in plan.classes for m in all_members(cls)
                         for part in m.path.split(".") if part in _KERAS_ATTRIBUTES))
    lines.add("# tbdzoo's names of layers that Keras keeps for itself -> the attributes they are")
    lines.add("RENAMED = {{{}}}".format(", ".join("{!r}: {!r}".format(r, r + "_")
                                                  for r in renamed))).add().add()
    lines.add('''def pad(x, padding, value=0.0):
    """Pads ((top, bottom), (left, right)) around an NHWC image."""
    (top, bottom), (left, right) = padding
    return ops.pad(x, [[0, 0], [top, bottom], [left, right], [0, 0]], constant_values=value)''')
    lines.add().add()
    add_texts(lines, _HELPERS, helpers)
    add_texts(lines, _LAYER_HELPERS, types)
    for cls in plan.classes:
        _write_class(cls, lines, plan)
    add_build(lines, root, _LOAD)
    return lines.text()
