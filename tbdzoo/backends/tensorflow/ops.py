"""The spec's node types in TensorFlow, one function per op (and the loss).

Every function takes tensors already in the layout it computes in: image ops (conv2d, pools,
global_avgpool, batchnorm on images) take NHWC, because TensorFlow's CPU kernels are NHWC;
the others take the canonical layout. ``model.py`` does the conversions. Conv kernels arrive
as HWIO variables; every other parameter is in its canonical layout.
"""
from . import framework  # noqa: F401  (first: TensorFlow imported as the backend needs it)

# isort: split
import math

import numpy as np
import tensorflow as tf

from ...spec.tables import sinusoid_table
from ..common import attention, kernels, pooling


# -- padding helpers ----------------------------------------------------------------------------
def tf_same_pads(size, kernel, stride, dilation=1):
    """The pads TensorFlow's 'SAME' uses on one axis: the odd pixel goes after."""
    effective = dilation * (kernel - 1) + 1
    out = -(-size // stride)
    total = max((out - 1) * stride + effective - size, 0)
    return (total // 2, total - total // 2)


def padding_mode(hw, kernel, stride, pads, dilation=(1, 1)):
    """'VALID' or 'SAME' when one of them gives exactly ``pads``, else None."""
    if all(p == (0, 0) for p in pads):
        return "VALID"
    same = tuple(tf_same_pads(hw[i], kernel[i], stride[i], dilation[i]) for i in range(2))
    return "SAME" if same == tuple(tuple(p) for p in pads) else None


def _nhwc_pads(pads):
    (t, b), (l, r) = pads
    return [[0, 0], [t, b], [l, r], [0, 0]]


def _pad(x, pads, value=0.0):
    if all(p == (0, 0) for p in pads):
        return x
    return tf.pad(x, _nhwc_pads(pads), constant_values=value)


def _hw(x):
    return (int(x.shape[1]), int(x.shape[2]))


# -- image ops (NHWC) ---------------------------------------------------------------------------
def conv2d(x, weight, bias, a):
    """weight is HWIO. Pads that neither 'SAME' nor 'VALID' give are handed to the kernel as
    explicit paddings: measured ~20% faster for ResNet-50 than tf.pad followed by 'VALID'."""
    strides = [1] + list(a["stride"]) + [1]
    mode = padding_mode(_hw(x), a["kernel"], a["stride"], a["padding"], a["dilation"])
    padding = mode if mode is not None else _nhwc_pads(a["padding"])
    if a["dilation"] != (1, 1):
        weight = dilate_kernel(weight, a["dilation"])
    if a["groups"] == 1:
        y = tf.nn.conv2d(x, weight, strides, padding, "NHWC")
    else:  # CPU kernels lack grouped convolution: one convolution per group
        xs = tf.split(x, a["groups"], axis=3)
        ws = tf.split(weight, a["groups"], axis=3)
        y = tf.concat([tf.nn.conv2d(xi, wi, strides, padding, "NHWC")
                       for xi, wi in zip(xs, ws)], axis=3)
    return tf.nn.bias_add(y, bias) if bias is not None else y


def dilate_kernel(weight, dilation):
    """The HWIO kernel with (d - 1) zero rows/columns between taps: a dilation-1 convolution
    with it is the dilated one. TensorFlow's CPU kernels have no dilated filter gradient."""
    for axis, d in enumerate(dilation):
        if d == 1:
            continue
        k = int(weight.shape[axis])
        w = tf.expand_dims(weight, axis + 1)  # (.., k, 1, ..)
        pads = [[0, 0]] * 5
        pads[axis + 1] = [0, d - 1]
        w = tf.pad(w, pads)  # (.., k, d, ..)
        shape = weight.shape.as_list()
        shape[axis] = k * d
        w = tf.reshape(w, shape)
        extent, = kernels.dilated_extent((k,), (d,))
        weight = tf.gather(w, tf.range(extent), axis=axis)
    return weight


def batchnorm(x, gamma, beta, running_mean, running_var, a, training, update_stats,
              fused=True):
    """BatchNorm over the last axis of a rank-4 tensor (NHWC, or a reshaped non-image input).

    Training normalises with the batch statistics (biased variance) and, with ``update_stats``,
    moves the running ones by the spec's rule running = (1 - m) running + m batch: the fused
    op's own moving average (exponential_avg_factor) is left off and the update written out.
    The variance the fused op returns in training is the unbiased (n / (n - 1)) one, which is
    what the spec's running_var update takes (tests/test_tensorflow_backend.py checks it).
    TensorFlow 2 exports the fused op only as tf.compat.v1.nn.fused_batch_norm, a thin wrapper
    of this raw op. Without running statistics (``running_mean`` None: the spec's
    ``track_running_stats=False``) the batch's own normalise in inference too.
    """
    if running_mean is None:
        training, update_stats = True, False
    if training and not fused:
        return _two_pass_batchnorm(x, gamma, beta, running_mean, running_var, a, update_stats)
    if not training:
        return tf.raw_ops.FusedBatchNormV3(
            x=x, scale=gamma, offset=beta, mean=running_mean, variance=running_var,
            epsilon=a["eps"], data_format="NHWC", is_training=False)[0]
    empty = tf.constant([], x.dtype)  # no running statistics in: it returns the batch's
    y, mean, var = tf.raw_ops.FusedBatchNormV3(
        x=x, scale=gamma, offset=beta, mean=empty, variance=empty, epsilon=a["eps"],
        exponential_avg_factor=1.0, data_format="NHWC", is_training=True)[:3]
    if update_stats:
        m = a["momentum"]
        running_mean.assign((1.0 - m) * running_mean + m * tf.stop_gradient(mean))
        running_var.assign((1.0 - m) * running_var + m * tf.stop_gradient(var))
    return y


def _staged_mean(x):
    """Per-channel mean of an NHWC tensor, summed row by row and then over the rows: two short
    sums instead of one long one, whose float32 rounding grows with its length."""
    return tf.reduce_mean(tf.reduce_mean(x, axis=2), axis=[0, 1])


def _two_pass_batchnorm(x, gamma, beta, running_mean, running_var, a, update_stats):
    """Training-mode BatchNorm with its statistics written out: the mean, then the mean squared
    deviation from it, each summed in two stages. The fused CPU kernel sums each channel in one
    long float32 sum, about ten times further from float64 than PyTorch's statistics on a
    149 x 149 map (measured on Inception-v3's stem); many narrow layers on a tiny batch compound
    that until ReLUs flip and gradients part (Inception-v3's tiny config)."""
    mean = _staged_mean(x)
    var = _staged_mean(tf.square(x - mean))
    y = (x - mean) * (gamma * tf.math.rsqrt(var + a["eps"])) + beta
    if update_stats:
        count = tf.cast(tf.reduce_prod(tf.shape(x)[:3]), x.dtype)
        unbiased = var * count / tf.maximum(count - 1.0, 1.0)
        m = a["momentum"]
        running_mean.assign((1.0 - m) * running_mean + m * tf.stop_gradient(mean))
        running_var.assign((1.0 - m) * running_var + m * tf.stop_gradient(unbiased))
    return y


def maxpool2d(x, a):
    """Padded cells hold -inf so they never win."""
    ksize, strides = [1] + list(a["kernel"]) + [1], [1] + list(a["stride"]) + [1]
    mode = padding_mode(_hw(x), a["kernel"], a["stride"], a["padding"])
    if mode is None:
        x, mode = _pad(x, a["padding"], -np.inf), "VALID"
    return tf.nn.max_pool2d(x, ksize, strides, mode)


def avgpool2d(x, a):
    """TF's 'SAME' average excludes padding; other pads use a zero-padded 'VALID' average,
    rescaled by a constant window-count table when padding must not count."""
    ksize, strides = [1] + list(a["kernel"]) + [1], [1] + list(a["stride"]) + [1]
    mode = padding_mode(_hw(x), a["kernel"], a["stride"], a["padding"])
    if mode == "VALID" or (mode == "SAME" and not a["count_include_pad"]):
        return tf.nn.avg_pool2d(x, ksize, strides, mode)
    y = tf.nn.avg_pool2d(_pad(x, a["padding"]), ksize, strides, "VALID")
    if a["count_include_pad"]:
        return y
    return y * tf.constant(pooling.rescale(_hw(x), a)[:, :, None])


def global_avgpool(x):
    return tf.reduce_mean(x, axis=[1, 2])


# -- layout-free ops ----------------------------------------------------------------------------
def relu(x):
    return tf.nn.relu(x)


def add(xs):
    return tf.add_n(xs) if len(xs) > 2 else xs[0] + xs[1]


def dropout(x, a, training):
    """Inverted dropout (tf.nn.dropout scales kept values by 1 / (1 - rate))."""
    if not training or not a["rate"]:
        return x
    return tf.nn.dropout(x, rate=a["rate"])


# -- canonical-layout ops -----------------------------------------------------------------------
def flatten(x):
    """x is canonical (N, C, H, W, ...), so a reshape gives the canonical element order."""
    return tf.reshape(x, [-1, int(np.prod(x.shape[1:]))])


def dense(x, weight, bias):
    """y = x W^T + b on the last axis, as one 2-D matmul (W stays canonical (out, in))."""
    units = int(weight.shape[0])
    if x.shape.rank == 2:
        y = tf.matmul(x, weight, transpose_b=True)
    else:
        flat = tf.reshape(x, [-1, int(x.shape[-1])])
        y = tf.matmul(flat, weight, transpose_b=True)
        y = tf.reshape(y, tf.concat([tf.shape(x)[:-1], [units]], axis=0))
    return tf.nn.bias_add(y, bias) if bias is not None else y


def embedding(tokens, weight, a):
    out = tf.gather(weight, tokens)
    return out * a["scale"] if a["scale"] != 1.0 else out


def positional_encoding(x):
    return x + tf.constant(sinusoid_table(int(x.shape[1]), int(x.shape[2])))


def layernorm(x, gamma, beta, a):
    """Biased variance over the last axis."""
    mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
    return (x - mean) * tf.math.rsqrt(var + a["eps"]) * gamma + beta


def _split_heads(x, heads):
    """(N, L, D) -> (N, H, L, D / H); head h owns features [h * dh, (h + 1) * dh)."""
    length, d = int(x.shape[1]), int(x.shape[2])
    return tf.transpose(tf.reshape(x, [-1, length, heads, d // heads]), [0, 2, 1, 3])


def attention_mask(keys, a, t):
    """True where a score is masked: padded keys (N, 1, 1, S), and s > t when causal."""
    masked = tf.equal(keys, a["pad_id"])[:, None, None, :]
    if a["causal"]:
        s = int(keys.shape[1])
        future = attention.causal_table(t, s, dtype=bool)
        masked = tf.logical_or(masked, tf.constant(future))
    return masked


def multi_head_attention(q_in, kv_in, keys, p, a, training):
    t, d = int(q_in.shape[1]), int(q_in.shape[2])
    heads = a["num_heads"]
    q = _split_heads(dense(q_in, p["W_q"], p["b_q"]), heads)
    k = _split_heads(dense(kv_in, p["W_k"], p["b_k"]), heads)
    v = _split_heads(dense(kv_in, p["W_v"], p["b_v"]), heads)
    scores = tf.matmul(q, k, transpose_b=True) / math.sqrt(d // heads)
    fill = tf.constant(attention.MASKED_LOGIT, scores.dtype)
    scores = tf.where(attention_mask(keys, a, t), fill, scores)
    weights = tf.nn.softmax(scores, axis=-1)
    if training and a["dropout"]:
        weights = tf.nn.dropout(weights, rate=a["dropout"])
    context = tf.reshape(tf.transpose(tf.matmul(weights, v), [0, 2, 1, 3]), [-1, t, d])
    return dense(context, p["W_o"], p["b_o"])


# -- loss ---------------------------------------------------------------------------------------
def softmax_cross_entropy(logits, labels, loss):
    """Mean over counted positions of -sum_k q_k log softmax(logits)_k, q = (1-eps) onehot + eps/K.

    Ignored positions get an all-zero target (one_hot of an out-of-range id is zero), and their
    per-position loss is multiplied by 0 before the mean over counted positions.
    """
    k = int(logits.shape[-1])
    eps = float(loss["label_smoothing"])
    flat_logits = tf.reshape(logits, [-1, k])
    flat_labels = tf.reshape(tf.cast(labels, tf.int32), [-1])
    target = tf.one_hot(flat_labels, k, dtype=flat_logits.dtype)
    if eps:
        target = (1.0 - eps) * target + eps / k
    per_position = tf.nn.softmax_cross_entropy_with_logits(labels=target, logits=flat_logits)
    if loss.get("ignore_index") is None:
        return tf.reduce_mean(per_position)
    counted = tf.cast(tf.not_equal(flat_labels, loss["ignore_index"]), per_position.dtype)
    return tf.reduce_sum(per_position * counted) / tf.reduce_sum(counted)


# -- loss kinds of training programs (tbdzoo/spec/losses.py) --------------------------------------
def mean_loss(x):
    """The mean of every element (any layout: a mean does not see the order)."""
    return tf.reduce_mean(x)


def norm_penalty(x, target):
    """mean_n (||x_n||_2 - target)^2, the norm over each example's elements (any layout)."""
    flat = tf.reshape(x, [tf.shape(x)[0], -1])
    norms = tf.sqrt(tf.reduce_sum(tf.square(flat), axis=1))
    return tf.reduce_mean(tf.square(norms - target))


def policy_gradient(logits, actions, advantages):
    """-mean_n log softmax(logits_n)[a_n] * A_n; the sparse cross-entropy is -log p[a]."""
    neg_log_p = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.cast(actions, tf.int32), logits=logits)
    return tf.reduce_mean(neg_log_p * tf.cast(advantages, neg_log_p.dtype))


def entropy(logits):
    """mean_n of -sum_a p_a log p_a."""
    log_p = tf.nn.log_softmax(logits, axis=-1)
    return tf.reduce_mean(-tf.reduce_sum(tf.exp(log_p) * log_p, axis=-1))


def squared_error(prediction, target):
    return 0.5 * tf.reduce_mean(tf.square(prediction - target))


# -- ops of the generative and Inception models ---------------------------------------------------
def concat(xs, axis):
    """``axis`` is the native tensor's axis (model.py maps the spec's example axis to it)."""
    return tf.concat(xs, axis=axis)


def tanh(x):
    return tf.tanh(x)


def upsample_nearest(x, a):
    """NHWC; every pixel repeated factor x factor times, as one broadcast and reshape (whose
    gradient is the sum over each factor x factor block)."""
    f = a["factor"]
    if f == 1:
        return x
    h, w, c = int(x.shape[1]), int(x.shape[2]), int(x.shape[3])
    n = tf.shape(x)[0]
    y = tf.broadcast_to(x[:, :, None, :, None, :], [n, h, f, w, f, c])
    return tf.reshape(y, [n, h * f, w * f, c])


def reshape(x, a):
    """x is canonical, so its row-major order is the spec's (C, H, W) element order."""
    return tf.reshape(x, [-1] + [int(s) for s in a["shape"]])


def _channel_shape(x, channel_axis):
    """The shape that broadcasts a per-channel vector against ``x`` along ``channel_axis``."""
    shape = [1] * x.shape.rank
    shape[channel_axis] = -1
    return shape


def channel_layernorm(x, gamma, beta, a, channel_axis):
    """One mean and biased variance per example over all its elements; affine per channel."""
    axes = list(range(1, x.shape.rank))
    mean, var = tf.nn.moments(x, axes=axes, keepdims=True)
    y = (x - mean) * tf.math.rsqrt(var + a["eps"])
    shape = _channel_shape(x, channel_axis)
    return y * tf.reshape(gamma, shape) + tf.reshape(beta, shape)


def lerp(x, y, t):
    """t x + (1 - t) y with one weight per example (t has shape (N, 1))."""
    t = tf.reshape(t, [-1] + [1] * (x.shape.rank - 1))
    return t * x + (1.0 - t) * y


def scale(x, a):
    return x * a["factor"]


def stop_gradient(x):
    return tf.stop_gradient(x)


def ones_like(x):
    return tf.ones_like(x)


def conv2d_input_grad(dy, weight, a):
    """NHWC dy, HWIO kernel (the forward convolution's). A transposed convolution without
    padding gives the full ((Ho - 1) s + d (k - 1) + 1) rows; rows [top, top + H) are kept and
    rows past the end, which the forward stride never read, come back as zeros."""
    if a["dilation"] != (1, 1):
        weight = dilate_kernel(weight, a["dilation"])
    (sh, sw), groups = a["stride"], a["groups"]
    c, h, w = a["input_shape"]
    ho, wo = _hw(dy)
    full_h = (ho - 1) * sh + int(weight.shape[0])
    full_w = (wo - 1) * sw + int(weight.shape[1])
    n = tf.shape(dy)[0]
    shape = tf.stack([n, full_h, full_w, c // groups])
    strides = [1, sh, sw, 1]
    if groups == 1:
        full = tf.nn.conv2d_transpose(dy, weight, shape, strides, "VALID")
    else:  # one transposed convolution per group, as conv2d does
        full = tf.concat([tf.nn.conv2d_transpose(dyi, wi, shape, strides, "VALID") for dyi, wi in
                          zip(tf.split(dy, groups, axis=3), tf.split(weight, groups, axis=3))],
                         axis=3)
    (top, _), (left, _) = a["padding"]
    missing_h, missing_w = max(0, top + h - full_h), max(0, left + w - full_w)
    if missing_h or missing_w:
        full = tf.pad(full, [[0, 0], [0, missing_h], [0, missing_w], [0, 0]])
    return full[:, top:top + h, left:left + w, :]


def dense_input_grad(dy, weight):
    """dy W on the last axis (W canonical (out, in), the forward dense layer's)."""
    if dy.shape.rank == 2:
        return tf.matmul(dy, weight)
    flat = tf.matmul(tf.reshape(dy, [-1, int(dy.shape[-1])]), weight)
    return tf.reshape(flat, tf.concat([tf.shape(dy)[:-1], [int(weight.shape[1])]], axis=0))


def relu_grad(dy, x):
    return dy * tf.cast(x > 0, dy.dtype)


def channel_layernorm_input_grad(dy, x, gamma, a, channel_axis):
    """(g - mean g - x_hat mean(g x_hat)) / sigma, g = gamma dy, means over each example."""
    axes = list(range(1, x.shape.rank))
    mean, var = tf.nn.moments(x, axes=axes, keepdims=True)
    inv = tf.math.rsqrt(var + a["eps"])
    xhat = (x - mean) * inv
    g = dy * tf.reshape(gamma, _channel_shape(x, channel_axis))
    return inv * (g - tf.reduce_mean(g, axis=axes, keepdims=True)
                  - xhat * tf.reduce_mean(g * xhat, axis=axes, keepdims=True))


# -- recurrent models: sequences (N, T, D) with per-example lengths (N,) int32 ----------------------
def _valid_mask(lengths, steps, dtype=tf.float32):
    """(N, T, 1): 1 at positions t < length, 0 at padding."""
    return tf.sequence_mask(lengths, steps, dtype=dtype)[:, :, None]


def _reverse_within_length(x, lengths):
    """Each sequence's first ``length`` steps reversed, its padding left in place."""
    return tf.reverse_sequence(x, lengths, seq_axis=1, batch_axis=0)


def _lstm_step(recurrent_kernel):
    def step(projected, h, c):
        z = projected + tf.matmul(h, recurrent_kernel)
        i, f, g, o = tf.split(z, 4, axis=1)
        c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
        return tf.sigmoid(o) * tf.tanh(c), (c,)
    return step


def _gru_step(recurrent_kernel, b_hn):
    def step(projected, h):
        xr, xz, xn = tf.split(projected, 3, axis=1)
        hr, hz, hn = tf.split(tf.matmul(h, recurrent_kernel), 3, axis=1)
        r, z = tf.sigmoid(xr + hr), tf.sigmoid(xz + hz)
        n = tf.tanh(xn + r * (hn + b_hn))
        return (1.0 - z) * n + z * h, ()
    return step


def _fused(p, prefix, kind):
    """One direction's canonical per-gate parameters as fused matrices: the input kernel
    (D, G H), the recurrent kernel (H, G H) in gate order, and the biases the step needs."""
    gates = ("i", "f", "g", "o") if kind == "lstm" else ("r", "z", "n")
    kernel = tf.transpose(tf.concat([p[prefix + "w_" + g] for g in gates], axis=0))
    recurrent = tf.transpose(tf.concat([p[prefix + "u_" + g] for g in gates], axis=0))
    if kind == "lstm":
        bias = tf.concat([p[prefix + b] for b in ("b_i", "b_f", "b_g", "b_o")], axis=0)
        return kernel, recurrent, bias, None
    bias = tf.concat([p[prefix + b] for b in ("b_r", "b_z", "b_in")], axis=0)
    return kernel, recurrent, bias, p[prefix + "b_hn"]


def _run_direction(x, kind, kernel, recurrent, bias, b_hn, units):
    """One layer and direction over (N, T, D) from zero states; outputs (N, T, H), valid only
    at t < length (the caller masks). The input projection of every step is ONE matmul, so
    only the recurrent (N, H) x (H, G H) product stays inside the while loop, which stores
    only h per step (a tf.scan over (h, c) would also stack every c)."""
    steps, depth = int(x.shape[1]), int(x.shape[2])
    projected = tf.matmul(tf.reshape(x, [-1, depth]), kernel) + bias
    projected = tf.transpose(tf.reshape(projected, [-1, steps, int(kernel.shape[1])]), [1, 0, 2])
    inputs = tf.TensorArray(x.dtype, size=steps).unstack(projected)
    zeros = tf.zeros(tf.stack([tf.shape(x)[0], units]), x.dtype)
    if kind == "lstm":
        step, carried = _lstm_step(recurrent), (zeros,)
    else:
        step, carried = _gru_step(recurrent, b_hn), ()

    def body(t, outputs, h, *carried):
        h, carried = step(inputs.read(t), h, *carried)
        return (t + 1, outputs.write(t, h), h) + tuple(carried)

    loop = tf.while_loop(lambda t, *_: t < steps, body,
                         (tf.constant(0), tf.TensorArray(x.dtype, size=steps), zeros) + carried,
                         maximum_iterations=steps)
    return tf.transpose(loop[1].stack(), [1, 0, 2])


def _recurrent(kind, x, lengths, p, a):
    """A stacked, optionally bidirectional LSTM/GRU with the spec's semantics.

    TensorFlow's only fused recurrent kernel is cuDNN's (CudnnRNNV3, which Keras's LSTM/GRU
    layers call on a GPU); this backend runs TensorFlow on the CPU, where Keras's layers run a
    while loop that also projects each step's input inside it. This is that while loop with the
    input projection hoisted out as one matmul: LSTM, 16 x 50 steps, 256 -> 256, forward and
    backward in a tf.function, 78 ms against 86 ms for keras.layers.LSTM with a mask and
    101 ms for a Python-unrolled loop (best of 8 on a busy 2-core CPU). Zero states at the
    start; the backward direction reads each sequence reversed within its length
    (tf.reverse_sequence), so padded steps never reach a valid output, and outputs at padded
    positions are multiplied by 0. Parameters stay one variable per canonical per-gate tensor;
    the fused matrices are assembled from them on every call (a copy of the weights, small
    next to T recurrent matmuls), so load, save and gradients are per canonical parameter."""
    steps, units = int(x.shape[1]), a["units"]
    mask = _valid_mask(lengths, steps, x.dtype)
    directions = ("fw", "bw") if a["bidirectional"] else ("fw",)
    layer_in = x
    for layer in range(a["num_layers"]):
        outs = []
        for d in directions:
            weights = _fused(p, "l{}.{}.".format(layer, d), kind)
            seq = layer_in if d == "fw" else _reverse_within_length(layer_in, lengths)
            y = _run_direction(seq, kind, *weights, units=units)
            if d == "bw":
                y = _reverse_within_length(y, lengths)
            outs.append(y * mask)
        last = layer == a["num_layers"] - 1
        if len(outs) == 1:
            layer_in = outs[0]
        elif last and a["merge"] == "sum":
            layer_in = outs[0] + outs[1]
        else:
            layer_in = tf.concat(outs, axis=-1)
    return layer_in


def lstm(x, lengths, p, a):
    """Gates i, f, g, o; see ``_recurrent``."""
    return _recurrent("lstm", x, lengths, p, a)


def gru(x, lengths, p, a):
    """Gates r, z, n, reset after the recurrent matmul; see ``_recurrent``."""
    return _recurrent("gru", x, lengths, p, a)


def additive_attention(query, memory, memory_lengths, p):
    """e[t, s] = v . tanh(W_q q_t + W_m m_s), masked past each memory's length, softmax over s,
    c_t = sum_s alpha[t, s] m_s. The projections are one matmul each, outside the (T, S) grid."""
    keys = dense(memory, p["w_memory"], None)  # (N, S, A)
    queries = dense(query, p["w_query"], None)  # (N, T, A)
    scores = tf.linalg.matvec(tf.tanh(queries[:, :, None, :] + keys[:, None, :, :]), p["v"])
    valid = tf.sequence_mask(memory_lengths, int(memory.shape[1]))[:, None, :]
    scores = tf.where(valid, scores, tf.constant(attention.MASKED_LOGIT, scores.dtype))
    return tf.matmul(tf.nn.softmax(scores, axis=-1), memory)


def sequence_batchnorm(x, lengths, gamma, beta, running_mean, running_var, a, training,
                       update_stats):
    """BatchNorm of the last axis with statistics over the batch's valid positions only: the
    mean, then the mean squared deviation (biased; the running update takes n / (n - 1) of it,
    n the number of valid positions). Padded positions give 0, in training and inference."""
    mask = _valid_mask(lengths, int(x.shape[1]), x.dtype)
    if running_mean is None:
        training, update_stats = True, False
    if training:
        count = tf.reduce_sum(mask)
        mean = tf.reduce_sum(x * mask, axis=[0, 1]) / count
        var = tf.reduce_sum(tf.square((x - mean) * mask), axis=[0, 1]) / count
        if update_stats:
            m = a["momentum"]
            unbiased = var * count / tf.maximum(count - 1.0, 1.0)
            running_mean.assign((1.0 - m) * running_mean + m * tf.stop_gradient(mean))
            running_var.assign((1.0 - m) * running_var + m * tf.stop_gradient(unbiased))
    else:
        mean, var = running_mean, running_var
    y = (x - mean) * (gamma * tf.math.rsqrt(var + a["eps"])) + beta
    return y * mask


def clipped_relu(x, a):
    """min(max(x, 0), ceiling) with gradient 1 strictly inside (0, ceiling) only: tf.where
    passes the gradient to the branch it picks (tf.clip_by_value and tf.minimum would also
    pass it at the ceiling itself)."""
    ceiling = tf.constant(a["ceiling"], x.dtype)
    inside = tf.logical_and(x > 0.0, x < ceiling)
    return tf.where(inside, x, tf.where(x >= ceiling, ceiling, tf.zeros_like(x)))


def transpose(x, a):
    """x is canonical; the batch axis stays first."""
    return tf.transpose(x, [0] + [axis + 1 for axis in a["perm"]])


def lengths_after_conv(lengths, a):
    """floor((L + before + after - dilation (kernel - 1) - 1) / stride) + 1, at least 1."""
    before, after = a["padding"]
    span = a["dilation"] * (a["kernel"] - 1) + 1
    out = tf.math.floordiv(lengths + (before + after - span), a["stride"]) + 1
    return tf.maximum(out, 1)


def ctc_loss(logits, labels, input_lengths, label_lengths, xla=False):
    """Mean over examples of -log p(labels | logits), each summed over its frames, blank 0.

    The labels go in as a SparseTensor of each example's first label_length ids: with sparse
    labels tf.nn.ctc_loss runs the CTCLoss kernel (cuDNN's on a GPU), 81 ms against 267 ms for
    dense labels (16 x 200 frames, 29 classes, labels of 25-50, forward and backward on the
    CPU), which run a batched forward-backward written in TensorFlow ops. XLA has no CTCLoss
    kernel, so an XLA-compiled step (``xla``) takes the dense form."""
    if xla:
        per_example = tf.nn.ctc_loss(labels=labels, logits=logits, label_length=label_lengths,
                                     logit_length=input_lengths, logits_time_major=False,
                                     blank_index=0)
        return tf.reduce_mean(per_example)
    valid = tf.where(tf.sequence_mask(label_lengths, tf.shape(labels)[1]))
    sparse = tf.SparseTensor(valid, tf.gather_nd(labels, valid),
                             tf.cast(tf.shape(labels), tf.int64))
    per_example = tf.nn.ctc_loss(labels=sparse, logits=logits, label_length=None,
                                 logit_length=input_lengths, logits_time_major=False,
                                 blank_index=0)
    return tf.reduce_mean(per_example)


# -- detection -------------------------------------------------------------------------------------
def _in_xla_compilation():
    """Whether the op is being traced for XLA (a tf.function with jit_compile=True)."""
    try:
        from tensorflow.python.framework import ops as framework_ops
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # a TensorFlow without these internals: take the form XLA compiles
        return True
    return control_flow_util.GraphOrParentsInXlaContext(framework_ops.get_default_graph())


def roi_align(features, indices, weights, a):
    """features NHWC (N, H, W, C), indices and weights (N, R, S, 4); returns canonical
    (N, R, C, oh, ow).

    One sparse (N R oh ow, N H W) mixing matrix, each row a bin's sr^2 x 4 taps weighted by
    weights / sr^2 (columns offset by n H W), times the batch's (N H W, C) feature rows, as
    the PyTorch backend computes it; the backward pass is the transposed product (the spec's
    scatter-add). Gathering every tap first holds sr^2 x 4 = 16 times the output
    (benchmarks/roi_align_backends.py). XLA has no SparseTensorDenseMatMul kernel, so a
    jit-compiled step takes the gather form (which, measured, still holds every tap)."""
    if _in_xla_compilation():
        return _roi_align_gathered(features, indices, weights, a)
    h, w, c = (int(d) for d in features.shape[1:])
    rois = int(indices.shape[1])
    (oh, ow), sr = a["output_size"], a["sampling_ratio"]
    n = tf.shape(features, out_type=tf.int64)[0]
    bins, taps = n * (rois * oh * ow), sr * sr * 4
    offsets = tf.reshape(tf.range(n) * (h * w), [-1, 1, 1, 1])
    columns = tf.reshape(tf.cast(indices, tf.int64) + offsets, [-1])
    targets = tf.reshape(tf.repeat(tf.range(bins), taps), [-1])
    values = tf.reshape(tf.cast(weights, features.dtype), [-1]) / float(sr * sr)
    mixing = tf.SparseTensor(tf.stack([targets, columns], axis=1), values,
                             tf.stack([bins, n * (h * w)]))
    out = _sparse_rows_product(mixing, tf.reshape(features, [-1, c]))
    return tf.transpose(tf.reshape(out, [-1, rois, oh, ow, c]), [0, 1, 4, 2, 3])


def _sparse_rows_product(mixing, rows):
    """mixing @ rows with a gradient for ``rows`` only: TensorFlow's own gradient of
    sparse_dense_matmul also forms the sampling weights' gradient by gathering a row per tap,
    the memory this form avoids (a traced graph prunes it, eager execution would not)."""
    @tf.custom_gradient
    def product(rows):
        def grad(upstream):
            return tf.sparse.sparse_dense_matmul(mixing, upstream, adjoint_a=True)
        return tf.sparse.sparse_dense_matmul(mixing, rows), grad
    return product(rows)


def _roi_align_gathered(features, indices, weights, a):
    """The same with every tap gathered (tf.gather with batch_dims=1 reads each example's own
    (H W, C) rows; its gradient is the IndexedSlices scatter-add): the form XLA compiles."""
    h, w, c = (int(d) for d in features.shape[1:])
    rows = tf.reshape(features, [-1, h * w, c])
    rois, samples = int(indices.shape[1]), int(indices.shape[2])
    (oh, ow), sr = a["output_size"], a["sampling_ratio"]
    taps = tf.gather(rows, tf.reshape(indices, [-1, rois * samples * 4]), batch_dims=1)
    taps = taps * tf.reshape(tf.cast(weights, features.dtype), [-1, rois * samples * 4, 1])
    out = tf.reduce_sum(tf.reshape(taps, [-1, rois, oh, ow, sr * sr * 4, c]), axis=4) / float(sr * sr)
    return tf.transpose(out, [0, 1, 4, 2, 3])


def to_batch(x):
    """(N, R, ...) -> (N R, ...), image-major."""
    return tf.reshape(x, [-1] + [int(d) for d in x.shape[2:]])


def frozen_batchnorm(x, gamma, beta, running_mean, running_var, a, channel_axis):
    """The folded per-channel affine, scale = gamma / sqrt(var + eps), shift = beta - mean scale."""
    scale = gamma * tf.math.rsqrt(running_var + a["eps"])
    shift = beta - running_mean * scale
    shape = _channel_shape(x, channel_axis)
    return x * tf.reshape(scale, shape) + tf.reshape(shift, shape)


def smooth_l1_loss(prediction, target, weight, a):
    """sum(weight * smoothL1_sigma(prediction - target)) / (normalizer * rows)."""
    s2 = float(a["sigma"]) ** 2
    d = tf.abs(prediction - tf.cast(target, prediction.dtype))
    per = tf.where(d < 1.0 / s2, 0.5 * s2 * d * d, d - 0.5 / s2)
    rows = tf.cast(tf.shape(prediction)[0], prediction.dtype)
    return tf.reduce_sum(weight * per) / (float(a["normalizer"]) * rows)


def sigmoid_cross_entropy_loss(logits, labels, weight):
    """sum(weight * BCE-with-logits) / max(sum(weight), 1)."""
    bce = tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.cast(labels, logits.dtype), logits=logits)
    return tf.reduce_sum(weight * bce) / tf.maximum(tf.reduce_sum(weight), 1.0)
