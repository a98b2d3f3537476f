"""MXNet Gluon source of a model: ``gluon.nn`` blocks in one HybridBlock class per block kind.

Writes text only (MXNet is not imported here): tbdzoo/export/ plans the classes, this module
says what each layer and op is in Gluon, with the formulas of this backend's ops.py (NCHW
activations, max-pool padding filled with float32's lowest value, masked attention logits set
to -1e9, BatchNorm's momentum as Gluon counts it: the weight of the old statistics).
LSTM and GRU are HybridBlocks on MXNet's fused ``RNN`` operator, as recurrent.py runs them:
``gluon.rnn.LSTM``/``GRU`` name their parameters otherwise and, on the CPU, neither reverse a
backward direction within each length nor zero the padded steps.
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

FRAMEWORK = "MXNet Gluon"
EXTENSION = ".py"
LOWEST_FLOAT32 = -3.4028234663852886e+38

_TYPES = {"conv2d": "nn.Conv2D", "dense": "nn.Dense", "embedding": "nn.Embedding",
          "layernorm": "nn.LayerNorm", "batchnorm": "nn.BatchNorm",
          "multi_head_attention": "MultiHeadAttention", "channel_layernorm": "ChannelLayerNorm",
          "frozen_batchnorm": "FrozenBatchNorm", "lstm": "LSTM", "gru": "GRU",
          "additive_attention": "AdditiveAttention", "sequence_batchnorm": "SequenceBatchNorm"}


def _refuse(node):
    raise UnsupportedOpError("the MXNet source writer does not write op {!r} ({}) yet; export "
                             "this model to PyTorch".format(node.op, node.name))


def layer_type(graph, node):
    if node.op == "batchnorm" and not node.attrs["track_running_stats"]:
        return "BatchStatisticsNorm"
    if node.op not in _TYPES:
        _refuse(node)
    return _TYPES[node.op]


# The constructors' arguments, by the spec's names (tbdzoo/export/plan.py: spec_slots)
_SLOT_NAMES = {
    "conv2d": "channels=filters kernel_size=kernel strides=stride padding dilation groups "
              "use_bias in_channels",
    "batchnorm": "momentum epsilon=eps in_channels=channels",
    "sequence_batchnorm": "in_channels=channels epsilon=eps",
    "frozen_batchnorm": "in_channels=channels epsilon=eps",
    "dense": "units use_bias in_units=in_features",
    "embedding": "input_dim=vocab output_dim=dim scale",
    "layernorm": "epsilon=eps in_channels=channels",
    "channel_layernorm": "num_channels=channels eps"}
_STATISTICS_NAMES = dict(_SLOT_NAMES, batchnorm="in_channels=channels epsilon=eps")
_CONVERT = {"kernel": pair, "stride": pair, "dilation": pair,
            "padding": layer_padding,
            "momentum": lambda momentum: 1.0 - momentum}   # Gluon's: the old statistics' weight


def layer_slots(graph, node):
    layer_type(graph, node)
    tracked = node.op != "batchnorm" or node.attrs["track_running_stats"]
    s = renamed_slots(graph, node, _SLOT_NAMES if tracked else _STATISTICS_NAMES, _CONVERT)
    if node.op == "conv2d" and symmetric(node.attrs["padding"]) is None:
        (t, b), (left, r) = node.attrs["padding"]
        s["pad"] = Slot((0, 0, 0, 0, t, b, left, r), "pad", call=True)
    return s


def op_slots(graph, node):
    out = attribute_slots(node)
    if node.op in ("positional_encoding", "roi_align"):
        out["in_shape"] = Slot(tuple(graph.shape_of(node.inputs[0])), "in_shape", call=True)
    return out


# -- layers -----------------------------------------------------------------------------------
_DEFAULTS = {"strides": 1, "padding": 0, "dilation": 1, "groups": 1, "use_bias": True,
             "epsilon": 1e-5, "momentum": 0.9, "dropout": 0.0, "causal": False, "pad_id": 0,
             "eps": 1e-5, "num_layers": 1, "bidirectional": False, "merge": "concat"}
_POSITIONAL = {"conv2d": 2, "dense": 1, "embedding": 2, "batchnorm": 0, "frozen_batchnorm": 1,
               "layernorm": 0, "multi_head_attention": 2, "channel_layernorm": 1, "lstm": 2,
               "gru": 2, "additive_attention": 3, "sequence_batchnorm": 1}


def _constructor(member, shares=None):
    """The Gluon layer's constructor; ``shares``: the member whose parameters it uses."""
    if shares is not None:
        text = _constructor(member)
        return "{}, prefix={}.prefix, params={}.collect_params())".format(text[:-1], shares,
                                                                         shares)
    values = [(k, v) for k, v in member.values.items() if k not in ("pad", "scale")]
    if member.type == "BatchStatisticsNorm":
        return "BatchStatisticsNorm({}, eps={})".format(value(member.values["in_channels"]),
                                                        value(member.values["epsilon"]))
    parts = arguments(values, _POSITIONAL[member.op], _DEFAULTS)
    if member.op == "dense":
        parts.append("flatten=False")
    if member.op == "batchnorm":
        parts.insert(0, "axis=1")
    if member.op == "layernorm":
        parts.insert(0, "axis=-1")
    return "{}({})".format(member.type, ", ".join(parts))


def _layer_call(cls, member, ins):
    ref = member_ref(cls, member.path)
    if member.op == "conv2d" and "pad" in member.values:
        return "{}(F.pad({}, mode=\"constant\", constant_value=0.0, pad_width={}))".format(
            ref, ins[0], value(member.values["pad"], True))
    if member.op == "embedding":
        return scaled_call(ref, ins[0], member.values["scale"])
    return "{}({})".format(ref, ", ".join(ins))


def _member_expr(member, depth=0):
    """The expression building ``member``."""
    return member_expr(member, _constructor, "sequential(", ")", "*({} for _ in range({}))", depth)


# -- ops --------------------------------------------------------------------------------------
def _op(step, helpers, constants):
    op, v, ins = step.op, step.values, step.ins

    def val(name):
        return value(v[name], True)

    def need_lit(*names):
        for n in names:
            if not is_lit(v[n]):
                raise UnsupportedOpError(
                    "the MXNet source writer needs {} of op {!r} to be the same in every "
                    "instance of a class".format(n, op))
        return [lit(v[n]) for n in names]
    x = ins[0] if ins else None
    if op == "relu":
        return "F.Activation({}, act_type=\"relu\")".format(x)
    if op == "add":
        return " + ".join(ins)
    if op in ("maxpool2d", "avgpool2d"):
        kernel, stride, padding = need_lit("kernel", "stride", "padding")
        sym = symmetric(padding)
        explicit = sym is None or 2 * max(sym) > min(kernel)
        kw = "kernel={}, stride={}".format(literal(tuple(kernel)), literal(tuple(stride)))
        if op == "maxpool2d":
            if explicit:
                (t, b), (left, r) = padding
                x = "F.pad({}, mode=\"constant\", constant_value={!r}, pad_width={})".format(
                    x, LOWEST_FLOAT32, literal((0, 0, 0, 0, t, b, left, r)))
                sym = (0, 0)
            return "F.Pooling({}, {}, pad={}, pool_type=\"max\", pooling_convention=\"valid\")"\
                .format(x, kw, literal(tuple(sym)))
        include, = need_lit("count_include_pad")
        if not explicit:
            return ("F.Pooling({}, {}, pad={}, pool_type=\"avg\", count_include_pad={}, "
                    "pooling_convention=\"valid\")").format(x, kw, literal(tuple(sym)), include)
        helpers.add("avg_pool2d")
        return "avg_pool2d(F, {}, {}, {}, {}, {})".format(
            x, literal(tuple(kernel)), literal(tuple(stride)), literal(padding), include)
    if op == "global_avgpool":
        return "F.reshape(F.Pooling({}, kernel=(1, 1), global_pool=True, pool_type=\"avg\"), " \
               "shape=(0, -1))".format(x)
    if op == "flatten":
        return "F.reshape({}, shape=(0, -1))".format(x)
    if op == "positional_encoding":
        length, dim = need_lit("in_shape")[0]
        helpers.add("sinusoid_table")
        name = "pe_table_{}x{}".format(length, dim)
        constants[name] = "sinusoid_table({}, {})".format(length, dim)
        return "F.broadcast_add({}, F.expand_dims({}, axis=0))".format(x, name)
    if op == "dropout":
        return "F.Dropout({}, p={})".format(x, val("rate"))
    if op == "concat":
        axis = str(lit(v["axis"]) + 1) if is_lit(v["axis"]) else val("axis") + " + 1"
        return "F.concat({}, dim={})".format(", ".join(ins), axis)
    if op == "tanh":
        return "F.tanh({})".format(x)
    if op == "upsample_nearest":
        f = val("factor")
        return "F.repeat(F.repeat({}, repeats={}, axis=2), repeats={}, axis=3)".format(x, f, f)
    if op == "reshape":
        shape, = need_lit("shape")
        return "F.reshape({}, shape={})".format(x, literal((-1,) + tuple(shape)))
    if op == "scale":
        return "{} * {}".format(x, val("factor"))
    if op == "stop_gradient":
        return "F.BlockGrad({})".format(x)
    if op == "ones_like":
        return "F.ones_like({})".format(x)
    if op == "transpose":
        perm, = need_lit("perm")
        return "F.transpose({}, axes={})".format(x, literal((0,) + tuple(i + 1 for i in perm)))
    if op == "roi_align":
        helpers.add("roi_align")
        shape, size, sr = need_lit("in_shape", "output_size", "sampling_ratio")
        return "roi_align(F, {}, {}, {}, {}, {}, {})".format(
            ins[0], ins[1], ins[2], literal(tuple(shape)), literal(tuple(size)), sr)
    if op == "to_batch":
        return "F.reshape({}, shape=(-3, -2))".format(x)
    if op == "clipped_relu":
        c = val("ceiling")
        return "F.Activation({0}, act_type=\"relu\") * ({0} < {1}) + {1} * ({0} >= {1})".format(
            x, c)
    if op == "lengths_after_conv":
        helpers.add("conv_lengths")
        return "conv_lengths(F, {}, {}, {}, {}, {})".format(x, val("kernel"), val("stride"),
                                                           val("padding"), val("dilation"))
    raise UnsupportedOpError("the MXNet source writer does not write op {!r} ({}) yet; export "
                             "this model to PyTorch".format(
                                 op, step.node.name if step.node is not None else step.path))


_HELPERS = OrderedDict()
_HELPERS["sinusoid_table"] = '''
def sinusoid_table(length, dim):
    """PE[p, 2i] = sin(p / 10000^(2i/D)), PE[p, 2i+1] = cos(...), in float64, kept float32."""
    position = np.arange(length, dtype=np.float64)[:, None]
    rate = np.power(10000.0, -np.arange(0, dim, 2, dtype=np.float64) / dim)
    table = np.zeros((length, dim), np.float64)
    table[:, 0::2] = np.sin(position * rate)
    table[:, 1::2] = np.cos(position * rate[: dim // 2])
    return table.astype(np.float32)
'''
_HELPERS["avg_pool2d"] = '''
def avg_pool2d(F, x, kernel, stride, padding, count_include_pad):
    """Average pooling with any padding: without count_include_pad each window divides by
    its cells inside the input."""
    (t, b), (left, r) = padding
    x = F.pad(x, mode="constant", constant_value=0.0, pad_width=(0, 0, 0, 0, t, b, left, r))
    if count_include_pad:
        return F.Pooling(x, kernel=kernel, stride=stride, pool_type="avg",
                         pooling_convention="valid")
    ones = F.pad(F.ones_like(F.slice_axis(F.slice_axis(x, axis=0, begin=0, end=1), axis=1,
                                          begin=0, end=1)), mode="constant",
                 constant_value=0.0, pad_width=(0, 0, 0, 0, t, b, left, r))
    summed = F.Pooling(x, kernel=kernel, stride=stride, pool_type="sum",
                       pooling_convention="valid")
    counts = F.Pooling(ones, kernel=kernel, stride=stride, pool_type="sum",
                       pooling_convention="valid")
    return F.broadcast_div(summed, counts)
'''
_HELPERS["roi_align"] = '''
def roi_align(F, features, indices, weights, shape, output_size, sampling_ratio):
    """RoIAlign from precomputed taps: indices and weights (N, R, S, 4), S = oh * ow * sr * sr
    samples per RoI, each the bilinear mix of four feature cells (indices into one example's
    H * W cells); each bin averages its sr * sr samples. Returns (N, R, C, oh, ow)."""
    (c, h, w), (oh, ow), sr = shape, output_size, sampling_ratio
    rows = F.reshape(F.transpose(features, axes=(0, 2, 3, 1)), shape=(-1, c))
    offsets = F.contrib.arange_like(indices, axis=0) * float(h * w)
    flat = F.broadcast_add(F.reshape(F.cast(indices, "float32"), shape=(0, -1)),
                           F.reshape(offsets, shape=(-1, 1)))
    taps = F.take(rows, flat, axis=0)
    taps = F.broadcast_mul(taps, F.reshape(weights, shape=(0, -1, 1)))
    out = F.sum(F.reshape(taps, shape=(0, -1, oh, ow, sr * sr * 4, c)), axis=4)
    return F.transpose(out / float(sr * sr), axes=(0, 1, 4, 2, 3))
'''
_HELPERS["conv_lengths"] = '''
def conv_lengths(F, lengths, kernel, stride, padding, dilation):
    """The valid steps left of each float32 length after a convolution along time; at least 1."""
    before, after = padding
    out = F.floor((lengths + (before + after - dilation * (kernel - 1) - 1)) / stride) + 1
    return F.BlockGrad(F.maximum(out, 1.0))
'''
_LAYER_HELPERS = OrderedDict()
_LAYER_HELPERS["MultiHeadAttention"] = '''
class MultiHeadAttention(gluon.HybridBlock):
    """Multi-head attention over (N, T, D) queries and (N, S, D) keys and values: the keys
    whose token is pad_id, and with causal=True the keys after each query, have their logits
    set to -1e9 before the softmax; scores are scaled by 1 / sqrt(D / num_heads)."""

    def __init__(self, d_model, num_heads, dropout=0.0, causal=False, pad_id=0):
        super().__init__()
        self.d_model, self.num_heads = d_model, num_heads
        self.dropout, self.causal, self.pad_id = dropout, causal, pad_id
        for k in ("q", "k", "v", "o"):
            setattr(self, "W_" + k, self.params.get("W_" + k, shape=(d_model, d_model)))
            setattr(self, "b_" + k, self.params.get("b_" + k, shape=(d_model,), init="zeros"))

    def hybrid_forward(self, F, query, source, tokens, W_q, W_k, W_v, W_o, b_q, b_k, b_v, b_o):
        d, h = self.d_model, self.num_heads

        def heads(x, w, b):
            x = F.reshape(F.FullyConnected(x, w, b, num_hidden=d, flatten=False),
                          shape=(0, 0, h, -1))
            return F.reshape(F.transpose(x, axes=(0, 2, 1, 3)), shape=(-3, 0, 0))
        q, k, v = heads(query, W_q, b_q), heads(source, W_k, b_k), heads(source, W_v, b_v)
        scores = F.batch_dot(q, k, transpose_b=True) / math.sqrt(d // h)
        scores = F.reshape(scores, shape=(-4, -1, h, 0, 0))
        masked = F.reshape(tokens == self.pad_id, shape=(0, 1, 1, -1))
        if self.causal:
            steps = F.contrib.arange_like(query, axis=1)
            later = F.broadcast_greater(F.reshape(steps, shape=(1, -1)),
                                        F.reshape(steps, shape=(-1, 1)))
            masked = F.broadcast_maximum(masked, F.expand_dims(F.expand_dims(later, 0), 0))
        scores = F.broadcast_add(F.broadcast_mul(scores, 1.0 - masked), masked * -1e9)
        weights = F.softmax(scores, axis=-1)
        if self.dropout:
            weights = F.Dropout(weights, p=self.dropout)
        context = F.batch_dot(F.reshape(weights, shape=(-3, 0, 0)), v)
        context = F.reshape(context, shape=(-4, -1, h, 0, 0))
        context = F.reshape(F.transpose(context, axes=(0, 2, 1, 3)), shape=(0, 0, -1))
        return F.FullyConnected(context, W_o, b_o, num_hidden=d, flatten=False)
'''
_LAYER_HELPERS["ChannelLayerNorm"] = '''
class ChannelLayerNorm(gluon.HybridBlock):
    """Normalises each (C, H, W) example with one mean and (biased) variance, then scales and
    shifts per channel."""

    def __init__(self, num_channels, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.gamma = self.params.get("gamma", shape=(num_channels,), init="ones")
        self.beta = self.params.get("beta", shape=(num_channels,), init="zeros")

    def hybrid_forward(self, F, x, gamma, beta):
        centred = F.broadcast_sub(x, F.mean(x, axis=(1, 2, 3), keepdims=True))
        variance = F.mean(F.square(centred), axis=(1, 2, 3), keepdims=True)
        y = F.broadcast_mul(centred, F.rsqrt(variance + self.eps))
        return F.broadcast_add(F.broadcast_mul(y, F.reshape(gamma, shape=(1, -1, 1, 1))),
                               F.reshape(beta, shape=(1, -1, 1, 1)))
'''
_LAYER_HELPERS["BatchStatisticsNorm"] = '''
class BatchStatisticsNorm(gluon.HybridBlock):
    """BatchNorm that keeps no running statistics: the batch's own mean and biased variance
    normalise it in training and in inference alike."""

    def __init__(self, in_channels, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.gamma = self.params.get("gamma", shape=(in_channels,), init="ones")
        self.beta = self.params.get("beta", shape=(in_channels,), init="zeros")

    def hybrid_forward(self, F, x, gamma, beta):
        mean = F.mean(x, axis=(0, 2, 3), keepdims=True)
        centred = F.broadcast_sub(x, mean)
        variance = F.mean(F.square(centred), axis=(0, 2, 3), keepdims=True)
        y = F.broadcast_mul(centred, F.rsqrt(variance + self.eps))
        return F.broadcast_add(F.broadcast_mul(y, F.reshape(gamma, shape=(1, -1, 1, 1))),
                               F.reshape(beta, shape=(1, -1, 1, 1)))
'''
_LAYER_HELPERS["FrozenBatchNorm"] = '''
class FrozenBatchNorm(gluon.HybridBlock):
    """BatchNorm with fixed statistics and affine parameters (not trained): x * scale + shift,
    scale = gamma / sqrt(running_var + eps)."""

    def __init__(self, in_channels, epsilon=1e-5):
        super().__init__()
        self.eps = epsilon
        for name, init in (("gamma", "ones"), ("beta", "zeros"), ("running_mean", "zeros"),
                           ("running_var", "ones")):
            setattr(self, name, self.params.get(name, shape=(in_channels,), init=init,
                                                grad_req="null"))

    def hybrid_forward(self, F, x, gamma, beta, running_mean, running_var):
        scale = gamma * F.rsqrt(running_var + self.eps)
        shift = beta - running_mean * scale
        return F.broadcast_add(F.broadcast_mul(x, F.reshape(scale, shape=(1, -1, 1, 1))),
                               F.reshape(shift, shape=(1, -1, 1, 1)))
'''
_RECURRENT = '''
class {name}(gluon.HybridBlock):
    """{what} over a padded batch-first (N, T, D) batch with each example's float32 length, on
    MXNet's fused RNN operator. Parameters are per gate ({gates}), per layer and direction
    (``l0.fw.w_{first}``: input weight, ``u_``: recurrent weight, ``b_``: bias). A backward
    direction runs on each example reversed within its length; outputs past a length are 0;
    merge="sum" adds the last layer's two directions, "concat" concatenates them."""

    def __init__(self, input_size, hidden_size, num_layers=1, bidirectional=False,
                 merge="concat"):
        super().__init__()
        self.hidden_size, self.num_layers = hidden_size, num_layers
        self.bidirectional, self.merge = bidirectional, merge
        directions = ("fw", "bw") if bidirectional else ("fw",)
        self.cells = []
        for layer in range(num_layers):
            width = input_size if layer == 0 else hidden_size * len(directions)
            for d in directions:
                cell = "l{{}}.{{}}.".format(layer, d)
                self.cells.append(cell)
                for gate in {gate_names}:
                    self._add(cell + "w_" + gate, (hidden_size, width))
                    self._add(cell + "u_" + gate, (hidden_size, hidden_size))
                for bias in {bias_names}:
                    self._add(cell + bias, (hidden_size,))

    def _add(self, name, shape):
        setattr(self, name, self.params.get(name, shape=shape, init="zeros"))

    def _fused(self, F, x, cells, p):
        """One fused call over ``cells`` (stacked layers of one direction), time-major."""
        weights, biases = [], []
        for c in cells:
            weights += [F.reshape(p[c + "w_" + g], shape=(-1,)) for g in {gate_names}]
            weights += [F.reshape(p[c + "u_" + g], shape=(-1,)) for g in {gate_names}]
            biases += {biases}
        flat = F._internal._rnn_param_concat(*(weights + biases), dim=0)
        first = F.slice_axis(F.slice_axis(x, axis=0, begin=0, end=1), axis=2, begin=0, end=1)
        state = F.broadcast_axis(F.zeros_like(first), axis=(0, 2),
                                 size=(len(cells), self.hidden_size))
        return F.RNN(x, flat, *[state] * {states}, state_size=self.hidden_size,
                     num_layers=len(cells), mode="{mode}", state_outputs=False)

    def hybrid_forward(self, F, x, lengths, **p):
        x = F.swapaxes(x, dim1=0, dim2=1)   # (T, N, D): the operator's layout
        if not self.bidirectional:
            out = self._fused(F, x, self.cells, p)
        else:
            for layer in range(self.num_layers):
                fw = self._fused(F, x, ["l{{}}.fw.".format(layer)], p)
                back = F.SequenceReverse(x, lengths, use_sequence_length=True)
                bw = F.SequenceReverse(self._fused(F, back, ["l{{}}.bw.".format(layer)], p),
                                       lengths, use_sequence_length=True)
                last = layer == self.num_layers - 1
                x = fw + bw if last and self.merge == "sum" else F.concat(fw, bw, dim=2)
            out = x
        out = F.SequenceMask(out, lengths, use_sequence_length=True, value=0.0, axis=0)
        return F.swapaxes(out, dim1=0, dim2=1)
'''
_LAYER_HELPERS["LSTM"] = _RECURRENT.format(
    name="LSTM", what="A stack of LSTM layers", gates="i, f, g, o", first="i",
    gate_names='("i", "f", "g", "o")', bias_names='("b_i", "b_f", "b_g", "b_o")',
    biases='[p[c + b] for b in ("b_i", "b_f", "b_g", "b_o")] + '
           '[F.zeros(shape=(4 * self.hidden_size,))]', states=2, mode="lstm")
_LAYER_HELPERS["GRU"] = _RECURRENT.format(
    name="GRU", what="A stack of GRU layers (the reset applied after the recurrent product)",
    gates="r, z, n", first="r", gate_names='("r", "z", "n")',
    bias_names='("b_r", "b_z", "b_in", "b_hn")',
    biases='[p[c + "b_r"], p[c + "b_z"], p[c + "b_in"], '
           'F.zeros(shape=(2 * self.hidden_size,)), p[c + "b_hn"]]', states=1, mode="gru")
_LAYER_HELPERS["AdditiveAttention"] = '''
class AdditiveAttention(gluon.HybridBlock):
    """Bahdanau attention without biases: e[t, s] = v . tanh(W_q q_t + W_m m_s), set to -1e9
    past each memory's length, softmax over s; returns sum_s alpha[t, s] m_s."""

    def __init__(self, query_size, memory_size, units):
        super().__init__()
        self.units = units
        self.w_query = self.params.get("w_query", shape=(units, query_size))
        self.w_memory = self.params.get("w_memory", shape=(units, memory_size))
        self.v = self.params.get("v", shape=(units,))

    def hybrid_forward(self, F, query, memory, lengths, w_query, w_memory, v):
        queries = F.FullyConnected(query, w_query, num_hidden=self.units, no_bias=True,
                                   flatten=False)
        keys = F.FullyConnected(memory, w_memory, num_hidden=self.units, no_bias=True,
                                flatten=False)
        hidden = F.tanh(F.broadcast_add(F.expand_dims(queries, axis=2),
                                        F.expand_dims(keys, axis=1)))        # (N, T, S, A)
        scores = F.reshape(F.dot(hidden, v), shape=(0, 0, 0))                 # (N, T, S)
        steps = F.contrib.arange_like(memory, axis=1)
        valid = F.expand_dims(F.broadcast_lesser(F.reshape(steps, shape=(1, -1)),
                                                 F.reshape(lengths, shape=(-1, 1))), axis=1)
        scores = F.broadcast_add(F.broadcast_mul(scores, valid), (1.0 - valid) * -1e9)
        return F.batch_dot(F.softmax(scores, axis=-1), memory)
'''
_LAYER_HELPERS["SequenceBatchNorm"] = '''
class SequenceBatchNorm(gluon.HybridBlock):
    """BatchNorm of the features of (N, T, D) for inference: each valid step normalised by
    the running statistics, scaled and shifted; the steps past each length are 0."""

    def __init__(self, in_channels, epsilon=1e-5):
        super().__init__()
        self.eps = epsilon
        for name, init in (("gamma", "ones"), ("beta", "zeros"), ("running_mean", "zeros"),
                           ("running_var", "ones")):
            setattr(self, name, self.params.get(name, shape=(in_channels,), init=init,
                                                grad_req="null" if "running" in name
                                                else "write"))

    def hybrid_forward(self, F, x, lengths, gamma, beta, running_mean, running_var):
        scale = F.reshape(gamma * F.rsqrt(running_var + self.eps), shape=(1, 1, -1))
        centred = F.broadcast_sub(x, F.reshape(running_mean, shape=(1, 1, -1)))
        y = F.broadcast_add(F.broadcast_mul(centred, scale), F.reshape(beta, shape=(1, 1, -1)))
        steps = F.contrib.arange_like(x, axis=1)
        valid = F.broadcast_lesser(F.reshape(steps, shape=(1, -1)),
                                   F.reshape(lengths, shape=(-1, 1)))
        return F.broadcast_mul(y, F.expand_dims(valid, axis=2))
'''

_LOAD = '''
def load(model, path):
    """Loads tbdzoo's canonical weights file (.npz) into ``model``; the parameters' paths in
    the model (Gluon's structural names, as save_parameters writes them) are tbdzoo's names."""
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files if k != "__manifest__"}
    named = {}   # one name per parameter: the file's, where a parameter is shared
    for name, p in model._collect_params_with_prefix().items():
        if not isinstance(p, gluon.Constant) and (id(p) not in named or name in arrays):
            named[id(p)] = (name, p)
    params = dict(named.values())
    missing = sorted(set(params) - set(arrays))
    unused = sorted(set(arrays) - set(params))
    if missing or unused:
        raise ValueError("{} does not fit this model: nothing in the file for {}; not in the "
                         "model: {}".format(path, missing or "-", unused or "-"))
    model.initialize(ctx=mx.cpu(), force_reinit=False)
    for name, param in params.items():
        param.set_data(mx.nd.array(arrays[name], dtype="float32"))
    return model
'''


def _write_class(cls, lines, plan):
    base = "nn.HybridSequential" if cls.base == "list" else "gluon.HybridBlock"
    lines.add("class {}({}):".format(cls.name, base)).indent()
    lines.add('"""' + class_doc(cls, plan, _root_doc) + '"""').add()
    params = params_in_call_order(cls)
    lines.add("def __init__({}):".format(", ".join(["self"] + [p.name for p in params])))
    lines.indent().add("super().__init__()")
    for p in params:
        if p.call:
            lines.add("self.{0} = {0}".format(p.name))
    constants, helpers = OrderedDict(), set()
    body = Lines()
    body.depth = 2

    add_forward(cls, body, lambda step: _op(step, helpers, constants), _layer_call)
    if constants and cls.count > 1:
        raise UnsupportedOpError("the MXNet source writer keeps constant tables per class; "
                                 "{} has {} instances".format(cls.name, cls.count))
    for name, expr in constants.items():
        lines.add("self.{0} = self.params.get_constant(\"{0}\", {1})".format(name, expr))
    shares = {}
    for layer, suffix, owner, owner_suffix in cls.ties:
        if suffix != owner_suffix:
            raise UnsupportedOpError("the MXNet source writer shares a parameter only under one "
                                     "name: {}.{} is {}.{}".format(layer, suffix, owner,
                                                                   owner_suffix))
        shares[layer] = member_ref(cls, owner)
    add_members(cls, lines, lambda m: _member_expr(m) if m.path not in shares else
                _constructor(m, shares[m.path]), "self.add({})")
    lines.dedent().add()
    args = ["self", "F"] + cls.inputs + list(constants)
    lines.add("def hybrid_forward({}):".format(", ".join(args)))
    lines.lines.extend(body.lines)
    lines.dedent().add().add()


def _root_doc(cls, plan):
    return root_doc(cls, plan, "forward", lambda dtype: "float32")


def write(plan, model_name, config, version):
    used_types, helpers = used_names(plan, lambda step, helpers: _op(step, helpers, {}))
    root = plan.root
    lines = Lines()
    add_title(lines, "MXNet Gluon", model_name, version, config, root)
    lines.add("    model.hybridize()")
    lines.add("    out = model({})   # mx.nd arrays, float32 (token ids too)".format(
        ", ".join(root.inputs)))
    lines.add("")
    lines.add("Parameters are named as tbdzoo names them (``layer1.0.conv1.weight``), as Gluon's")
    lines.add("save_parameters writes them. Needs only MXNet and NumPy.")
    lines.add('"""')
    lines.add("import math  # noqa: F401").add()
    lines.add("import numpy as np").add()
    lines.add("if \"bool\" not in vars(np):  # MXNet 1.9 reads numpy.bool, gone from NumPy 1.24")
    lines.add("    np.bool = bool")
    lines.add("import mxnet as mx  # noqa: E402")
    lines.add("from mxnet import gluon  # noqa: E402")
    lines.add("from mxnet.gluon import nn  # noqa: E402").add()
    lines.add("INPUTS = {}".format(literal(tuple(root.inputs)))).add().add()
    lines.add('''def sequential(*blocks):
    """A HybridSequential of ``blocks``."""
    out = nn.HybridSequential()
    out.add(*blocks)
    return out''').add().add()
    add_texts(lines, _HELPERS, helpers)
    add_texts(lines, _LAYER_HELPERS, used_types)
    for cls in plan.classes:
        _write_class(cls, lines, plan)
    add_build(lines, root, _LOAD)
    return lines.text()

