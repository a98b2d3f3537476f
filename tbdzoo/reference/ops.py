"""Every spec op's forward pass in plain NumPy (float64), written from tbdzoo/spec/ops.py alone.

Each op is a function of (inputs, params, attrs, training, dropout mask) in :data:`OPS`, in the
canonical layouts (images (N, C, H, W), sequences (N, T, D)), with loops over kernel taps rather
than any framework's convolution, so it shares no code with the backends. tbdzoo/reference/graph.py
interprets a whole graph with these.
"""
import numpy as np


def _windows(x, kernel, stride, dilation=(1, 1)):
    """Yield ((u, v), x[:, :, rows, cols]) for each kernel tap: the input cell that tap reads
    for every output position, shape (N, C, Ho, Wo). ``x`` is already padded."""
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    ho = (x.shape[2] - dh * (kh - 1) - 1) // sh + 1
    wo = (x.shape[3] - dw * (kw - 1) - 1) // sw + 1
    for u in range(kh):
        for v in range(kw):
            rows = slice(u * dh, u * dh + sh * (ho - 1) + 1, sh)
            cols = slice(v * dw, v * dw + sw * (wo - 1) + 1, sw)
            yield (u, v), x[:, :, rows, cols]


def _pad(x, pads, value=0.0):
    (t, b), (l, r) = pads
    return np.pad(x, ((0, 0), (0, 0), (t, b), (l, r)), mode="constant", constant_values=value)


def conv2d(x, p, a):
    groups = a["groups"]
    weight = p["weight"]  # (O, C / groups, kh, kw)
    out_per_group, in_per_group = weight.shape[0] // groups, weight.shape[1]
    out = None
    for (u, v), cells in _windows(_pad(x, a["padding"]), a["kernel"], a["stride"], a["dilation"]):
        parts = []
        for g in range(groups):
            w = weight[g * out_per_group:(g + 1) * out_per_group, :, u, v]
            xs = cells[:, g * in_per_group:(g + 1) * in_per_group]
            parts.append(np.einsum("ncij,oc->noij", xs, w))
        tap = np.concatenate(parts, axis=1)
        out = tap if out is None else out + tap
    if "bias" in p:
        out = out + p["bias"][None, :, None, None]
    return out


def batchnorm(x, p, a, training):
    if training:  # batch statistics, biased variance (the running update is not a forward value)
        mean, var = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    else:
        mean, var = p["running_mean"], p["running_var"]
    scale = p["gamma"] / np.sqrt(var + a["eps"])
    return (x - mean[None, :, None, None]) * scale[None, :, None, None] + p["beta"][None, :, None, None]


def maxpool2d(x, a):
    cells = [c for _, c in _windows(_pad(x, a["padding"], -np.inf), a["kernel"], a["stride"])]
    return np.max(np.stack(cells), axis=0)


def avgpool2d(x, a):
    total = sum(c for _, c in _windows(_pad(x, a["padding"]), a["kernel"], a["stride"]))
    if a["count_include_pad"]:
        return total / float(a["kernel"][0] * a["kernel"][1])
    inside = _pad(np.ones((1, 1) + x.shape[2:]), a["padding"])
    count = sum(c for _, c in _windows(inside, a["kernel"], a["stride"]))
    return total / count


def sinusoid(length, dim):
    """PE[p, 2i] = sin(p / 10000^(2i/D)), PE[p, 2i+1] = cos(p / 10000^(2i/D))."""
    table = np.zeros((length, dim))
    for pos in range(length):
        for i in range(0, dim, 2):
            angle = pos / 10000.0 ** (float(i) / dim)
            table[pos, i] = np.sin(angle)
            if i + 1 < dim:
                table[pos, i + 1] = np.cos(angle)
    return table


def layernorm(x, p, a):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + a["eps"]) * p["gamma"] + p["beta"]


def softmax(z, axis=-1):
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def multi_head_attention(query, source, keys, p, a):
    """Heads split the projections' output axis in order; masked logits become -1e9."""
    n, t, d = query.shape
    s, h = source.shape[1], a["num_heads"]
    dh = d // h

    def heads(x, name, length):
        y = x @ p["W_" + name].T + p["b_" + name]
        return y.reshape(n, length, h, dh).transpose(0, 2, 1, 3)  # (N, H, L, dh)

    q, k, v = heads(query, "q", t), heads(source, "k", s), heads(source, "v", s)
    logits = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh)  # (N, H, T, S)
    masked = np.broadcast_to((keys == a["pad_id"])[:, None, None, :], logits.shape)
    if a["causal"]:
        masked = masked | np.triu(np.ones((t, s), bool), 1)[None, None]
    logits = np.where(masked, -1e9, logits)
    context = softmax(logits) @ v  # (N, H, T, dh)
    return context.transpose(0, 2, 1, 3).reshape(n, t, d) @ p["W_o"].T + p["b_o"]


def dropout(x, a, training, mask):
    """Inverted dropout: ``mask`` (1 kept, 0 dropped) scaled by 1 / (1 - rate) in training."""
    if not training or not a["rate"]:
        return x
    if mask is None:
        raise ValueError("a training-mode dropout needs its keep mask")
    return x * mask / (1.0 - a["rate"])


def _attention_node(xs, p, a, training, mask):
    if training and a["dropout"]:
        raise ValueError("attention dropout has no reference; build with dropout 0")
    return multi_head_attention(xs[0], xs[1], xs[2], p, a)


# op -> fn(inputs, params, attrs, training, dropout mask)
def batchnorm_op(xs, p, a, training):
    """Without running statistics the batch's own normalise in inference too."""
    return batchnorm(xs[0], p, a, training or not a["track_running_stats"])


def channel_layernorm(x, p, a):
    """One mean and biased variance per example over (C, H, W); scale and shift per channel."""
    axes = tuple(range(1, x.ndim))
    mean, var = x.mean(axis=axes, keepdims=True), x.var(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(var + a["eps"]) * p["gamma"][None, :, None, None] + \
        p["beta"][None, :, None, None]


def conv2d_input_grad(dy, p, a):
    """Scatter: every output cell (i, j) of the forward convolution sends dy x its kernel tap
    back to the padded input cell (i s + u d, j s + v d); then the padding is cut away."""
    weight, groups = p["weight"], a["groups"]  # (F, C / groups, kh, kw)
    (top, bottom), (left, right) = a["padding"]
    c, h, w = a["input_shape"]
    (sh, sw), (dh, dw) = a["stride"], a["dilation"]
    n, f, ho, wo = dy.shape
    padded = np.zeros((n, c, h + top + bottom, w + left + right))
    out_per_group, in_per_group = f // groups, c // groups
    for u in range(a["kernel"][0]):
        for v in range(a["kernel"][1]):
            rows = slice(u * dh, u * dh + sh * (ho - 1) + 1, sh)
            cols = slice(v * dw, v * dw + sw * (wo - 1) + 1, sw)
            for g in range(groups):
                fs = slice(g * out_per_group, (g + 1) * out_per_group)
                cs = slice(g * in_per_group, (g + 1) * in_per_group)
                padded[:, cs, rows, cols] += np.einsum("nfij,fc->ncij", dy[:, fs], weight[fs, :, u, v])
    return padded[:, :, top:top + h, left:left + w]


def channel_layernorm_input_grad(dy, x, p, a):
    """The Jacobian-vector product of channel_layernorm with respect to x, by its closed form."""
    axes = tuple(range(1, x.ndim))
    mean, var = x.mean(axis=axes, keepdims=True), x.var(axis=axes, keepdims=True)
    inv = 1.0 / np.sqrt(var + a["eps"])
    xhat = (x - mean) * inv
    g = dy * p["gamma"][None, :, None, None]
    return inv * (g - g.mean(axis=axes, keepdims=True) - xhat * (g * xhat).mean(axis=axes, keepdims=True))


def lerp(x, y, t):
    t = t.reshape((t.shape[0],) + (1,) * (x.ndim - 1))
    return t * x + (1.0 - t) * y


OPS = {
    "conv2d": lambda xs, p, a, training, mask: conv2d(xs[0], p, a),
    "batchnorm": lambda xs, p, a, training, mask: batchnorm_op(xs, p, a, training),
    "relu": lambda xs, p, a, training, mask: np.maximum(xs[0], 0.0),
    "add": lambda xs, p, a, training, mask: sum(xs[1:], xs[0]),
    "maxpool2d": lambda xs, p, a, training, mask: maxpool2d(xs[0], a),
    "avgpool2d": lambda xs, p, a, training, mask: avgpool2d(xs[0], a),
    "global_avgpool": lambda xs, p, a, training, mask: xs[0].mean(axis=(2, 3)),
    "flatten": lambda xs, p, a, training, mask: xs[0].reshape(xs[0].shape[0], -1),  # C, H, W
    "dense": lambda xs, p, a, training, mask: xs[0] @ p["weight"].T + p.get("bias", 0.0),
    "embedding": lambda xs, p, a, training, mask: p["weight"][xs[0]] * a["scale"],
    "positional_encoding": lambda xs, p, a, training, mask:
        xs[0] + sinusoid(xs[0].shape[1], xs[0].shape[2])[None],
    "layernorm": lambda xs, p, a, training, mask: layernorm(xs[0], p, a),
    "dropout": lambda xs, p, a, training, mask: dropout(xs[0], a, training, mask),
    "multi_head_attention": _attention_node,
    "concat": lambda xs, p, a, training, mask: np.concatenate(xs, axis=a["axis"] + 1),
    "tanh": lambda xs, p, a, training, mask: np.tanh(xs[0]),
    "upsample_nearest": lambda xs, p, a, training, mask:
        xs[0].repeat(a["factor"], axis=2).repeat(a["factor"], axis=3),
    "reshape": lambda xs, p, a, training, mask: xs[0].reshape((len(xs[0]),) + tuple(a["shape"])),
    "channel_layernorm": lambda xs, p, a, training, mask: channel_layernorm(xs[0], p, a),
    "lerp": lambda xs, p, a, training, mask: lerp(*xs),
    "scale": lambda xs, p, a, training, mask: xs[0] * a["factor"],
    "stop_gradient": lambda xs, p, a, training, mask: xs[0],
    "ones_like": lambda xs, p, a, training, mask: np.ones_like(xs[0]),
    "conv2d_input_grad": lambda xs, p, a, training, mask: conv2d_input_grad(xs[0], p, a),
    "dense_input_grad": lambda xs, p, a, training, mask: xs[0] @ p["weight"],
    "relu_grad": lambda xs, p, a, training, mask: xs[0] * (xs[1] > 0),
    "channel_layernorm_input_grad": lambda xs, p, a, training, mask:
        channel_layernorm_input_grad(xs[0], xs[1], p, a),
}


# -- recurrent models ----------------------------------------------------------------------
def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def valid_positions(lengths, t):
    """(N, T) True where t < length."""
    return np.arange(t)[None, :] < np.asarray(lengths).reshape(-1, 1)


def lstm_step(x, h, c, p, prefix):
    """One LSTM step on vectors: gates i, f, g, o, c' = f c + i g, h' = o tanh(c')."""
    def gate(g):
        return p[prefix + "w_" + g] @ x + p[prefix + "u_" + g] @ h + p[prefix + "b_" + g]
    i, f, o = _sigmoid(gate("i")), _sigmoid(gate("f")), _sigmoid(gate("o"))
    c = f * c + i * np.tanh(gate("g"))
    return o * np.tanh(c), c


def gru_step(x, h, c, p, prefix):
    """One GRU step, reset after the recurrent matmul: n = tanh(W_n x + b_in + r (U_n h + b_hn))."""
    r = _sigmoid(p[prefix + "w_r"] @ x + p[prefix + "u_r"] @ h + p[prefix + "b_r"])
    z = _sigmoid(p[prefix + "w_z"] @ x + p[prefix + "u_z"] @ h + p[prefix + "b_z"])
    n = np.tanh(p[prefix + "w_n"] @ x + p[prefix + "b_in"] + r * (p[prefix + "u_n"] @ h + p[prefix + "b_hn"]))
    return (1.0 - z) * n + z * h, c


def recurrent_direction(step, x, lengths, p, prefix, reverse):
    """(N, T, H): each example's valid steps in order (reversed within its length for the
    backward direction), outputs written at their own time; padding stays 0."""
    units = p[prefix + "b_" + ("i" if step is lstm_step else "r")].shape[0]
    out = np.zeros(x.shape[:2] + (units,))
    for b, length in enumerate(np.asarray(lengths).reshape(-1)):
        h, c = np.zeros(units), np.zeros(units)
        times = range(length - 1, -1, -1) if reverse else range(length)
        for t in times:
            h, c = step(x[b, t], h, c, p, prefix)
            out[b, t] = h
    return out


def recurrent(xs, p, a, step):
    x, lengths = xs
    dirs = ("fw", "bw") if a["bidirectional"] else ("fw",)
    for layer in range(a["num_layers"]):
        outs = [recurrent_direction(step, x, lengths, p, "l{}.{}.".format(layer, d), d == "bw")
                for d in dirs]
        last = layer == a["num_layers"] - 1
        x = sum(outs) if last and a["merge"] == "sum" else np.concatenate(outs, axis=-1)
    return x


def additive_attention(query, memory, lengths, p):
    """e[t, s] = v . tanh(W_q q_t + W_m m_s), -1e9 past the memory's length; c_t = softmax(e) m."""
    keys = memory @ p["w_memory"].T  # (N, S, A)
    queries = query @ p["w_query"].T  # (N, T, A)
    scores = np.tanh(queries[:, :, None, :] + keys[:, None, :, :]) @ p["v"]  # (N, T, S)
    valid = valid_positions(lengths, memory.shape[1])[:, None, :]
    scores = np.where(valid, scores, -1e9)
    return softmax(scores) @ memory


def sequence_batchnorm(x, lengths, p, a, training):
    """Features normalised with statistics over the batch's valid steps; padding gives 0."""
    valid = valid_positions(lengths, x.shape[1])
    if training or not a["track_running_stats"]:
        cells = x[valid]  # (valid steps, D)
        mean, var = cells.mean(axis=0), cells.var(axis=0)
    else:
        mean, var = p["running_mean"], p["running_var"]
    y = (x - mean) / np.sqrt(var + a["eps"]) * p["gamma"] + p["beta"]
    return y * valid[:, :, None]


def lengths_after_conv(lengths, a):
    (before, after), k = a["padding"], a["kernel"]
    out = (np.asarray(lengths) + before + after - a["dilation"] * (k - 1) - 1) // a["stride"] + 1
    return np.maximum(out, 1)


OPS.update({
    "lstm": lambda xs, p, a, training, mask: recurrent(xs, p, a, lstm_step),
    "gru": lambda xs, p, a, training, mask: recurrent(xs, p, a, gru_step),
    "additive_attention": lambda xs, p, a, training, mask: additive_attention(xs[0], xs[1], xs[2], p),
    "sequence_batchnorm": lambda xs, p, a, training, mask: sequence_batchnorm(xs[0], xs[1], p, a, training),
    "clipped_relu": lambda xs, p, a, training, mask: np.clip(xs[0], 0.0, a["ceiling"]),
    "transpose": lambda xs, p, a, training, mask:
        xs[0].transpose((0,) + tuple(i + 1 for i in a["perm"])),
    "lengths_after_conv": lambda xs, p, a, training, mask: lengths_after_conv(xs[0], a),
})


# -- detection ------------------------------------------------------------------------------
def roi_align(features, indices, weights, a):
    """out[n, r, c, i, j] = mean over bin (i, j)'s sr^2 samples of sum_k w * features[n, c].flat[idx]."""
    n, c = features.shape[:2]
    (oh, ow), sr = a["output_size"], a["sampling_ratio"]
    rois = indices.shape[1]
    out = np.zeros((n, rois, c, oh * ow * sr * sr))
    for b in range(n):
        flat = features[b].reshape(c, -1)
        for r in range(rois):
            for s in range(indices.shape[2]):
                for k in range(4):
                    out[b, r, :, s] += weights[b, r, s, k] * flat[:, indices[b, r, s, k]]
    return out.reshape(n, rois, c, oh, ow, sr * sr).mean(axis=-1)


def bilinear_taps(box, output_size, sampling_ratio, height, width):
    """(indices (S, 4), weights (S, 4)) of one box, as torchvision's RoIAlign with
    aligned=True samples it (samples ordered (oh, ow, sr_y, sr_x), the edge rule included)."""
    x1, y1, x2, y2 = [v - 0.5 for v in box]
    (oh, ow), sr = output_size, sampling_ratio
    bin_h, bin_w = (y2 - y1) / oh, (x2 - x1) / ow
    indices, weights = [], []
    for i in range(oh):
        for j in range(ow):
            for u in range(sr):
                for v in range(sr):
                    y = min(max(y1 + i * bin_h + (u + 0.5) * bin_h / sr, 0.0), height - 1.0)
                    x = min(max(x1 + j * bin_w + (v + 0.5) * bin_w / sr, 0.0), width - 1.0)
                    y0, x0 = int(np.floor(y)), int(np.floor(x))
                    y1_, x1_ = min(y0 + 1, height - 1), min(x0 + 1, width - 1)
                    ly, lx = y - y0, x - x0
                    indices.append([y0 * width + x0, y0 * width + x1_, y1_ * width + x0,
                                    y1_ * width + x1_])
                    weights.append([(1 - ly) * (1 - lx), (1 - ly) * lx, ly * (1 - lx), ly * lx])
    return np.array(indices, np.int32), np.array(weights, np.float32)


def frozen_batchnorm(x, p, a):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    scale = p["gamma"] / np.sqrt(p["running_var"] + a["eps"])
    return (x - p["running_mean"].reshape(shape)) * scale.reshape(shape) + p["beta"].reshape(shape)


OPS.update({
    "roi_align": lambda xs, p, a, training, mask: roi_align(xs[0], xs[1], xs[2], a),
    "to_batch": lambda xs, p, a, training, mask: xs[0].reshape((-1,) + xs[0].shape[2:]),
    "frozen_batchnorm": lambda xs, p, a, training, mask: frozen_batchnorm(xs[0], p, a),
})
