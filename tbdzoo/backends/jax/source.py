"""Flax NNX source of a model: one ``nnx.Module`` class per block kind, Flax's own layers.

Writes text only (JAX is not imported here): tbdzoo/export/ plans the classes, this module says
what each layer and op is in Flax. The formulas follow this backend's ops.py and layers.py, so
the written model computes what the backend computes: values in the spec's layouts (images
(N, C, H, W)), ``nnx.Conv`` channels-last between two transposes, pooling by
``jax.lax.reduce_window``, the BatchNorm whose running variance moves towards the unbiased
batch variance (a small subclass of ``nnx.BatchNorm`` written into the file), -1e9 on masked
attention logits, LSTM and GRU as one ``jax.lax.scan`` per layer and direction (Flax's
``nnx.LSTMCell``; a GRU cell with the spec's reset gate, which ``nnx.GRUCell`` does not have).
"""
from collections import OrderedDict

from ...errors import UnsupportedOpError
from ...export.code import (
    Lines,
    add_forward,
    add_members,
    add_texts,
    add_title,
    arguments,
    call_arguments,
    class_doc,
    compress,
    is_lit,
    lit,
    literal,
    member_ref,
    pair,
    params_in_call_order,
    root_doc,
    scaled_call,
    used_names,
    value,
)
from ...export.plan import attribute_slots, renamed_slots

FRAMEWORK = "Flax"
EXTENSION = ".py"

_TYPES = {"conv2d": "Conv2d", "dense": "nnx.Linear", "embedding": "nnx.Embed",
          "layernorm": "nnx.LayerNorm", "channel_layernorm": "nnx.LayerNorm",
          "batchnorm": "BatchNorm", "multi_head_attention": "MultiHeadAttention",
          "frozen_batchnorm": "FrozenBatchNorm", "lstm": "LSTM", "gru": "GRU",
          "additive_attention": "AdditiveAttention", "sequence_batchnorm": "SequenceBatchNorm"}
_OTHERS = "PyTorch, TensorFlow, MXNet or CNTK"

# Where a tied layer keeps the parameter another layer owns, by the spec's suffix.
_TIED_ATTRIBUTE = {("nnx.Embed", "weight"): "embedding", ("TiedLinear", "weight"): "weight"}


def _unsupported(what, op, name):
    return UnsupportedOpError(
        "the Flax source writer has no {} for op {!r} ({}) yet; export this model to {}, or run "
        "it on the jax backend itself".format(what, op, name, _OTHERS))


def _padding(pads):
    pads = tuple(tuple(p) for p in pads)
    flat = set(p for pair in pads for p in pair)
    return flat.pop() if len(flat) == 1 else pads


def layer_type(graph, node):
    if node.op == "dense" and "weight" in node.attrs.get("shared", {}):
        return "TiedLinear"
    if node.op not in _TYPES:
        raise _unsupported("layer", node.op, node.name)
    return _TYPES[node.op]


# The constructors' arguments, by the spec's names (tbdzoo/export/plan.py: spec_slots)
_SLOT_NAMES = {
    "conv2d": "in_features=in_channels out_features=filters kernel_size=kernel strides=stride "
              "padding kernel_dilation=dilation feature_group_count=groups use_bias",
    "batchnorm": "num_features=channels momentum epsilon=eps tracks=track_running_stats",
    "sequence_batchnorm": "num_features=channels momentum epsilon=eps "
                          "tracks=track_running_stats",
    "frozen_batchnorm": "num_features=channels epsilon=eps",
    "dense": "in_features out_features=units use_bias",
    "embedding": "num_embeddings=vocab features=dim scale",
    "layernorm": "num_features=channels epsilon=eps",
    "channel_layernorm": "num_features=channels epsilon=eps"}
_CONVERT = {"kernel": tuple, "stride": pair, "padding": _padding, "dilation": pair}


def layer_slots(graph, node):
    """The constructor's values of the layer computing ``node``."""
    layer_type(graph, node)
    return renamed_slots(graph, node, _SLOT_NAMES, _CONVERT)


def op_slots(graph, node):
    """The attributes an op's code reads (each may differ between instances of a class)."""
    if node.op not in _OPS:
        raise _unsupported("code", node.op, node.name)
    return attribute_slots(node)


# -- layers -----------------------------------------------------------------------------------
_DEFAULTS = {"strides": 1, "kernel_dilation": 1, "feature_group_count": 1,
             "use_bias": True, "tracks": True, "dropout": 0.0, "causal": False, "pad_id": 0,
             "num_layers": 1, "bidirectional": False, "merge": "concat"}
_POSITIONAL = {"conv2d": 3, "dense": 2, "embedding": 2, "batchnorm": 1, "frozen_batchnorm": 1,
               "layernorm": 1, "channel_layernorm": 1, "multi_head_attention": 2,
               "sequence_batchnorm": 1, "lstm": 2, "gru": 2, "additive_attention": 3}
_EXTRA = {"layernorm": "use_fast_variance=False",
          "channel_layernorm": "reduction_axes=(1, 2, 3), feature_axes=1, "
                               "use_fast_variance=False"}


def _constructor(member):
    """``Conv2d(8, 16, (3, 3), strides=2, use_bias=False, rngs=rngs)``: keywords left out
    at their defaults."""
    values = [(k, v) for k, v in member.values.items() if k != "scale"]
    parts = arguments(values, _POSITIONAL[member.op], _DEFAULTS)
    if member.op in _EXTRA:
        parts.append(_EXTRA[member.op])
    if member.op != "frozen_batchnorm":
        parts.append("rngs=rngs")
    return "{}({})".format(member.type, ", ".join(parts))


def _member_expr(member, depth=0):
    """The expression building ``member``: a layer, a block (its class, given ``rngs``) or an
    ``nnx.Sequential`` of them (runs of equal items written once)."""
    if member.kind == "layer":
        return _constructor(member)
    if member.kind == "block":
        args = call_arguments(member.cls, member.values)
        return "{}({}rngs=rngs)".format(member.cls.name, args + ", " if args else "")
    items = compress([_member_expr(i, depth + 1) for i in member.items])
    texts = [t if n == 1 else "*({} for _ in range({}))".format(t, n) for t, n in items]
    inline = "nnx.Sequential({})".format(", ".join(texts))
    if len(inline) <= 72:
        return inline
    pad = "    " * (depth + 1)
    return "nnx.Sequential(\n{}{},\n{})".format(pad, (",\n" + pad).join(texts), "    " * depth)


def _layer_call(cls, member, ins):
    ref = member_ref(cls, member.path)
    op = member.op
    if op == "embedding":
        return scaled_call(ref, ins[0], member.values["scale"])
    return "{}({})".format(ref, ", ".join(ins))


# -- ops --------------------------------------------------------------------------------------
def _dropout_name(step):
    return step.path.replace(".", "_")


def _op(step, helpers):
    """The expression computing an op step (adding any helper it needs to ``helpers``)."""
    op, v, ins = step.op, step.values, step.ins

    def val(name):
        return value(v[name], True)
    x = ins[0] if ins else None
    if op == "relu":
        return "jax.nn.relu({})".format(x)
    if op == "add":
        return " + ".join(ins)
    if op == "maxpool2d":
        helpers.add("pool2d")
        return "max_pool2d({}, {}, {}, {})".format(x, val("kernel"), val("stride"),
                                                  val("padding"))
    if op == "avgpool2d":
        helpers.add("pool2d")
        return "avg_pool2d({}, {}, {}, {}, {})".format(x, val("kernel"), val("stride"),
                                                      val("padding"), val("count_include_pad"))
    if op == "global_avgpool":
        return "{}.mean(axis=(2, 3))".format(x)
    if op == "flatten":
        return "{0}.reshape({0}.shape[0], -1)".format(x)
    if op == "positional_encoding":
        helpers.add("positional_encoding")
        return "positional_encoding({})".format(x)
    if op == "dropout":
        return "self.{}({})".format(_dropout_name(step), x)
    if op == "concat":
        axis = str(lit(v["axis"]) + 1) if is_lit(v["axis"]) else val("axis") + " + 1"
        return "jnp.concatenate([{}], axis={})".format(", ".join(ins), axis)
    if op == "tanh":
        return "jnp.tanh({})".format(x)
    if op == "upsample_nearest":
        return "jnp.repeat(jnp.repeat({0}, {1}, axis=2), {1}, axis=3)".format(x, val("factor"))
    if op == "reshape":
        if is_lit(v["shape"]):
            return "{0}.reshape({0}.shape[0], {1})".format(
                x, ", ".join(str(d) for d in lit(v["shape"])))
        return "{0}.reshape(({0}.shape[0],) + tuple({1}))".format(x, val("shape"))
    if op == "scale":
        return "{} * {}".format(x, val("factor"))
    if op == "stop_gradient":
        return "jax.lax.stop_gradient({})".format(x)
    if op == "ones_like":
        return "jnp.ones_like({})".format(x)
    if op == "lerp":
        return "{2}.reshape(({2}.shape[0],) + (1,) * ({0}.ndim - 1)) * {0} + (1.0 - {2}.reshape(({2}.shape[0],) + (1,) * ({0}.ndim - 1))) * {1}".format(*ins)  # noqa: E501
    if op == "clipped_relu":
        return "jnp.where({0} <= 0.0, 0.0, jnp.where({0} >= {1}, {1}, {0}))".format(
            x, val("ceiling"))
    if op == "transpose":
        if is_lit(v["perm"]):
            return "jnp.transpose({}, (0, {}))".format(
                x, ", ".join(str(i + 1) for i in lit(v["perm"])))
        return "jnp.transpose({}, (0,) + tuple(i + 1 for i in {}))".format(x, val("perm"))
    if op == "roi_align":
        helpers.add("roi_align")
        return "roi_align({}, {}, {}, {}, {})".format(ins[0], ins[1], ins[2],
                                                     val("output_size"), val("sampling_ratio"))
    if op == "lengths_after_conv":
        helpers.add("conv_lengths")
        return "conv_lengths({}, {}, {}, {}, {})".format(x, val("kernel"), val("stride"),
                                                        val("padding"), val("dilation"))
    if op == "to_batch":
        return "{0}.reshape(({0}.shape[0] * {0}.shape[1],) + {0}.shape[2:])".format(x)
    raise _unsupported("code", op, step.node.name if step.node is not None else step.path)


_OPS = {"relu", "add", "maxpool2d", "avgpool2d", "global_avgpool", "flatten",
        "positional_encoding", "dropout", "concat", "tanh", "upsample_nearest", "reshape",
        "scale", "stop_gradient", "ones_like", "lerp", "clipped_relu", "transpose", "roi_align",
        "to_batch", "lengths_after_conv"}


# -- helpers written into the file, as needed ----------------------------------------------------
_HELPERS = OrderedDict()
_HELPERS["pool2d"] = '''
def max_pool2d(x, kernel, stride, padding):
    """Max-pooling of (N, C, H, W) where padded cells never win."""
    padding = ((0, 0), (0, 0)) + tuple(tuple(p) for p in padding)
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1) + tuple(kernel),
                                 (1, 1) + tuple(stride), padding)


def avg_pool2d(x, kernel, stride, padding, count_include_pad):
    """Average pooling of (N, C, H, W); without count_include_pad each window divides by its
    cells inside the input."""
    window, strides = (1, 1) + tuple(kernel), (1, 1) + tuple(stride)
    padding = ((0, 0), (0, 0)) + tuple(tuple(p) for p in padding)
    total = jax.lax.reduce_window(x, 0.0, jax.lax.add, window, strides, padding)
    if count_include_pad:
        return total / float(kernel[0] * kernel[1])
    ones = jnp.ones((1, 1) + x.shape[2:], x.dtype)
    return total / jax.lax.reduce_window(ones, 0.0, jax.lax.add, window, strides, padding)
'''
_HELPERS["positional_encoding"] = '''
def positional_encoding(x):
    """Adds the sinusoid table: PE[p, 2i] = sin(p / 10000^(2i/D)), PE[p, 2i+1] = cos(...),
    computed in float64 and rounded to float32."""
    length, dim = x.shape[1], x.shape[2]
    position = np.arange(length, dtype=np.float64)[:, None]
    rate = np.power(10000.0, -np.arange(0, dim, 2, dtype=np.float64) / dim)
    table = np.zeros((length, dim))
    table[:, 0::2] = np.sin(position * rate)
    table[:, 1::2] = np.cos(position * rate[: dim // 2])
    return x + jnp.asarray(table.astype(np.float32), x.dtype)
'''
_HELPERS["conv_lengths"] = '''
def conv_lengths(lengths, kernel, stride, padding, dilation):
    """Valid lengths after a convolution along time, at least 1."""
    before, after = padding
    return jnp.maximum((lengths + (before + after - dilation * (kernel - 1) - 1)) // stride + 1, 1)
'''
_HELPERS["roi_align"] = '''
def roi_align(features, indices, weights, output_size, sampling_ratio):
    """RoIAlign from precomputed taps: indices and weights (N, R, S, 4), S = oh * ow * sr * sr
    samples per RoI, each the bilinear mix of four feature cells; each bin averages its sr * sr
    samples. Gathered per image (jax.vmap); (N, R, C, oh, ow)."""
    n, c = features.shape[:2]
    (oh, ow), sr = output_size, sampling_ratio
    rois = indices.shape[1]

    def one(flat, idx, w):   # (C, HW), (R, S, 4), (R, S, 4) -> (R, C, S)
        return jnp.transpose((flat[:, idx] * w[None]).sum(axis=-1), (1, 0, 2))
    out = jax.vmap(one)(features.reshape(n, c, -1), indices, weights.astype(features.dtype))
    return out.reshape(n, rois, c, oh, ow, sr * sr).mean(axis=-1)
'''
_LAYER_HELPERS = OrderedDict()
_LAYER_HELPERS["Conv2d"] = '''
class Conv2d(nnx.Conv):
    """nnx.Conv on (N, C, H, W) values: channels-last inside, between two transposes (XLA
    folds those of neighbouring layers)."""

    def __call__(self, x):
        return jnp.transpose(super().__call__(jnp.transpose(x, (0, 2, 3, 1))), (0, 3, 1, 2))
'''
_LAYER_HELPERS["BatchNorm"] = '''
class BatchNorm(nnx.BatchNorm):
    """nnx.BatchNorm over axis 1 (the channels of (N, C, ...)) with PyTorch's running update:
    in training the batch's mean and biased variance normalise, and the running statistics
    move by ``momentum`` towards the batch mean and the unbiased batch variance. Without
    running statistics (tracks=False) the batch's own normalise in inference too. Computed
    with the channels moved last, as the convolutions around it run."""

    def __init__(self, num_features, momentum=0.1, epsilon=1e-5, tracks=True, *, rngs):
        super().__init__(num_features, axis=1, momentum=1.0 - momentum, epsilon=epsilon,
                         use_fast_variance=False, rngs=rngs)
        self.tracks = tracks
        if not tracks:
            del self.mean, self.var

    def __call__(self, x, use_running_average=None, *, mask=None):
        running = self.use_running_average if use_running_average is None \\
            else use_running_average
        x = jnp.moveaxis(x, 1, -1)
        axes = tuple(range(x.ndim - 1))
        if running and self.tracks:
            mean, var = self.mean[...], self.var[...]
        else:
            # one pass: the sums of x - k, k one of the channel's values (shifted data)
            k = jax.lax.stop_gradient(x[(0,) * len(axes)])
            d = x - k
            shifted = d.mean(axis=axes)
            var = jnp.maximum((d * d).mean(axis=axes) - shifted * shifted, 0.0)
            mean = k + shifted
            if self.tracks and not running:
                n = x.size // x.shape[-1]
                keep = self.momentum
                self.mean[...] = keep * self.mean[...] + (1.0 - keep) * \\
                    jax.lax.stop_gradient(mean)
                self.var[...] = keep * self.var[...] + (1.0 - keep) * \\
                    jax.lax.stop_gradient(var * (n / max(n - 1, 1)))
        inv = self.scale[...] * jax.lax.rsqrt(var + self.epsilon)
        return jnp.moveaxis((x - mean) * inv + self.bias[...], -1, 1)
'''
_LAYER_HELPERS["FrozenBatchNorm"] = '''
class FrozenBatchNorm(nnx.Module):
    """BatchNorm with fixed statistics and affine parameters (nnx.BatchStat, not trained),
    the same in training and inference: x * scale + shift over axis 1,
    scale = gamma / sqrt(running_var + eps)."""

    def __init__(self, num_features, epsilon=1e-5):
        for name, fill in (("scale", 1.0), ("bias", 0.0), ("mean", 0.0), ("var", 1.0)):
            setattr(self, name, nnx.BatchStat(jnp.full((num_features,), fill, jnp.float32)))
        self.epsilon = epsilon

    def __call__(self, x):
        shape = (1, -1) + (1,) * (x.ndim - 2)
        scale = self.scale[...] * jax.lax.rsqrt(self.var[...] + self.epsilon)
        shift = self.bias[...] - self.mean[...] * scale
        return x * scale.reshape(shape) + shift.reshape(shape)
'''
_LAYER_HELPERS["TiedLinear"] = '''
class TiedLinear(nnx.Module):
    """y = x W^T + b, W of shape (out, in): the embedding table of another layer once tied
    (``self.generator.weight = self.embed.embedding``); the bias is its own."""

    def __init__(self, in_features, out_features, use_bias=True, *, rngs):
        self.weight = nnx.Param(jnp.zeros((out_features, in_features), jnp.float32))
        self.bias = nnx.Param(jnp.zeros((out_features,), jnp.float32)) if use_bias else None

    def __call__(self, x):
        y = x @ self.weight[...].T
        return y + self.bias[...] if self.bias is not None else y
'''
_LAYER_HELPERS["MultiHeadAttention"] = '''
class MultiHeadAttention(nnx.Module):
    """Multi-head attention on batch-first (N, T, D) values: four nnx.Linear projections;
    heads split the features in order; keys whose token is pad_id, and with causal=True the
    keys after each query, get the logit -1e9; scores scaled by 1 / sqrt(D / heads)."""

    def __init__(self, d_model, num_heads, dropout=0.0, causal=False, pad_id=0, *, rngs):
        for name in ("query", "key", "value", "out"):
            setattr(self, name, nnx.Linear(d_model, d_model, rngs=rngs))
        self.dropout = nnx.Dropout(dropout, rngs=rngs)
        self.num_heads, self.causal, self.pad_id = num_heads, causal, pad_id

    def __call__(self, query, source, tokens):
        n, t, d = query.shape
        s, h = source.shape[1], self.num_heads

        def heads(x, layer, length):
            return layer(x).reshape(n, length, h, d // h).transpose(0, 2, 1, 3)
        q, k, v = heads(query, self.query, t), heads(source, self.key, s), \\
            heads(source, self.value, s)
        bias = jnp.where(tokens == self.pad_id, -1e9, 0.0)[:, None, None, :]
        if self.causal:
            later = np.triu(np.ones((t, s), bool), 1)
            bias = jnp.where(later[None, None], -1e9, bias)
        logits = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d // h) + bias
        weights = self.dropout(jax.nn.softmax(logits, axis=-1))
        return self.out((weights @ v).transpose(0, 2, 1, 3).reshape(n, t, d))
'''

_LOAD = '''
def _transposed(w):
    return w.T


def _conv_kernel(w):   # (F, C / groups, kh, kw) -> (kh, kw, C / groups, F)
    return w.transpose(2, 3, 1, 0)


# Per layer class: the spec's parameter suffix -> (the variable's path in the layer, the
# canonical array's change to the layer's layout).
_NORM = {"gamma": ("scale", None), "beta": ("bias", None), "running_mean": ("mean", None),
         "running_var": ("var", None)}
LAYOUTS = {
    nnx.Conv: {"weight": ("kernel", _conv_kernel), "bias": ("bias", None)},
    nnx.Linear: {"weight": ("kernel", _transposed), "bias": ("bias", None)},
    nnx.Embed: {"weight": ("embedding", None)},
    nnx.LayerNorm: _NORM,
    nnx.BatchNorm: _NORM,
}{written}
def _child(module, part):
    if part.isdigit():
        return (module.layers if isinstance(module, nnx.Sequential) else module)[int(part)]
    return getattr(module, part)


def _variable(model, name):
    """The variable holding canonical parameter ``name`` and the change to its layout, or
    (None, None)."""
    parts = name.split(".")
    module = model
    for i, part in enumerate(parts):
        table = next((LAYOUTS[c] for c in type(module).__mro__ if c in LAYOUTS), None)
        suffix = ".".join(parts[i:])
        if table is not None and suffix in table:
            path, change = table[suffix]
            var = module
            for attr in path.split("."):
                var = getattr(var, attr)
            return var, change
        try:
            module = _child(module, part)
        except (AttributeError, IndexError, TypeError):
            return None, None
    return None, None


def load(model, path):
    """Loads tbdzoo's canonical weights file (.npz) into ``model``: every array of the file
    into its variable, or ValueError naming what does not match."""
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files if k != "__manifest__"}
    loaded, unused = set(), []
    for name, array in sorted(arrays.items()):
        var, change = _variable(model, name)
        if var is None:
            unused.append(name)
            continue
        array = change(array) if change is not None else array
        if tuple(var[...].shape) != array.shape:
            raise ValueError("{}: {} has shape {}, the model's {}".format(
                path, name, array.shape, tuple(var[...].shape)))
        var.set_value(jnp.asarray(array, jnp.float32))
        loaded.add(id(var))
    missing = ["/".join(str(p) for p in at) for at, var in nnx.iter_graph(model)
               if isinstance(var, (nnx.Param, nnx.BatchStat)) and id(var) not in loaded]
    if missing or unused:
        raise ValueError("{} does not fit this model: nothing in the file for {}; not in the "
                         "model: {}".format(path, missing or "-", unused or "-"))
    return model
'''
_SEQUENCES = '''
def valid(lengths, t):
    """(N, T) True where the step is inside the example's length."""
    return jnp.arange(t)[None, :] < lengths[:, None]
'''
_RECURRENT = '''
def _reverse_within(x, lengths):
    """Each example's first ``length`` steps reversed, the padding where it is."""
    steps = jnp.arange(x.shape[1])[None, :]
    index = jnp.where(steps < lengths[:, None], lengths[:, None] - 1 - steps, steps)
    return jnp.take_along_axis(x, index[:, :, None], axis=1)


def _scan(cell, x, lengths, reverse):
    """(N, T, H): ``cell`` over each example's steps (reversed within its length)."""
    if reverse:
        x = _reverse_within(x, lengths)
    _, ys = jax.lax.scan(cell, cell.zero_carry(x.shape[0], x.dtype), jnp.swapaxes(x, 0, 1))
    ys = jnp.swapaxes(ys, 0, 1)
    return _reverse_within(ys, lengths) if reverse else ys


class Direction(nnx.Module):
    """The cells of one layer, by direction (fw, and bw when bidirectional)."""

    def __init__(self, cells):
        for name, cell in cells.items():
            setattr(self, name, cell)


class Recurrent(nnx.Module):
    """A stack of num_layers recurrent layers (l0, l1, ...) over a padded batch-first (N, T, D)
    batch with each example's length, a cell per direction, one jax.lax.scan each; the
    backward direction runs each example's valid steps reversed, outputs past a length are 0;
    the last layer's directions concatenated, or added (merge='sum')."""

    CELL = None

    def __init__(self, input_size, hidden_size, num_layers=1, bidirectional=False,
                 merge="concat", *, rngs):
        self.num_layers, self.merge = num_layers, merge
        self.directions = ("fw", "bw") if bidirectional else ("fw",)
        for layer in range(num_layers):
            size = input_size if layer == 0 else hidden_size * len(self.directions)
            setattr(self, "l{}".format(layer), Direction(
                {d: self.CELL(size, hidden_size, rngs=rngs) for d in self.directions}))

    def __call__(self, x, lengths):
        mask = valid(lengths, x.shape[1])[:, :, None]
        for layer in range(self.num_layers):
            cells = getattr(self, "l{}".format(layer))
            outs = [_scan(getattr(cells, d), x, lengths, d == "bw") * mask
                    for d in self.directions]
            if layer == self.num_layers - 1 and self.merge == "sum":
                x = sum(outs[1:], outs[0])
            else:
                x = jnp.concatenate(outs, axis=-1)
        return x
'''
_CELLS = {"LSTM": '''
class LSTMCell(nnx.LSTMCell):
    """Flax's nnx.LSTMCell (gates i, f, g, o; c' = f c + i g, h' = o tanh(c')) from a zero
    carry."""

    def zero_carry(self, n, dtype):
        zeros = jnp.zeros((n, self.hidden_features), dtype)
        return zeros, zeros


class LSTM(Recurrent):
    CELL = LSTMCell
''', "GRU": '''
class GRUCell(nnx.Module):
    """r = s(W_r x + U_r h + b_r), z = s(W_z x + U_z h + b_z),
    n = tanh(W_n x + b_in + r (U_n h + b_hn)), h' = (1 - z) n + z h: the reset gate after the
    recurrent product, with its own bias b_hn (which nnx.GRUCell does not have)."""

    def __init__(self, in_features, hidden_features, *, rngs):
        self.ir = nnx.Linear(in_features, hidden_features, rngs=rngs)
        self.iz = nnx.Linear(in_features, hidden_features, rngs=rngs)
        self.in_ = nnx.Linear(in_features, hidden_features, rngs=rngs)
        self.hr = nnx.Linear(hidden_features, hidden_features, use_bias=False, rngs=rngs)
        self.hz = nnx.Linear(hidden_features, hidden_features, use_bias=False, rngs=rngs)
        self.hn = nnx.Linear(hidden_features, hidden_features, rngs=rngs)
        self.hidden_features = hidden_features

    def __call__(self, carry, x):
        r = jax.nn.sigmoid(self.ir(x) + self.hr(carry))
        z = jax.nn.sigmoid(self.iz(x) + self.hz(carry))
        n = jnp.tanh(self.in_(x) + r * self.hn(carry))
        h = (1.0 - z) * n + z * carry
        return h, h

    def zero_carry(self, n, dtype):
        return jnp.zeros((n, self.hidden_features), dtype)


class GRU(Recurrent):
    CELL = GRUCell
'''}
_LAYER_HELPERS["AdditiveAttention"] = '''
class AdditiveAttention(nnx.Module):
    """Bahdanau attention without biases: e[t, s] = v . tanh(W_q q_t + W_m m_s), -1e9 past
    each memory's length, softmax over s; returns sum_s alpha[t, s] m_s."""

    def __init__(self, query_size, memory_size, units, *, rngs):
        self.query = nnx.Linear(query_size, units, use_bias=False, rngs=rngs)
        self.memory = nnx.Linear(memory_size, units, use_bias=False, rngs=rngs)
        self.v = nnx.Param(jnp.zeros((units,), jnp.float32))

    def __call__(self, query, memory, lengths):
        keys, queries = self.memory(memory), self.query(query)
        scores = jnp.tanh(queries[:, :, None, :] + keys[:, None, :, :]) @ self.v[...]
        scores = jnp.where(valid(lengths, memory.shape[1])[:, None, :], scores, -1e9)
        return jax.nn.softmax(scores, axis=-1) @ memory
'''
_LAYER_HELPERS["SequenceBatchNorm"] = '''
class SequenceBatchNorm(nnx.BatchNorm):
    """nnx.BatchNorm over the features of (N, T, D), statistics over the batch's valid steps
    only, PyTorch's running update (variance unbiased over the valid steps); padded steps
    give 0."""

    def __init__(self, num_features, momentum=0.1, epsilon=1e-5, tracks=True, *, rngs):
        super().__init__(num_features, momentum=1.0 - momentum, epsilon=epsilon,
                         use_fast_variance=False, rngs=rngs)
        self.tracks = tracks
        if not tracks:
            del self.mean, self.var

    def __call__(self, x, lengths, use_running_average=None):
        running = self.use_running_average if use_running_average is None \\
            else use_running_average
        keep = valid(lengths, x.shape[1])[:, :, None].astype(x.dtype)
        if running and self.tracks:
            mean, var = self.mean[...], self.var[...]
        else:
            count = keep.sum()
            mean = (x * keep).sum(axis=(0, 1)) / count
            var = (((x - mean) ** 2) * keep).sum(axis=(0, 1)) / count
            if self.tracks and not running:
                m = self.momentum
                self.mean[...] = m * self.mean[...] + (1.0 - m) * jax.lax.stop_gradient(mean)
                unbiased = var * count / jnp.maximum(count - 1.0, 1.0)
                self.var[...] = m * self.var[...] + (1.0 - m) * jax.lax.stop_gradient(unbiased)
        y = (x - mean) * (self.scale[...] * jax.lax.rsqrt(var + self.epsilon)) + self.bias[...]
        return y * keep
'''
_LSTM_LAYOUT = '''{
    "{}_{}".format(kind, g): ("{}{}.{}".format(side, name, attr), change)
    for g, name in (("i", "i"), ("f", "f"), ("g", "g"), ("o", "o"))
    for kind, side, attr, change in (("w", "i", "kernel", _transposed),
                                     ("u", "h", "kernel", _transposed), ("b", "h", "bias", None))}
LAYOUTS[LSTMCell]["w_f"] = ("if_.kernel", _transposed)   # nnx.LSTMCell's name for i-f'''
_GRU_LAYOUT = '''{
    "w_r": ("ir.kernel", _transposed), "w_z": ("iz.kernel", _transposed),
    "w_n": ("in_.kernel", _transposed), "u_r": ("hr.kernel", _transposed),
    "u_z": ("hz.kernel", _transposed), "u_n": ("hn.kernel", _transposed),
    "b_r": ("ir.bias", None), "b_z": ("iz.bias", None), "b_in": ("in_.bias", None),
    "b_hn": ("hn.bias", None)}'''
_WRITTEN_LAYOUTS = OrderedDict([
    ("LSTMCell", _LSTM_LAYOUT), ("GRUCell", _GRU_LAYOUT),
    ("AdditiveAttention", '{"w_query": ("query.kernel", _transposed), '
                          '"w_memory": ("memory.kernel", _transposed), "v": ("v", None)}'),
    ("TiedLinear", '{"weight": ("weight", None), "bias": ("bias", None)}'),
    ("FrozenBatchNorm", "_NORM"),
    ("MultiHeadAttention", '{"{}_{}".format(kind, k): (name + "." + attr, change)\n'
                           '                            for k, name in (("q", "query"), '
                           '("k", "key"), ("v", "value"), ("o", "out"))\n'
                           '                            for kind, attr, change in '
                           '(("W", "kernel", _transposed), ("b", "bias", None))}')])


def _tie(plan, layer, suffix):
    member_type = layer_type(plan.graph, plan.graph.nodes[layer])
    if (member_type, suffix) not in _TIED_ATTRIBUTE:
        raise UnsupportedOpError(
            "the Flax source writer cannot tie parameter {!r} of {} ({}) to another layer's "
            "yet; export this model to {}".format(suffix, layer, member_type, _OTHERS))
    return _TIED_ATTRIBUTE[(member_type, suffix)]


def _write_class(cls, lines, plan):
    base = "nnx.List" if cls.base == "list" else "nnx.Module"
    lines.add("class {}({}):".format(cls.name, base)).indent()
    lines.add('"""' + class_doc(cls, plan, _root_doc) + '"""').add()
    params = params_in_call_order(cls)
    sig = ", ".join(["self"] + [p.name for p in params] + ["*", "rngs"])
    lines.add("def __init__({}):".format(sig)).indent()
    if cls.base == "list":
        lines.add("super().__init__()")
    for p in params:
        if p.call:
            lines.add("self.{0} = {0}".format(p.name))
    add_members(cls, lines, _member_expr, "self.append({})")
    for step in cls.steps:
        if step.kind == "op" and step.op == "dropout":
            lines.add("self.{} = nnx.Dropout({}, rngs=rngs)".format(
                _dropout_name(step), value(step.values["rate"])))
    for layer, suffix, owner, owner_suffix in cls.ties:
        lines.add("{}.{} = {}.{}  # shared".format(
            member_ref(cls, layer), _tie(plan, layer, suffix),
            member_ref(cls, owner), _native_param(plan, owner, owner_suffix)))
    lines.dedent().add()
    lines.add("def __call__({}):".format(", ".join(["self"] + cls.inputs))).indent()
    add_forward(cls, lines, lambda step: _op(step, set()), _layer_call)
    lines.dedent().dedent().add().add()


def _native_param(plan, layer, suffix):
    node = plan.graph.nodes[layer]
    table = {"embedding": {"weight": "embedding"}, "dense": {"weight": "kernel"},
             "layernorm": {"gamma": "scale", "beta": "bias"}}
    if node.op != "embedding" or suffix != "weight":
        raise UnsupportedOpError(
            "the Flax source writer ties layers only to an embedding's table yet, not to {} "
            "of {} ({}); export this model to {}".format(suffix, layer, node.op, _OTHERS))
    return table[node.op][suffix]


def _root_doc(cls, plan):
    return root_doc(cls, plan, "__call__")


def write(plan, model_name, config, version):
    """The whole source file of ``plan``."""
    used_types, helpers = used_names(plan, _op)
    lines = Lines()
    root = plan.root
    add_title(lines, "Flax NNX", model_name, version, config, root,
              "{}(rngs=...) with tbdzoo's weights file, in eval mode")
    lines.add("    out = model({})".format(", ".join(root.inputs)))
    lines.add("")
    lines.add("Values are in tbdzoo's layouts (images (N, C, H, W)); Conv2d, an nnx.Conv, computes "
              "channels-last")
    lines.add("between two transposes. model.train() selects batch statistics and dropout, "
              "model.eval()")
    lines.add("running statistics. Needs only JAX, Flax and NumPy.")
    lines.add('"""')
    lines.add("import jax")
    lines.add("import jax.numpy as jnp")
    lines.add("import numpy as np  # noqa: F401")
    lines.add("from flax import nnx").add()
    lines.add("# float32 matrix products and convolutions at full precision (on a GPU JAX's "
              "default")
    lines.add("# rounds their inputs to TF32 or bfloat16)")
    lines.add('jax.config.update("jax_default_matmul_precision", "highest")').add()
    lines.add("INPUTS = {}".format(literal(tuple(root.inputs)))).add().add()
    add_texts(lines, _HELPERS, helpers)
    if used_types & {"LSTM", "GRU", "AdditiveAttention", "SequenceBatchNorm"}:
        lines.add(_SEQUENCES.strip("\n")).add().add()
    if used_types & set(_CELLS):
        lines.add(_RECURRENT.strip("\n")).add().add()
    add_texts(lines, _CELLS, used_types)
    add_texts(lines, _LAYER_HELPERS, used_types)
    for cls in plan.classes:
        _write_class(cls, lines, plan)
    written = ""
    cells = set(c + "Cell" for c in _CELLS if c in used_types)
    for name, table in _WRITTEN_LAYOUTS.items():
        if name in used_types | cells:
            written += "\nLAYOUTS[{}] = {}".format(name, table)
    lines.add(_LOAD.strip("\n").replace("{written}", written)).add().add()
    lines.add("def build(weights=None, seed=0):")
    lines.indent()
    lines.add('"""A new {} in eval mode, holding tbdzoo\'s .npz file ``weights`` if given."""'
              .format(root.name))
    lines.add("model = {}(rngs=nnx.Rngs(seed))".format(root.name))
    lines.add("if weights is not None:")
    lines.indent().add("load(model, weights)").dedent()
    lines.add("model.eval()")
    lines.add("return model")
    lines.dedent()
    return lines.text()
