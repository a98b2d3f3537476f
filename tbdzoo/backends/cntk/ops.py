"""The spec's node types in CNTK 2.7: one function per op, ``fn(inputs, params, attrs, ctx)``.

Each example is a static tensor in canonical layout ((C, H, W) images, (T, D) sequences) and
the batch is CNTK's dynamic batch axis, so canonical layouts need no conversion at all: conv
kernels are CNTK's (out, in, kh, kw) and dense weights stay (out, in), applied with
``times_transpose``. Semantics follow tbdzoo/spec/ops.py and the PyTorch reference; the CNTK
conventions that differ (docs/conventions.md) are handled where they arise. The recurrent
ops turn each padded example into a sequence of its valid steps for CNTK's recurrence (the
section "recurrent models" below says how and why). Valid Python 3.6.
"""
from . import framework  # noqa: F401  (first: CNTK imported quietly)

# isort: split
import math

import cntk as C
import numpy as np

from ...spec.tables import sinusoid_table
from ..common import attention, kernels, pooling


class Context:
    """What ops record while the graph is built: BN counters to reset each step, dropout seeds,
    and, for a graph built with ``exact_statistics``, each BatchNorm's batch moments.

    ``exact_statistics`` (training programs) computes BatchNorm from CNTK reductions instead
    of its native op, whose single-pass float32 statistics lose about a digit per layer: on
    Inception-v3's 94 BatchNorms that moves some gradients by percents. The running statistics
    are then updated by the model from the moments each step fetches (``moments``), and
    inference is a graph of its own (``inference``) that normalises by them.
    """

    def __init__(self, seed, exact_statistics=False):
        self.seed = int(seed)
        self.batchnorms = []   # (running_count constant, momentum)
        self.exact_statistics = exact_statistics
        self.inference = False
        self.node = None       # the node being built, set by the model
        self.moments = {}      # node name -> (mean, biased variance), exact_statistics only
        self._dropouts = 0

    def dropout_seed(self):
        """A distinct, reproducible seed per dropout node."""
        self._dropouts += 1
        return (self.seed * 1000003 + self._dropouts * 7919) % (2 ** 31 - 1)


# -- padding -------------------------------------------------------------------------------------
def auto_pad_matches(size, kernel, stride, pads):
    """True when CNTK's auto padding gives exactly the spec's windows on one axis.

    CNTK centres the kernel: it pads (k - 1) // 2 before and returns ceil(size / stride)
    outputs (checked against NumPy for odd and even kernels). The windows are then identical
    when the leading pad and the output count agree; unused trailing pad cells never matter.
    CNTK also refuses a kernel larger than the unpadded input, whatever the padding.
    """
    if kernel > size:
        return False
    before, after = pads
    out = (size + before + after - kernel) // stride + 1
    return before == (kernel - 1) // 2 and out == -(-size // stride)


def _axis_modes(shape, kernel, stride, padding):
    """Per spatial axis: False (no padding), True (CNTK auto padding) or None (explicit)."""
    modes = []
    for i in range(2):
        pads = padding[i]
        if pads[0] == 0 and pads[1] == 0:
            modes.append(False)
        elif auto_pad_matches(shape[1 + i], kernel[i], stride[i], pads):
            modes.append(True)
        else:
            modes.append(None)
    return modes


def _explicit_pad(x, padding, modes, value=0.0):
    """Pad with C.pad the axes CNTK's auto padding cannot express; they then use no padding."""
    pattern = [(0, 0)]
    for i in range(2):
        pattern.append(tuple(padding[i]) if modes[i] is None else (0, 0))
    if any(p != (0, 0) for p in pattern):
        x = C.pad(x, pattern=pattern, constant_value=value)
    return x, [False if m is None else m for m in modes]


# -- image ops -------------------------------------------------------------------------------------
def dilated_kernel(weight, dilation):
    """The (O, I, kh, kw) kernel with dilation - 1 zeros between taps: CNTK 2.7 has no dilated
    convolution on the CPU, and a convolution with this kernel computes the same sums (the
    gradient reaches only the real taps, through pad/reshape/slice)."""
    dh, dw = dilation
    o, i, kh, kw = weight.shape
    spread = C.reshape(weight, (o, i, kh, 1, kw, 1))
    spread = C.pad(spread, pattern=[(0, 0), (0, 0), (0, 0), (0, dh - 1), (0, 0), (0, dw - 1)])
    spread = C.reshape(spread, (o, i, kh * dh, kw * dw))
    return C.slice(spread, [2, 3], [0, 0], list(kernels.dilated_extent((kh, kw), dilation)))


def conv2d(inputs, p, a, ctx):
    x, = inputs
    weight, kernel = p["weight"], tuple(a["kernel"])
    if tuple(a["dilation"]) != (1, 1):
        weight = dilated_kernel(weight, a["dilation"])
        kernel = tuple(weight.shape[2:])
    modes = _axis_modes(x.shape, kernel, a["stride"], a["padding"])
    x, modes = _explicit_pad(x, a["padding"], modes)
    y = C.convolution(weight, x, strides=(1,) + tuple(a["stride"]),
                      auto_padding=[False] + modes, groups=a["groups"])
    if "bias" in p:
        y = y + C.reshape(p["bias"], (a["filters"], 1, 1))
    return y


def batchnorm(inputs, p, a, ctx, running_count):
    """CNTK's native batch normalisation, driven so its running statistics are the spec's.

    CNTK weights the new batch by 1 - exp(-N / time_constant), which depends on the batch
    size N; a negative time constant selects N / (N + count) instead, where count is the
    ``running_count`` input. The model sets count = N (1 - m) / m before every training
    forward, which makes the weight exactly m for any N. CNTK already updates running_var with
    the unbiased batch variance (checked against NumPy), as the spec asks.
    """
    x, = inputs
    if not a["track_running_stats"]:
        return normalize(x, batch_moments(x), p["gamma"], p["beta"], a["eps"])
    if ctx.exact_statistics:
        if ctx.inference:
            moments = [C.reshape(p[k], (x.shape[0],) + (1,) * (len(x.shape) - 1))
                       for k in ("running_mean", "running_var")]
            return normalize(x, moments, p["gamma"], p["beta"], a["eps"])
        moments = batch_moments(x)
        ctx.moments[ctx.node] = moments
        return normalize(x, moments, p["gamma"], p["beta"], a["eps"])
    m = float(a["momentum"])
    if m <= 0.0:
        time_constant = float("inf")     # running statistics frozen
    elif m >= 1.0:
        time_constant = 0.0              # running statistics = last batch
    else:
        time_constant = -1.0
        ctx.batchnorms.append((running_count, m))
    return C.batch_normalization(x, p["gamma"], p["beta"], p["running_mean"], p["running_var"],
                                 spatial=len(x.shape) > 1, normalization_time_constant=time_constant,
                                 epsilon=a["eps"], running_count=running_count)


def fetches_moments(node, ctx):
    """True when the training graph of ``node`` records its batch moments in ``ctx.moments``
    for the model to fold into its running statistics."""
    if not node.attrs.get("track_running_stats"):
        return False
    return node.op == "sequence_batchnorm" or (node.op == "batchnorm" and ctx.exact_statistics)


def batch_moments(x):
    """Per-channel mean and biased variance over the batch and the spatial axes, shaped
    (C, 1, 1) without a batch axis: CNTK reduces the example's axes, then its batch axis."""
    batch = C.Axis.default_batch_axis()
    spatial = tuple(range(1, len(x.shape)))

    def mean(v):
        return C.reduce_mean(C.reduce_mean(v, axis=spatial) if spatial else v, axis=batch)
    average = mean(x)
    return average, mean(C.square(x - average))


def normalize(x, moments, gamma, beta, eps):
    """(x - mean) / sqrt(var + eps), scaled and shifted per channel."""
    mean, variance = moments
    shape = (x.shape[0],) + (1,) * (len(x.shape) - 1)
    return (x - mean) * C.reciprocal(C.sqrt(variance + eps)) * C.reshape(gamma, shape) + \
        C.reshape(beta, shape)


def relu(inputs, p, a, ctx):
    return C.relu(inputs[0])


def add(inputs, p, a, ctx):
    out = inputs[0]
    for x in inputs[1:]:
        out = C.plus(out, x)
    return out


def maxpool2d(inputs, p, a, ctx):
    """Padded cells never win: CNTK's auto padding skips them, explicit pads hold the lowest float."""
    x, = inputs
    modes = _axis_modes(x.shape, a["kernel"], a["stride"], a["padding"])
    x, modes = _explicit_pad(x, a["padding"], modes, value=pooling.LOWEST_FLOAT32)
    return C.pooling(x, C.MAX_POOLING, tuple(a["kernel"]), strides=tuple(a["stride"]),
                     auto_padding=[False] + modes)


def avgpool2d(inputs, p, a, ctx):
    """Native pooling when CNTK's auto padding gives the same windows; otherwise zero-pad,
    average over the full window and rescale by k*k / (the spec's divisor)."""
    x, = inputs
    kernel, stride, padding = tuple(a["kernel"]), tuple(a["stride"]), a["padding"]
    modes = _axis_modes(x.shape, kernel, stride, padding)
    if None not in modes:
        return C.pooling(x, C.AVG_POOLING, kernel, strides=stride, auto_padding=[False] + modes,
                         include_pad=bool(a["count_include_pad"]))
    scale = pooling.rescale(x.shape[1:], a)[None]
    x, modes = _explicit_pad(x, padding, [None, None])
    y = C.pooling(x, C.AVG_POOLING, kernel, strides=stride, auto_padding=[False, False, False])
    if np.all(scale == 1.0):
        return y
    return y * C.constant(scale.astype(np.float32))


def global_avgpool(inputs, p, a, ctx):
    x, = inputs
    return C.reshape(C.reduce_mean(x, axis=(1, 2)), (x.shape[0],))


def flatten(inputs, p, a, ctx):
    """CNTK's per-example layout is the canonical (C, H, W), so a reshape keeps its order."""
    x, = inputs
    return C.reshape(x, (int(np.prod(x.shape)),))


# -- sequence ops ------------------------------------------------------------------------------------
def linear(x, weight, bias=None):
    """x W^T + b on the last axis with W in canonical (out, in) layout."""
    shape = x.shape
    if len(shape) > 2:
        x = C.reshape(x, (-1, shape[-1]))
    y = C.times_transpose(x, weight)
    if len(shape) > 2:
        y = C.reshape(y, tuple(shape[:-1]) + (weight.shape[0],))
    return y + bias if bias is not None else y


def dense(inputs, p, a, ctx):
    return linear(inputs[0], p["weight"], p.get("bias"))


def embedding(inputs, p, a, ctx):
    out = C.gather(p["weight"], inputs[0])
    return out * a["scale"] if a["scale"] != 1.0 else out


def positional_encoding(inputs, p, a, ctx):
    x, = inputs
    return x + C.constant(sinusoid_table(x.shape[0], x.shape[1]))


def layernorm(inputs, p, a, ctx):
    """From primitives: CNTK's LayerNormalization layer adds eps to the std, not the variance."""
    x, = inputs
    centred = x - C.reduce_mean(x, axis=-1)
    variance = C.reduce_mean(C.square(centred), axis=-1)
    return centred * C.reciprocal(C.sqrt(variance + a["eps"])) * p["gamma"] + p["beta"]


def dropout(inputs, p, a, ctx):
    """CNTK's dropout is inverted (scaled by 1/(1-rate)) and active only in training."""
    if not a["rate"]:
        return inputs[0]
    return C.dropout(inputs[0], a["rate"], seed=ctx.dropout_seed())


def attention_mask(keys, pad_id, causal, t, s):
    """1 where a logit is masked: padded keys (per example) and, if causal, keys after the query."""
    masked = C.equal(keys, pad_id)
    if causal:
        future = attention.causal_table(t, s)
        masked = C.greater(masked + C.constant(future), 0.5)
    return masked


def multi_head_attention(inputs, p, a, ctx):
    """Heads are static slices of the projected (T, D) tensors; each head's two products are
    CNTK ``times`` of two per-example matrices, which CNTK evaluates per example."""
    q_in, kv_in, keys = inputs
    (t, d), s = q_in.shape, kv_in.shape[0]
    heads, dh = a["num_heads"], d // a["num_heads"]
    q = linear(q_in, p["W_q"], p["b_q"])
    k = linear(kv_in, p["W_k"], p["b_k"])
    v = linear(kv_in, p["W_v"], p["b_v"])
    masked = attention_mask(keys, a["pad_id"], a["causal"], t, s)
    fill, root = C.constant(attention.MASKED_LOGIT), math.sqrt(dh)
    contexts = []
    for h in range(heads):
        lo, hi = h * dh, (h + 1) * dh
        q_h = C.slice(q, 1, lo, hi)
        k_h = C.slice(k, 1, lo, hi)
        v_h = C.slice(v, 1, lo, hi)
        scores = C.element_select(masked, fill, C.times_transpose(q_h, k_h) / root)
        weights = C.softmax(scores, axis=-1)
        if a["dropout"]:
            weights = C.dropout(weights, a["dropout"], seed=ctx.dropout_seed())
        contexts.append(C.times(weights, v_h))
    context = contexts[0] if heads == 1 else C.splice(*contexts, axis=1)
    return linear(context, p["W_o"], p["b_o"])


# -- ops of the generative and Inception models ------------------------------------------------
def concat(inputs, p, a, ctx):
    """CNTK's static axes are the example's canonical axes, so the spec's axis is CNTK's."""
    return C.splice(*inputs, axis=a["axis"])


def tanh(inputs, p, a, ctx):
    return C.tanh(inputs[0])


def upsample_nearest(inputs, p, a, ctx):
    """(C, H, W) -> (C, H, 1, W, 1), broadcast against ones (C, H, f, W, f), folded back: each
    pixel repeated f x f times in place; the gradient sums each f x f block."""
    x, = inputs
    c, h, w = x.shape
    f = a["factor"]
    ones = C.constant(np.ones((1, 1, f, 1, f), np.float32))
    return C.reshape(C.reshape(x, (c, h, 1, w, 1)) * ones, (c, h * f, w * f))


def reshape(inputs, p, a, ctx):
    """The example is stored in canonical row-major order, so CNTK's reshape keeps it."""
    return C.reshape(inputs[0], tuple(a["shape"]))


def _example_mean(x):
    """The mean of each example over all its axes, shape (1, ..., 1)."""
    return C.reduce_mean(x, axis=tuple(range(len(x.shape))))


def _per_channel(v, rank):
    return C.reshape(v, (v.shape[0],) + (1,) * (rank - 1))


def channel_layernorm(inputs, p, a, ctx):
    """One mean and biased variance per example over (C, H, W); scale and offset per channel."""
    x, = inputs
    centred = x - _example_mean(x)
    xhat = centred * C.reciprocal(C.sqrt(_example_mean(C.square(centred)) + a["eps"]))
    rank = len(x.shape)
    return xhat * _per_channel(p["gamma"], rank) + _per_channel(p["beta"], rank)


def lerp(inputs, p, a, ctx):
    x, y, t = inputs
    t = C.reshape(t, (1,) * len(x.shape))
    return t * x + (1.0 - t) * y


def scale(inputs, p, a, ctx):
    return inputs[0] * float(a["factor"])


def stop_gradient(inputs, p, a, ctx):
    return C.stop_gradient(inputs[0])


def ones_like(inputs, p, a, ctx):
    return C.ones_like(inputs[0])


def _transposed(weight, dy, stride):
    """Transposed convolution without padding; CNTK's kernel layout for it is PyTorch's
    (in = dy's channels, out, kh, kw), the forward convolution's own kernel."""
    return C.convolution_transpose(weight, dy, strides=(1,) + tuple(stride), auto_padding=[False])


def conv2d_input_grad(inputs, p, a, ctx):
    """The transposed convolution of dy without padding gives ((Ho - 1) s + d (k - 1) + 1)
    rows; rows [top, top + H) are the input gradient, and rows past the end of that (input
    rows the stride never read) are zeros. Columns alike. Groups are convolved one by one."""
    dy, = inputs
    weight = p["weight"]
    if tuple(a["dilation"]) != (1, 1):
        weight = dilated_kernel(weight, a["dilation"])
    groups = a["groups"]
    if groups == 1:
        full = _transposed(weight, dy, a["stride"])
    else:
        per_out = weight.shape[0] // groups
        parts = [_transposed(C.slice(weight, 0, g * per_out, (g + 1) * per_out),
                             C.slice(dy, 0, g * per_out, (g + 1) * per_out), a["stride"])
                 for g in range(groups)]
        full = C.splice(*parts, axis=0)
    _, h, w = a["input_shape"]
    (top, _), (left, _) = a["padding"]
    rows, cols = full.shape[1], full.shape[2]
    short = (max(0, top + h - rows), max(0, left + w - cols))
    if short != (0, 0):
        full = C.pad(full, pattern=[(0, 0), (0, short[0]), (0, short[1])])
    return C.slice(full, [1, 2], [top, left], [top + h, left + w])


def dense_input_grad(inputs, p, a, ctx):
    """dy W on the last axis, W the forward node's (out, in) weight."""
    dy, = inputs
    shape = dy.shape
    if len(shape) > 2:
        dy = C.reshape(dy, (-1, shape[-1]))
    dx = C.times(dy, p["weight"])
    if len(shape) > 2:
        dx = C.reshape(dx, tuple(shape[:-1]) + (p["weight"].shape[1],))
    return dx


def relu_grad(inputs, p, a, ctx):
    dy, x = inputs
    return dy * C.greater(x, 0.0)


def channel_layernorm_input_grad(inputs, p, a, ctx):
    """dx = (g - mean(g) - xhat mean(g xhat)) / sqrt(var + eps), g = gamma_c dy."""
    dy, x = inputs
    centred = x - _example_mean(x)
    inv = C.reciprocal(C.sqrt(_example_mean(C.square(centred)) + a["eps"]))
    xhat = centred * inv
    g = dy * _per_channel(p["gamma"], len(x.shape))
    return inv * (g - _example_mean(g) - xhat * _example_mean(g * xhat))


# -- recurrent models (Seq2Seq, Deep Speech 2) ---------------------------------------------------
# Padded (T, D) examples become CNTK sequences of their valid steps only: the padded tensor is
# turned into a full-length sequence (``to_sequence``), its valid steps are kept with
# ``sequence.gather`` (so every example is its own ragged sequence), and results return to
# (T, H) through ``sequence.scatter`` (zeros at padded steps) and ``sequence.unpack``. On the
# ragged axis the backward direction (``future_value``) reads each sequence reversed within its
# own length, as the spec asks, and no step is spent on padding.
#
# The cells are step functions written from the spec's equations (CNTK's LSTM block orders its
# gates i, c~, f, o with one bias and its GRU resets before the recurrent matmul, so neither is
# the spec's cell). The loop is CNTK's own recurrence over a dynamic axis (``past_value`` /
# ``future_value`` with a placeholder, what ``C.layers.Recurrence`` builds), the fastest exact
# path on the CPU: the fused ``optimized_rnnstack`` is cuDNN-only. The input projections of all
# steps are one matrix product outside the loop, and each step does one (4H or 3H, H) product.
# The per-gate canonical parameters are spliced into those fused matrices inside the graph, so
# loading, saving and gradients stay per canonical parameter with no conversion code.


# -- padded tensors and ragged sequences ---------------------------------------------------------
def valid_steps(lengths, steps):
    """(steps,) 1.0 where t < length, 0.0 at padded steps, per example."""
    return C.less(C.constant(np.arange(steps, dtype=np.float32)), lengths)


class Ragged:
    """A padded (T, D) tensor as a sequence of its valid steps, and the way back."""

    def __init__(self, x, lengths):
        steps, features = x.shape
        self.steps = steps
        valid = C.reshape(valid_steps(lengths, steps), (steps, 1))
        full = C.to_sequence(C.splice(x, valid, axis=1))
        self.condition = C.slice(full, 0, features, features + 1)
        self.sequence = C.sequence.gather(C.slice(full, 0, 0, features), self.condition)

    def padded(self, y):
        """A sequence on the ragged axis back to (T, F), zeros at padded steps."""
        full = C.sequence.scatter(y, self.condition)
        unpacked = C.sequence.unpack(full, padding_value=0.0, no_mask_output=True)
        return C.reshape(unpacked, (self.steps, y.shape[0]))


def _loop(step, inputs, units, states, backwards):
    """Runs ``step(previous_states, inputs) -> new_states`` over the sequence ``inputs``
    (forward, or from each sequence's last step when ``backwards``), states starting at zero;
    returns the new states as sequences."""
    placeholders = [C.placeholder(shape=(units,), dynamic_axes=inputs.dynamic_axes)
                    for _ in range(states)]
    delay = C.sequence.future_value if backwards else C.sequence.past_value
    new = step([delay(p) for p in placeholders], inputs)
    C.combine([n.output for n in new]).replace_placeholders(
        dict((p, n.output) for p, n in zip(placeholders, new)))
    return [n.output for n in new]


def _fused(p, prefix, kind, names):
    """The per-gate canonical (H, X) matrices of one layer and direction as one (gates * H, X)."""
    return C.splice(*[p[prefix + kind + n] for n in names], axis=0)


def _gate(v, index, units):
    return C.slice(v, 0, index * units, (index + 1) * units)


def lstm_direction(x, p, prefix, units, backwards):
    """One LSTM direction over the ragged sequence x: i, f, g, o gates, one bias per gate."""
    projected = C.times_transpose(x, _fused(p, prefix, "w_", "ifgo")) + \
        C.splice(*[p[prefix + "b_" + g] for g in "ifgo"], axis=0)
    recurrent = _fused(p, prefix, "u_", "ifgo")

    def step(previous, xw):
        h, c = previous
        gates = xw + C.times_transpose(h, recurrent)
        i, f = C.sigmoid(_gate(gates, 0, units)), C.sigmoid(_gate(gates, 1, units))
        g, o = C.tanh(_gate(gates, 2, units)), C.sigmoid(_gate(gates, 3, units))
        cell = f * c + i * g
        return [o * C.tanh(cell), cell]
    return _loop(step, projected, units, 2, backwards)[0]


def gru_direction(x, p, prefix, units, backwards):
    """One GRU direction over the ragged sequence x, the reset applied after U_n h + b_hn."""
    projected = C.times_transpose(x, _fused(p, prefix, "w_", "rzn")) + \
        C.splice(p[prefix + "b_r"], p[prefix + "b_z"], p[prefix + "b_in"], axis=0)
    recurrent = _fused(p, prefix, "u_", "rzn")
    b_hn = p[prefix + "b_hn"]

    def step(previous, xw):
        h, = previous
        hu = C.times_transpose(h, recurrent)
        r = C.sigmoid(_gate(xw, 0, units) + _gate(hu, 0, units))
        z = C.sigmoid(_gate(xw, 1, units) + _gate(hu, 1, units))
        n = C.tanh(_gate(xw, 2, units) + r * (_gate(hu, 2, units) + b_hn))
        return [(1.0 - z) * n + z * h]
    return _loop(step, projected, units, 1, backwards)[0]


def recurrent_layers(direction, inputs, p, a):
    """The stacked, optionally bidirectional layers; directions are concatenated between
    layers and merged as ``merge`` says after the last."""
    x, lengths = inputs
    ragged = Ragged(x, lengths)
    units, layers = a["units"], a["num_layers"]
    directions = ("fw", "bw") if a["bidirectional"] else ("fw",)
    sequence = ragged.sequence
    for layer in range(layers):
        outputs = [direction(sequence, p, "l{}.{}.".format(layer, d), units, d == "bw")
                   for d in directions]
        if len(outputs) == 1:
            sequence = outputs[0]
        elif layer == layers - 1 and a["merge"] == "sum":
            sequence = outputs[0] + outputs[1]
        else:
            sequence = C.splice(outputs[0], outputs[1], axis=0)
    return ragged.padded(sequence)


def lstm(inputs, p, a, ctx):
    return recurrent_layers(lstm_direction, inputs, p, a)


def gru(inputs, p, a, ctx):
    return recurrent_layers(gru_direction, inputs, p, a)


# -- attention -------------------------------------------------------------------------------------
def additive_attention(inputs, p, a, ctx):
    """e[t, s] = v . tanh(W_q q_t + W_m m_s) as one (T, S, A) tensor per example, masked past
    each memory's length, softmax over s, contexts as one (T, S) x (S, Dm) product."""
    query, memory, lengths = inputs
    (t, _), (s, _), units = query.shape, memory.shape, a["units"]
    q = C.times_transpose(query, p["w_query"])            # (T, A)
    m = C.times_transpose(memory, p["w_memory"])          # (S, A)
    hidden = C.tanh(C.reshape(q, (t, 1, units)) + C.reshape(m, (1, s, units)))
    scores = C.reshape(C.times(C.reshape(hidden, (t * s, units)), C.reshape(p["v"], (units, 1))),
                       (t, s))
    padded = C.reshape(1.0 - valid_steps(lengths, s), (1, s))
    scores = C.element_select(padded, C.constant(attention.MASKED_LOGIT), scores)
    return C.times(C.softmax(scores, axis=-1), memory)


# -- sequence batch normalisation ------------------------------------------------------------------
def sequence_batchnorm(inputs, p, a, ctx):
    """Statistics over the batch and the valid steps only, from CNTK reductions: masked sums
    over T, then over the batch axis. In training the moments (mean, unbiased variance) are
    recorded for the model, which updates the running statistics after each step; an
    inference graph normalises by the running statistics. Padded steps give 0 in both."""
    x, lengths = inputs
    steps, _features = x.shape
    mask = C.reshape(valid_steps(lengths, steps), (steps, 1))
    if ctx.inference and a["track_running_stats"]:
        mean, variance = p["running_mean"], p["running_var"]
    else:
        batch = C.Axis.default_batch_axis()

        def total(v):
            return C.reduce_sum(C.reduce_sum(v, axis=0), axis=batch)
        count = total(mask)                                   # (1,): valid steps of the batch
        mean = total(x * mask) / count                        # (1, D)
        variance = total(C.square((x - mean) * mask)) / count
        if a["track_running_stats"] and not ctx.inference:
            unbiased = variance * count / C.element_max(count - 1.0, 1.0)
            ctx.moments[ctx.node] = (mean, unbiased)
    y = (x - mean) * C.reciprocal(C.sqrt(variance + a["eps"])) * p["gamma"] + p["beta"]
    return y * mask


# -- the small ops of Deep Speech 2 -------------------------------------------------------------
def clipped_relu(inputs, p, a, ctx):
    """relu, then the ceiling by selection: the gradient is 1 strictly inside (0, ceiling) and
    0 at both ends (CNTK's relu passes none at 0; the selected constant none at the ceiling)."""
    x, = inputs
    ceiling = C.constant(a["ceiling"], dtype=np.float32)
    return C.element_select(C.greater_equal(x, ceiling), ceiling, C.relu(x))


def transpose(inputs, p, a, ctx):
    """CNTK's static axes are the example's canonical axes, so the spec's perm is CNTK's."""
    return C.transpose(inputs[0], perm=list(a["perm"]))


def lengths_after_conv(inputs, p, a, ctx):
    """The spec's formula on the float lengths (exact integers below 2**24; a correctly
    rounded quotient of integers never crosses an integer there); no gradient."""
    before, after = a["padding"]
    span = inputs[0] + float(before + after - a["dilation"] * (a["kernel"] - 1) - 1)
    out = C.floor(C.element_divide(span, float(a["stride"]))) + 1.0
    return C.stop_gradient(C.element_max(out, 1.0))


# -- CTC ---------------------------------------------------------------------------------------------
def frame_labels(labels, label_lengths, steps, classes):
    """CNTK's frame-level CTC labels (T, C) built in the graph from (labels, label_lengths):
    row t < label_length is 2 * onehot(labels[t]) (a label's first frame), later rows repeat
    the last label with value 1, which ``labels_to_graph`` reads as the label sequence."""
    max_labels = labels.shape[0]
    t = C.constant(np.arange(steps, dtype=np.float32).reshape(steps, 1))
    source = C.element_min(t, label_lengths - 1.0)                                  # (T, 1)
    pick = C.equal(source, C.constant(np.arange(max_labels, dtype=np.float32)[None]))  # (T, L)
    ids = C.times(pick, C.reshape(labels, (max_labels, 1)))                          # (T, 1)
    onehot = C.equal(ids, C.constant(np.arange(classes, dtype=np.float32)[None]))    # (T, C)
    return onehot * (1.0 + C.less(t, label_lengths))


def _ctc_loss(inputs, attrs):
    """CNTK's exact forward-backward criterion (``forward_backward`` on ``labels_to_graph``,
    log-softmax inside, blank 0) over each example's first input_length frames: the sum over
    the batch, divided by the batch size."""
    logits, labels = inputs["logits"], inputs["labels"]
    input_lengths, label_lengths = inputs["input_lengths"], inputs["label_lengths"]
    steps, classes = logits.shape
    frames = frame_labels(labels, label_lengths, steps, classes)
    ragged = Ragged(C.splice(logits, frames, axis=1), input_lengths).sequence
    scores = C.slice(ragged, 0, 0, classes)
    graph = C.labels_to_graph(C.slice(ragged, 0, classes, 2 * classes))
    total = C.forward_backward(graph, scores, blankTokenId=int(attrs["blank"]))
    examples = C.reduce_sum(C.ones_like(input_lengths), axis=C.Axis.all_axes())
    return total / examples


# -- loss ------------------------------------------------------------------------------------------
def softmax_cross_entropy(logits, labels, loss):
    """Mean over counted positions of the whole minibatch of -sum_k q_k log p_k,
    q = (1 - eps) onehot + eps / K; positions whose label is ``ignore_index`` do not count.

    The result is one scalar without a batch axis (reductions over ``Axis.all_axes``), so its
    gradient is the mean-loss gradient: no per-sample summing by the learner to undo.
    """
    classes = logits.shape[-1]
    eps = float(loss["label_smoothing"])
    ignore = loss["ignore_index"]
    log_p = C.log_softmax(logits, axis=-1)
    if ignore is None:
        mask, safe = C.ones_like(labels), labels
    else:
        mask = C.not_equal(labels, ignore)
        safe = labels * mask              # ignored labels become class 0; their term is masked
    picked = C.reduce_sum(C.one_hot(safe, classes) * log_p, axis=-1, keepdims=False)
    per_position = -(1.0 - eps) * picked
    if eps:
        per_position = per_position - (eps / classes) * C.reduce_sum(log_p, axis=-1, keepdims=False)
    total = C.reduce_sum(per_position * mask, axis=C.Axis.all_axes())
    return total / C.reduce_sum(mask, axis=C.Axis.all_axes())


# -- loss kinds (tbdzoo/spec/losses.py) ---------------------------------------------------------
def loss(kind, inputs, attrs):
    """A program's loss term as one scalar without a batch axis."""
    return _LOSSES[kind](inputs, attrs)


def _softmax_cross_entropy_loss(inputs, attrs):
    return softmax_cross_entropy(inputs["logits"], inputs["labels"], attrs)


def _mean_loss(inputs, attrs):
    return C.reduce_mean(inputs["x"], axis=C.Axis.all_axes())


def _norm_penalty_loss(inputs, attrs):
    """mean over examples of (||x_n|| - target)^2, the norm over each example's elements."""
    x = inputs["x"]
    norm = C.sqrt(C.reduce_sum(C.square(x), axis=tuple(range(len(x.shape)))))
    return C.reduce_mean(C.square(norm - float(attrs["target"])), axis=C.Axis.all_axes())


def _policy_gradient_loss(inputs, attrs):
    """-mean over the minibatch of log softmax(logits)[action] * advantage."""
    logits = inputs["logits"]
    log_p = C.log_softmax(logits, axis=-1)
    picked = C.reduce_sum(C.one_hot(inputs["actions"], logits.shape[-1]) * log_p, axis=-1,
                          keepdims=False)
    return -C.reduce_mean(picked * inputs["advantages"], axis=C.Axis.all_axes())


def _entropy_loss(inputs, attrs):
    log_p = C.log_softmax(inputs["logits"], axis=-1)
    per_example = -C.reduce_sum(C.exp(log_p) * log_p, axis=-1, keepdims=False)
    return C.reduce_mean(per_example, axis=C.Axis.all_axes())


def _squared_error_loss(inputs, attrs):
    diff = inputs["prediction"] - inputs["target"]
    return 0.5 * C.reduce_mean(C.square(diff), axis=C.Axis.all_axes())


_LOSSES = {"softmax_cross_entropy": _softmax_cross_entropy_loss, "mean": _mean_loss,
           "norm_penalty": _norm_penalty_loss, "ctc": _ctc_loss,
           "policy_gradient": _policy_gradient_loss, "entropy": _entropy_loss,
           "squared_error": _squared_error_loss}


# -- detection -------------------------------------------------------------------------------------
def roi_align(inputs, p, a, ctx):
    """One ``gather`` over the batch's (N H W, C) feature rows: CNTK 2.7's gather refuses a
    reference with a batch axis, so ``unpack_batch`` makes the batch a static axis, and the
    indices arrive offset by n H W (``offset_roi_indices``, applied by the model as it prepares
    a batch; float32, exact below 2**24). The gather's backward pass is the scatter-add."""
    features, indices, weights = inputs
    if not (indices.is_input or indices.is_placeholder):  # inside a block, its placeholder
        raise ValueError("roi_align on CNTK reads its indices from a graph input (the model "
                         "offsets them per example as it prepares the batch); node {!r} computes "
                         "them".format(ctx.node))
    c, h, w = features.shape
    rois, samples, _ = indices.shape
    (oh, ow), sr = a["output_size"], a["sampling_ratio"]
    rows = C.reshape(C.unpack_batch(C.reshape(C.transpose(features, (1, 2, 0)), (h * w, c))),
                     (-1, c))
    taps = C.gather(rows, C.reshape(indices, (rois * samples * 4,)))            # (R S 4, C)
    taps = taps * C.reshape(weights, (rois * samples * 4, 1))
    out = C.reduce_sum(C.reshape(taps, (rois * oh * ow, sr * sr * 4, c)), axis=1)
    return C.transpose(C.reshape(out, (rois, oh, ow, c)), (0, 3, 1, 2)) / float(sr * sr)


def offset_roi_indices(graph, batch):
    """``batch`` with each roi_align indices input offset by n H W for example n, so that one
    gather over the whole batch's feature rows reads each example's own map."""
    out = dict(batch)
    for node in graph.nodes.values():
        if node.op == "roi_align" and node.inputs[1] in batch:
            _, h, w = graph.shape_of(node.inputs[0])
            values = np.asarray(batch[node.inputs[1]], np.float32)
            offsets = np.arange(len(values), dtype=np.float32) * float(h * w)
            out[node.inputs[1]] = values + offsets.reshape((-1,) + (1,) * (values.ndim - 1))
    return out


def to_batch(inputs, p, a, ctx):
    """(R, ...) per example to (...) per example: CNTK's ``unpack_batch`` makes the batch a
    static axis, a reshape merges it with R (image-major) and ``to_batch`` makes the merged
    axis the new batch axis."""
    x, = inputs
    merged = C.reshape(C.unpack_batch(x), (-1,) + tuple(x.shape[1:]))
    return C.to_batch(merged)


def frozen_batchnorm(inputs, p, a, ctx):
    """The folded per-channel affine: scale = gamma / sqrt(var + eps), shift = beta - mean scale."""
    x, = inputs
    scale = p["gamma"] * C.reciprocal(C.sqrt(p["running_var"] + a["eps"]))
    shift = p["beta"] - p["running_mean"] * scale
    shape = (x.shape[0],) + (1,) * (len(x.shape) - 1)
    return x * C.reshape(scale, shape) + C.reshape(shift, shape)


def _rows(x):
    """The number of rows of x's batch, as a scalar without a batch axis."""
    return C.reduce_sum(C.ones_like(x), axis=C.Axis.all_axes()) / float(np.prod(x.shape))


def _smooth_l1_loss(inputs, attrs):
    """sum(weight * smoothL1_sigma(prediction - target)) / (normalizer * rows)."""
    s2 = float(attrs["sigma"]) ** 2
    prediction = inputs["prediction"]
    d = C.abs(prediction - inputs["target"])
    per = C.element_select(C.less(d, 1.0 / s2), 0.5 * s2 * C.square(d), d - 0.5 / s2)
    total = C.reduce_sum(inputs["weight"] * per, axis=C.Axis.all_axes())
    return total / (float(attrs["normalizer"]) * _rows(prediction))


def _sigmoid_cross_entropy_loss(inputs, attrs):
    """sum(weight * (max(z, 0) - z y + log(1 + exp(-|z|)))) / max(sum(weight), 1), with max(z, 0)
    and -|z| selected by z >= 0 (TensorFlow's form): relu's and abs's zero gradient at z = 0
    would give a logit of exactly 0 the gradient -y instead of sigmoid(0) - y."""
    z, weight = inputs["logits"], inputs["weight"]
    positive = C.greater_equal(z, 0.0)
    bce = C.element_select(positive, z, C.zeros_like(z)) - z * inputs["labels"] + \
        C.log(1.0 + C.exp(C.element_select(positive, -z, z)))
    total = C.reduce_sum(weight * bce, axis=C.Axis.all_axes())
    return total / C.element_max(C.reduce_sum(weight, axis=C.Axis.all_axes()), 1.0)


_LOSSES.update({"smooth_l1": _smooth_l1_loss, "sigmoid_cross_entropy": _sigmoid_cross_entropy_loss})
