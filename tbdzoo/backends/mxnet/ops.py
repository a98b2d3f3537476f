"""The spec's node types in MXNet: one function per op, ``fn(F, inputs, params, attrs, ctx)``.

``F`` is ``mx.symbol`` while a hybridized block traces its graph and ``mx.ndarray`` otherwise,
so every function uses only operators both namespaces share. Activations stay NCHW (MXNet's
own layout), which is the canonical one, so nothing is transposed at the boundary.

``ctx`` (a :class:`GraphContext`) carries what is not a spec parameter: NumPy-built constant
tables and whether batch-norm should hand back its batch statistics (the train step updates
the running statistics itself, because MXNet's update uses the biased variance).
"""
import math

import numpy as np

from ...spec.tables import sinusoid_table
from ..common import attention, pooling
from . import recurrent
from . import roi_align as sparse_roi_align


class GraphContext:
    """Per-trace state: constant tables by key, the batch statistics collected so far, and the
    node being run (its name and input shapes without the batch axis)."""

    def __init__(self, constants, exact_bn_stats, two_pass_statistics=False):
        self.constants = constants
        self.exact_bn_stats = exact_bn_stats
        self.two_pass_statistics = two_pass_statistics
        self.bn_stats = []
        self.node_name, self.in_shapes = None, None


# -- constants: NumPy tables a node needs, keyed so equal tables are stored once ------------------

def constants_for(node, in_shapes, training=True):
    """key -> NumPy table for the constants ``node`` reads from ``ctx.constants``; without
    ``training``, only those an inference walk reads."""
    a = node.attrs
    if node.op == "positional_encoding":
        t, d = in_shapes[0]
        return {"pe_{}x{}".format(t, d): sinusoid_table(t, d)}
    if node.op == "multi_head_attention" and a["causal"]:
        t = in_shapes[0][0]
        return {"causal_{}".format(t): attention.causal_table(t, t)}
    if node.op == "sequence_batchnorm" and a["track_running_stats"]:
        return {_MODE_MEAN: np.zeros(1, np.float32), _MODE_VAR: np.ones(1, np.float32)}
    if node.op == "batchnorm" and a["track_running_stats"] and training:
        channels = in_shapes[0][0]
        return {_moments_key("mean", channels): np.zeros(channels, np.float64),
                _moments_key("var", channels): np.ones(channels, np.float64)}
    if node.op == "avgpool2d" and pooling.needs_explicit_padding(a) and not a["count_include_pad"]:
        _, h, w = in_shapes[0]
        table = pooling.divisors((h, w), a["kernel"], a["stride"], a["padding"], False)
        return {_count_key(node.name): table[None, None]}
    return {}


def _count_key(node_name):
    return "count_" + node_name


# Constant tables whose key starts with this are float64 (the others float32): the float64
# batch norm's running-statistics slots (see batchnorm), bound only by training blocks.
FLOAT64_PREFIX = "float64_"


def _moments_key(which, channels):
    return "{}batchnorm_{}_{}".format(FLOAT64_PREFIX, which, channels)


# -- helpers ----------------------------------------------------------------------------------

def _pad(F, x, pads, value=0.0):
    """Explicit, possibly asymmetric, spatial padding of an NCHW tensor."""
    (t, b), (l, r) = pads
    if not (t or b or l or r):
        return x
    return F.pad(x, mode="constant", constant_value=value, pad_width=(0, 0, 0, 0, t, b, l, r))


def _linear(F, x, weight, bias, units):
    """y = x W^T + b on the last axis; flatten=False keeps the leading axes (Gluon's trap)."""
    if bias is None:
        return F.FullyConnected(x, weight, num_hidden=units, no_bias=True, flatten=False)
    return F.FullyConnected(x, weight, bias, num_hidden=units, flatten=False)


# -- node types ------------------------------------------------------------------------------

def conv2d(F, inputs, p, a, ctx):
    x, = inputs
    sym = pooling.symmetric(a["padding"])
    if sym is None:
        x, sym = _pad(F, x, a["padding"]), (0, 0)
    kw = dict(kernel=a["kernel"], stride=a["stride"], dilate=a["dilation"], pad=sym,
              num_filter=a["filters"], num_group=a["groups"], no_bias="bias" not in p)
    if "bias" in p:
        return F.Convolution(x, p["weight"], p["bias"], **kw)
    return F.Convolution(x, p["weight"], **kw)


def batchnorm(F, inputs, p, a, ctx):
    """Batch statistics in training, running ones in inference (batch ones always without
    ``track_running_stats``). With ``ctx.exact_bn_stats``
    MXNet's own running update is switched off (momentum 1 keeps the old value) and the batch
    mean and biased variance are returned for the caller's exact update; otherwise MXNet
    updates them its own way (Keras momentum convention, biased variance)."""
    x, = inputs
    if not a["track_running_stats"]:
        return _batch_statistics_norm(F, x, p, a, len(ctx.in_shapes[0]) + 1)[0]
    if ctx.exact_bn_stats and ctx.two_pass_statistics:
        y, mean, variance = _batch_statistics_norm(F, x, p, a, len(ctx.in_shapes[0]) + 1)
        ctx.bn_stats.append((F.BlockGrad(F.reshape(mean, shape=(-1,))),
                             F.BlockGrad(F.reshape(variance, shape=(-1,)))))
        return y
    common = dict(eps=a["eps"], fix_gamma=False, use_global_stats=False, axis=1)
    if not ctx.exact_bn_stats:
        return F.BatchNorm(x, p["gamma"], p["beta"], p["running_mean"], p["running_var"],
                           momentum=1.0 - a["momentum"], **common)
    # Training: MXNet's BatchNorm in float64. In float32 its kernels (oneDNN's and MXNet's own)
    # sum each channel in one float32 pass, ~1e-5 relative on a 2 x 149 x 149 channel: over
    # tiny Inception-v3's 94 batch norms that moved the first training loss by 1.4e-5 relative
    # from float64 PyTorch's (PyTorch and TensorFlow in float32: within 5.4e-6) and its gradients
    # more. In float64 the sums are exact to float32 rounding, at the cost of two casts of the
    # activations each way. The running-statistics slots are float64 constants that momentum 1
    # leaves as they are; the caller updates the float32 ones from the moments returned.
    channels = ctx.in_shapes[0][0]
    out = F.BatchNorm(F.cast(x, "float64"), F.cast(p["gamma"], "float64"),
                      F.cast(p["beta"], "float64"),
                      ctx.constants[_moments_key("mean", channels)],
                      ctx.constants[_moments_key("var", channels)],
                      momentum=1.0, output_mean_var=True, **common)
    y, mean, invstd = out[0], out[1], out[2]  # MXNet's third output is 1 / sqrt(var + eps)
    variance = F.reciprocal(F.square(invstd)) - a["eps"]
    ctx.bn_stats.append((F.BlockGrad(F.cast(mean, "float32")),
                         F.BlockGrad(F.cast(variance, "float32"))))
    return F.cast(y, "float32")


def relu(F, inputs, p, a, ctx):
    return F.Activation(inputs[0], act_type="relu")  # MKLDNN keeps its blocked layout


def add(F, inputs, p, a, ctx):
    if len(inputs) == 2:
        return F.elemwise_add(inputs[0], inputs[1])
    return F.add_n(*inputs)


def maxpool2d(F, inputs, p, a, ctx):
    x, = inputs
    sym = pooling.symmetric(a["padding"])
    if pooling.needs_explicit_padding(a):
        x, sym = _pad(F, x, a["padding"], pooling.LOWEST_FLOAT32), (0, 0)
    return F.Pooling(x, kernel=a["kernel"], stride=a["stride"], pad=sym, pool_type="max",
                     pooling_convention="valid")


def avgpool2d(F, inputs, p, a, ctx):
    x, = inputs
    kw = dict(kernel=a["kernel"], stride=a["stride"], pooling_convention="valid")
    if not pooling.needs_explicit_padding(a):
        return F.Pooling(x, pad=pooling.symmetric(a["padding"]), pool_type="avg",
                         count_include_pad=a["count_include_pad"], **kw)
    x = _pad(F, x, a["padding"])
    if a["count_include_pad"]:
        return F.Pooling(x, pad=(0, 0), pool_type="avg", **kw)
    summed = F.Pooling(x, pad=(0, 0), pool_type="sum", **kw)
    return F.broadcast_div(summed, ctx.constants[_count_key(ctx.node_name)])


def global_avgpool(F, inputs, p, a, ctx):
    pooled = F.Pooling(inputs[0], kernel=(1, 1), global_pool=True, pool_type="avg")
    return F.reshape(pooled, shape=(0, -1))


def flatten(F, inputs, p, a, ctx):
    return F.reshape(inputs[0], shape=(0, -1))  # NCHW inside: already canonical order


def dense(F, inputs, p, a, ctx):
    return _linear(F, inputs[0], p["weight"], p.get("bias"), a["units"])


def embedding(F, inputs, p, a, ctx):
    vocab, dim = a["vocab"], a["dim"]
    out = F.Embedding(inputs[0], p["weight"], input_dim=vocab, output_dim=dim)
    return out * a["scale"] if a["scale"] != 1.0 else out


def positional_encoding(F, inputs, p, a, ctx):
    x, = inputs
    table = ctx.constants["pe_{}x{}".format(*ctx.in_shapes[0])]
    return F.broadcast_add(x, F.expand_dims(table, axis=0))


def layernorm(F, inputs, p, a, ctx):
    return F.LayerNorm(inputs[0], p["gamma"], p["beta"], axis=-1, eps=a["eps"])


def dropout(F, inputs, p, a, ctx):
    return F.Dropout(inputs[0], p=a["rate"]) if a["rate"] else inputs[0]


def multi_head_attention(F, inputs, p, a, ctx):
    """Heads are folded into the batch axis (N*H, L, dh) for two batched matmuls."""
    q_in, kv_in, keys = inputs
    h = a["num_heads"]
    d = ctx.in_shapes[0][1]

    def heads(x, w, b):
        x = F.reshape(_linear(F, x, w, b, d), shape=(0, 0, h, -1))    # (N, L, H, dh)
        return F.reshape(F.transpose(x, axes=(0, 2, 1, 3)), shape=(-3, 0, 0))  # (N*H, L, dh)

    q = heads(q_in, p["W_q"], p["b_q"])
    k = heads(kv_in, p["W_k"], p["b_k"])
    v = heads(kv_in, p["W_v"], p["b_v"])
    scores = F.batch_dot(q, k, transpose_b=True) / math.sqrt(d // h)
    scores = F.reshape(scores, shape=(-4, -1, h, 0, 0))               # (N, H, T, S)
    masked = F.reshape(keys == a["pad_id"], shape=(0, 1, 1, -1))      # (N, 1, 1, S)
    if a["causal"]:
        t = ctx.in_shapes[0][0]
        causal = F.reshape(ctx.constants["causal_{}".format(t)], shape=(1, 1, t, t))
        masked = F.broadcast_maximum(masked, causal)                   # (N, 1, T, S)
    # set (not add) the masked logits, as the spec says: s * (1 - m) + (-1e9) * m
    scores = F.broadcast_add(F.broadcast_mul(scores, 1.0 - masked),
                             masked * attention.MASKED_LOGIT)
    weights = F.softmax(scores, axis=-1)
    if a["dropout"]:
        weights = F.Dropout(weights, p=a["dropout"])
    context = F.batch_dot(F.reshape(weights, shape=(-3, 0, 0)), v)     # (N*H, T, dh)
    context = F.reshape(context, shape=(-4, -1, h, 0, 0))             # (N, H, T, dh)
    context = F.reshape(F.transpose(context, axes=(0, 2, 1, 3)), shape=(0, 0, -1))
    return _linear(F, context, p["W_o"], p["b_o"], d)


def log_softmax(F, x):
    """log softmax over the last axis, x - m - log(sum(exp(x - m))) with m the row's largest
    (outside the gradient: the value does not depend on it). MXNet's own ``log_softmax`` is up
    to 3.5e-6 off a float64 reference on unit-normal logits (these four operators: 2.4e-7),
    which moved every cross-entropy loss by about 1.2e-6 relative."""
    shifted = F.broadcast_sub(x, F.BlockGrad(F.max(x, axis=-1, keepdims=True)))
    return F.broadcast_sub(shifted, F.log(F.sum(F.exp(shifted), axis=-1, keepdims=True)))


def softmax_cross_entropy(F, logits, labels, loss):
    """Mean over counted positions of -sum_k q_k log p_k, q = (1-eps) onehot + eps/K.
    ``labels`` arrive as float32 (exact for any vocabulary below 2^24)."""
    eps = loss["label_smoothing"]
    log_p = log_softmax(F, logits)
    per_position = -F.pick(log_p, labels, axis=-1)
    if eps:
        per_position = (1.0 - eps) * per_position - eps * F.mean(log_p, axis=-1)
    if loss["ignore_index"] is None:
        return F.mean(per_position)
    counted = labels != loss["ignore_index"]
    return F.sum(per_position * counted) / F.sum(counted)


# -- ops of the generative and Inception models ---------------------------------------------------

def _per_channel(F, v, rank):
    """A (C,) parameter shaped to broadcast over an (N, C, ...) value of ``rank`` axes."""
    return F.reshape(v, shape=(1, -1) + (1,) * (rank - 2))


def _batch_statistics_norm(F, x, p, a, rank):
    """BatchNorm by the batch's own mean and biased variance, in training and inference alike
    (MXNet's BatchNorm switches to the running statistics outside training). The mean, then
    the mean squared deviation from it, each an MXNet reduction (compensated sums): ~1e-7
    relative where MXNet's fused BatchNorm, one float32 pass per channel, is ~1e-5 on a
    4 x 147 x 147 channel (centring its input first does not close the gap: it is the long
    sums). Returns (y, mean, variance), the last two (1, C, 1...)."""
    axes = (0,) + tuple(range(2, rank))
    mean = F.mean(x, axis=axes, keepdims=True)
    centred = F.broadcast_sub(x, mean)
    variance = F.mean(F.square(centred), axis=axes, keepdims=True)
    y = F.broadcast_mul(centred, F.rsqrt(variance + a["eps"]))
    y = F.broadcast_add(F.broadcast_mul(y, _per_channel(F, p["gamma"], rank)),
                        _per_channel(F, p["beta"], rank))
    return y, mean, variance


def concat(F, inputs, p, a, ctx):
    return F.concat(*inputs, dim=a["axis"] + 1)  # NCHW inside: the example's axes follow N


def tanh(F, inputs, p, a, ctx):
    return F.tanh(inputs[0])


def upsample_nearest(F, inputs, p, a, ctx):
    f = a["factor"]
    return F.repeat(F.repeat(inputs[0], repeats=f, axis=2), repeats=f, axis=3)


def reshape(F, inputs, p, a, ctx):
    return F.reshape(inputs[0], shape=(-1,) + tuple(a["shape"]))  # NCHW: canonical order


def channel_layernorm(F, inputs, p, a, ctx):
    """One mean and biased variance per example over all its axes; affine per channel."""
    x, = inputs
    rank = len(ctx.in_shapes[0]) + 1
    axes = tuple(range(1, rank))
    centred = F.broadcast_sub(x, F.mean(x, axis=axes, keepdims=True))
    variance = F.mean(F.square(centred), axis=axes, keepdims=True)
    y = F.broadcast_mul(centred, F.rsqrt(variance + a["eps"]))
    return F.broadcast_add(F.broadcast_mul(y, _per_channel(F, p["gamma"], rank)),
                           _per_channel(F, p["beta"], rank))


def lerp(F, inputs, p, a, ctx):
    x, y, t = inputs
    t = F.reshape(t, shape=(-1,) + (1,) * len(ctx.in_shapes[0]))
    return F.broadcast_mul(t, x) + F.broadcast_mul(1.0 - t, y)


def scale(F, inputs, p, a, ctx):
    return inputs[0] * a["factor"]


def stop_gradient(F, inputs, p, a, ctx):
    return F.BlockGrad(inputs[0])


def ones_like(F, inputs, p, a, ctx):
    return F.ones_like(inputs[0])


def conv2d_input_grad(F, inputs, p, a, ctx):
    """The transposed convolution the spec defines, written as a Convolution: dy with
    stride - 1 zeros inserted between its rows (and columns), correlated with the kernel
    flipped in space and with its two channel axes swapped per group. The spec's crop by
    the forward padding becomes this convolution's own padding (negative padding: cropping dy).

    MXNet's Deconvolution would be the direct form, but with MKLDNN its weight gradient fails
    ("could not execute a primitive") whenever the kernel is shared with another node, which
    it always is here."""
    dy, = inputs
    _, ho, wo = ctx.in_shapes[0]
    c, h, w = a["input_shape"]
    g = a["groups"]
    pads = []
    for axis, (n, size, s, d, k, (before, _)) in enumerate(zip(
            (ho, wo), (h, w), a["stride"], a["dilation"], a["kernel"], a["padding"])):
        dy = _dilate(F, dy, s, 2 + axis, n)
        length = (n - 1) * s + 1
        top = d * (k - 1) - before
        pads.append((top, size + d * (k - 1) - length - top))
    crop = [(max(0, -t), max(0, -b)) for t, b in pads]
    if any(t or b for t, b in crop):
        lengths = [(n - 1) * s + 1 for n, s in zip((ho, wo), a["stride"])]
        dy = F.slice(dy, begin=(None, None, crop[0][0], crop[1][0]),
                     end=(None, None, lengths[0] - crop[0][1], lengths[1] - crop[1][1]))
        pads = [(max(0, t), max(0, b)) for t, b in pads]
    sym = pooling.symmetric(pads)
    if sym is None:
        dy, sym = _pad(F, dy, pads), (0, 0)
    weight = p["weight"]
    if g == 1:
        weight = F.swapaxes(weight, dim1=0, dim2=1)
    else:  # (F, C/g, kh, kw) -> (g, C/g, F/g, kh, kw) -> (C, F/g, kh, kw)
        weight = F.swapaxes(F.reshape(weight, shape=(-4, g, -1, 0, 0, 0)), dim1=1, dim2=2)
        weight = F.reshape(weight, shape=(-3, 0, 0, 0))
    weight = F.reverse(weight, axis=(2, 3))
    return F.Convolution(dy, weight, kernel=a["kernel"], dilate=a["dilation"], pad=sym,
                         num_filter=c, num_group=g, no_bias=True)


def _dilate(F, x, stride, axis, n):
    """``stride - 1`` zeros between the ``n`` entries of ``axis`` (2: rows, 3: columns)."""
    if stride == 1:
        return x
    x = F.expand_dims(x, axis=axis + 1)
    x = F.concat(*([x] + [F.zeros_like(x)] * (stride - 1)), dim=axis + 1)
    x = F.reshape(x, shape=(0, 0, -3, 0) if axis == 2 else (0, 0, 0, -3))
    return F.slice_axis(x, axis=axis, begin=0, end=(n - 1) * stride + 1)


def dense_input_grad(F, inputs, p, a, ctx):
    return F.dot(inputs[0], p["weight"])  # dy (..., units) times W (units, in)


def relu_grad(F, inputs, p, a, ctx):
    dy, x = inputs
    return dy * (x > 0)


def channel_layernorm_input_grad(F, inputs, p, a, ctx):
    """dx = (g - mean(g) - xhat mean(g xhat)) / sqrt(var + eps), g = gamma_c dy."""
    dy, x = inputs
    rank = len(ctx.in_shapes[0]) + 1
    axes = tuple(range(1, rank))
    centred = F.broadcast_sub(x, F.mean(x, axis=axes, keepdims=True))
    inv = F.rsqrt(F.mean(F.square(centred), axis=axes, keepdims=True) + a["eps"])
    xhat = F.broadcast_mul(centred, inv)
    g = F.broadcast_mul(dy, _per_channel(F, p["gamma"], rank))
    inner = F.broadcast_sub(g, F.mean(g, axis=axes, keepdims=True))
    inner = inner - F.broadcast_mul(xhat, F.mean(g * xhat, axis=axes, keepdims=True))
    return F.broadcast_mul(inner, inv)


# -- ops of the recurrent models (Seq2Seq, Deep Speech 2) -----------------------------------------
# Sequences are (N, T, D) and lengths float32 (N,) (exact for any length below 2^24).

def lstm(F, inputs, p, a, ctx):
    """MXNet's fused RNN operator (oneDNN on the CPU); lengths handled as recurrent.py says."""
    return recurrent.run(F, "lstm", inputs[0], inputs[1], p, a)


def gru(F, inputs, p, a, ctx):
    """MXNet's fused RNN operator (oneDNN on the CPU); lengths handled as recurrent.py says."""
    return recurrent.run(F, "gru", inputs[0], inputs[1], p, a)


def _valid(F, lengths, steps):
    """(N, steps) 1.0 where the step is before the example's length, else 0.0."""
    return F.broadcast_lesser(F.reshape(F.arange(steps), shape=(1, -1)),
                              F.reshape(lengths, shape=(-1, 1)))


def additive_attention(F, inputs, p, a, ctx):
    """Bahdanau scores as one broadcast add, tanh and a matrix-vector product per (t, s)."""
    query, memory, lengths = inputs
    units, steps = a["units"], ctx.in_shapes[1][0]
    queries = F.expand_dims(_linear(F, query, p["w_query"], None, units), axis=2)   # (N, T, 1, A)
    keys = F.expand_dims(_linear(F, memory, p["w_memory"], None, units), axis=1)    # (N, 1, S, A)
    hidden = F.tanh(F.broadcast_add(queries, keys))                                 # (N, T, S, A)
    scores = F.reshape(F.dot(hidden, p["v"]), shape=(0, 0, 0))                      # (N, T, S)
    valid = F.expand_dims(_valid(F, lengths, steps), axis=1)                        # (N, 1, S)
    # set (not add) the masked logits, as multi_head_attention does
    scores = F.broadcast_add(F.broadcast_mul(scores, valid), (1.0 - valid) * attention.MASKED_LOGIT)
    return F.batch_dot(F.softmax(scores, axis=-1), memory)


def sequence_batchnorm(F, inputs, p, a, ctx):
    """Statistics over the batch's valid steps (two passes: mean, then mean squared deviation),
    padding 0. In a train block (``ctx.exact_bn_stats``) the batch mean and the UNBIASED
    variance go to ``ctx.bn_stats`` for the exact running update (the count of valid steps is
    data, so the correction is made here). In the native block the mode is known only when it
    runs, as for MXNet's BatchNorm: both normalisations are computed and the training flag
    (:func:`_training_flag`) picks one, and in training MXNet's BatchNorm moves the running
    statistics (MXNet's way, as ``batchnorm`` in a user's Gluon loop: biased variance, during
    the backward pass, which its zero-weighted output joins) from two rows whose mean and
    biased variance are the valid steps' own."""
    x, lengths = inputs
    valid = F.expand_dims(_valid(F, lengths, ctx.in_shapes[0][0]), axis=2)          # (N, T, 1)
    if not a["track_running_stats"]:
        return _valid_steps_norm(F, x, valid, p, a)[0]
    if ctx.exact_bn_stats:
        y, mean, variance, count = _valid_steps_norm(F, x, valid, p, a)
        unbiased = F.broadcast_mul(variance, count / F.maximum(count - 1.0, 1.0))
        ctx.bn_stats.append((F.BlockGrad(mean), F.BlockGrad(unbiased)))
        return y
    running = _affine(F, F.broadcast_sub(x, F.reshape(p["running_mean"], shape=(1, 1, -1))),
                      p["running_var"], p, a)
    running = F.broadcast_mul(running, valid)
    y, mean, variance, _ = _valid_steps_norm(F, x, valid, p, a)
    spread = F.sqrt(F.BlockGrad(variance))
    rows = F.stack(F.BlockGrad(mean) - spread, F.BlockGrad(mean) + spread, axis=0)   # (2, D)
    # gamma reads the node's gamma (times 0) so that autograd runs this BatchNorm's backward
    moved = F.BatchNorm(rows, 1.0 + 0.0 * p["gamma"], F.zeros_like(spread), p["running_mean"],
                        p["running_var"], eps=a["eps"], momentum=1.0 - a["momentum"],
                        fix_gamma=True, use_global_stats=False, axis=1)
    flag = F.reshape(_training_flag(F, ctx), shape=(1, 1, 1))
    picked = F.broadcast_mul(y, flag) + F.broadcast_mul(running, 1.0 - flag)
    return F.broadcast_add(picked, F.reshape(0.0 * F.sum(moved), shape=(1, 1, 1)))


def _valid_steps_norm(F, x, valid, p, a):
    """(y, mean, biased variance, count of valid steps) over the valid steps; y 0 at padding."""
    count = F.sum(valid)
    mean = F.broadcast_div(F.sum(F.broadcast_mul(x, valid), axis=(0, 1)), count)
    centred = F.broadcast_sub(x, F.reshape(mean, shape=(1, 1, -1)))
    variance = F.broadcast_div(F.sum(F.broadcast_mul(F.square(centred), valid), axis=(0, 1)),
                               count)
    return F.broadcast_mul(_affine(F, centred, variance, p, a), valid), mean, variance, count


def _affine(F, centred, variance, p, a):
    scale = F.reshape(p["gamma"] * F.rsqrt(variance + a["eps"]), shape=(1, 1, -1))
    return F.broadcast_add(F.broadcast_mul(centred, scale), F.reshape(p["beta"], shape=(1, 1, -1)))


_MODE_MEAN, _MODE_VAR = "training_flag_mean", "training_flag_var"


def _training_flag(F, ctx):
    """(1,) 1.0 in training mode, 0.0 in inference, read when the graph runs: MXNet's BatchNorm
    on the rows (0, 2) gives (-1, 1) by their own statistics in training and (0, 2) by the
    constant running ones (0, 1) in inference. Momentum 1 leaves those constants as they are."""
    rows = F.reshape(F.arange(2) * 2.0, shape=(2, 1))
    out = F.BatchNorm(rows, F.ones(shape=(1,)), F.zeros(shape=(1,)), ctx.constants[_MODE_MEAN],
                      ctx.constants[_MODE_VAR], eps=1e-5, momentum=1.0, fix_gamma=True,
                      use_global_stats=False, axis=1)
    return F.reshape(F.slice_axis(out, axis=0, begin=0, end=1) < -0.5, shape=(1,))


def clipped_relu(F, inputs, p, a, ctx):
    """relu(x) inside the ceiling, the ceiling above it: MXNet's clip passes the gradient at
    both ends, the spec does not (at exactly 0 or the ceiling it is 0)."""
    x, c = inputs[0], a["ceiling"]
    return F.Activation(x, act_type="relu") * (x < c) + c * (x >= c)


def transpose(F, inputs, p, a, ctx):
    return F.transpose(inputs[0], axes=(0,) + tuple(i + 1 for i in a["perm"]))


def lengths_after_conv(F, inputs, p, a, ctx):
    """The spec's formula on float32 lengths (exact integers); no gradient."""
    (before, after), k = a["padding"], a["kernel"]
    out = F.floor((inputs[0] + (before + after - a["dilation"] * (k - 1) - 1)) / a["stride"]) + 1
    return F.BlockGrad(F.maximum(out, 1.0))


def ctc(F, logits, labels, input_lengths, label_lengths, frames, max_labels):
    """MXNet's CTC (warp-ctc's algorithm: it applies the softmax itself) with the blank first;
    per-example costs averaged over the batch, the spec's reduction. MXNet refuses labels
    longer than the ``frames``; columns past them are padding (each label needs a frame), so
    they are cut."""
    if max_labels > frames:
        labels = F.slice_axis(labels, axis=1, begin=0, end=frames)
    costs = F.ctc_loss(F.swapaxes(logits, dim1=0, dim2=1), labels, input_lengths, label_lengths,
                       use_data_lengths=True, use_label_lengths=True, blank_label="first")
    return F.mean(costs)


# -- detection -----------------------------------------------------------------------------------
def roi_align(F, inputs, p, a, ctx):
    """One ``take`` of the batch's (N H W, C) feature rows at each example's indices offset by
    n H W (indices travel as float32, exact below 2**24); take's backward is the scatter-add
    the spec asks. Output canonical (N, R, C, oh, ow). It holds sr^2 x 4 = 16 times the output
    for the backward pass; ``roi_align_sparse`` does not, but Faster R-CNN's first backward
    pass through it receives a NaN output gradient in MXNet 1.9.1 (docs/detection.md), so the
    graph uses this form."""
    features, indices, weights = inputs
    (c, h, w), (rois, _, _) = ctx.in_shapes[0], ctx.in_shapes[1]
    (oh, ow), sr = a["output_size"], a["sampling_ratio"]
    rows = F.reshape(F.transpose(features, axes=(0, 2, 3, 1)), shape=(-1, c))
    offsets = F.contrib.arange_like(indices, axis=0) * float(h * w)
    flat = F.broadcast_add(F.reshape(indices, shape=(0, -1)), F.reshape(offsets, shape=(-1, 1)))
    taps = F.take(rows, flat, axis=0)                                    # (N, R S 4, C)
    taps = F.broadcast_mul(taps, F.reshape(weights, shape=(0, -1, 1)))
    out = F.sum(F.reshape(taps, shape=(-1, rois, oh, ow, sr * sr * 4, c)), axis=4)
    return F.transpose(out / float(sr * sr), axes=(0, 1, 4, 2, 3))


def roi_align_sparse(F, inputs, p, a, ctx):
    """The same as one sparse product of the bins' weighted taps with the batch's feature rows,
    as the PyTorch backend computes it: the custom operator of roi_align.py (its backward pass
    is the transposed product). Matches torchvision on its own (tests/test_detection_ops.py);
    not the graph's op (``roi_align`` says why)."""
    features, indices, weights = inputs
    return sparse_roi_align.roi_align(F, features, indices, weights, a["output_size"],
                                      a["sampling_ratio"])


def to_batch(F, inputs, p, a, ctx):
    """(N, R, ...) -> (N R, ...): reshape's -3 merges the first two axes, image-major."""
    return F.reshape(inputs[0], shape=(-3, -2))


def frozen_batchnorm(F, inputs, p, a, ctx):
    """The folded per-channel affine: scale = gamma / sqrt(var + eps), shift = beta - mean scale."""
    x, rank = inputs[0], len(ctx.in_shapes[0]) + 1
    scale = p["gamma"] * F.rsqrt(p["running_var"] + a["eps"])
    shift = p["beta"] - p["running_mean"] * scale
    return F.broadcast_add(F.broadcast_mul(x, _per_channel(F, scale, rank)),
                           _per_channel(F, shift, rank))


def smooth_l1_loss(F, prediction, target, weight, a):
    """MXNet's ``smooth_l1`` is mx-rcnn's smoothL1_sigma; summed per example, averaged over the
    rows, divided by the normalizer."""
    per = F.smooth_l1(prediction - target, scalar=float(a["sigma"])) * weight
    return F.mean(F.sum(F.reshape(per, shape=(0, -1)), axis=1)) / float(a["normalizer"])


def sigmoid_cross_entropy_loss(F, logits, labels, weight):
    """sum(weight * (max(z, 0) - z y + log(1 + exp(-|z|)))) / max(sum(weight), 1), with max(z, 0)
    and -|z| selected by z >= 0 (TensorFlow's form): relu's and abs's zero gradient at z = 0
    would give a logit of exactly 0 the gradient -y instead of sigmoid(0) - y."""
    positive = logits >= 0
    bce = F.where(positive, logits, F.zeros_like(logits)) - logits * labels + \
        F.log1p(F.exp(F.where(positive, -logits, logits)))
    return F.broadcast_div(F.sum(weight * bce), F.maximum(F.sum(weight), 1.0))
