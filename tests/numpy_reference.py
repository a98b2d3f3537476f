"""Every spec op's forward pass in plain NumPy (float64), written from tbdzoo/spec/ops.py alone.

The consistency suite compares each backend with PyTorch; this module is what PyTorch itself is
checked against, so that agreement also means correctness. It interprets a whole graph, node by
node, in the canonical layouts (images (N, C, H, W), sequences (N, T, D)), with loops over
kernel taps rather than any framework's convolution, so it shares no code with the backends.
"""
from collections import OrderedDict

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


def forward(graph, weights, batch, training=False, masks=None):
    """Every node's output (float64), in graph order. ``masks``: dropout node name -> keep mask."""
    values = OrderedDict()
    for name, inp in graph.inputs.items():
        arr = np.asarray(batch[name])
        values[name] = arr if inp.dtype == "int32" else arr.astype(np.float64)
    outputs = OrderedDict()
    for node in graph.nodes.values():
        params = OrderedDict((suffix, np.asarray(weights[full], np.float64))
                             for suffix, full in graph.param_names(node).items())
        xs = [values[i] for i in node.inputs]
        mask = (masks or {}).get(node.name)
        if node.op not in OPS:
            raise NotImplementedError("no NumPy reference for op {!r}".format(node.op))
        values[node.name] = outputs[node.name] = OPS[node.op](xs, params, node.attrs, training,
                                                              mask)
    return outputs


def softmax_cross_entropy(logits, labels, label_smoothing=0.0, ignore_index=None):
    """Mean over counted positions of -sum_k q_k log p_k, q = (1 - eps) onehot + eps / K;
    positions whose label is ``ignore_index`` count neither in the sum nor in the mean."""
    logits = np.asarray(logits, np.float64)
    k = logits.shape[-1]
    z = logits.reshape(-1, k)
    y = np.asarray(labels).reshape(-1)
    keep = np.ones(y.shape, bool) if ignore_index is None else y != ignore_index
    z, y = z[keep], y[keep]
    log_p = z - z.max(axis=1, keepdims=True)
    log_p = log_p - np.log(np.exp(log_p).sum(axis=1, keepdims=True))
    q = np.full(z.shape, label_smoothing / k)
    q[np.arange(len(y)), y] += 1.0 - label_smoothing
    return float(-(q * log_p).sum() / len(y))


def log_softmax(z, axis=-1):
    z = z - z.max(axis=axis, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))


def ctc_example(logits, labels, blank=0):
    """-log p(labels | logits (T, C)) by the alpha recursion over the blank-extended labels
    (b, l1, b, l2, ..., b), in log space."""
    logp = log_softmax(np.asarray(logits, np.float64))
    ext = [blank]
    for label in labels:
        ext += [int(label), blank]
    alpha = np.full(len(ext), -np.inf)
    alpha[0] = logp[0, ext[0]]
    if len(ext) > 1:
        alpha[1] = logp[0, ext[1]]
    for t in range(1, len(logp)):
        prev, alpha = alpha, np.full(len(ext), -np.inf)
        for s, k in enumerate(ext):
            terms = [prev[s]] + ([prev[s - 1]] if s >= 1 else [])
            if s >= 2 and k != blank and k != ext[s - 2]:
                terms.append(prev[s - 2])
            alpha[s] = np.logaddexp.reduce(terms) + logp[t, k]
    return -np.logaddexp.reduce(alpha[-2:] if len(ext) > 1 else alpha[-1:])


def ctc(logits, labels, input_lengths, label_lengths, blank=0):
    """The spec's reduction: each example's summed cost, averaged over the batch."""
    costs = [ctc_example(z[:int(t)], y[:int(n)], blank)
             for z, y, t, n in zip(logits, labels, input_lengths, label_lengths)]
    return float(np.mean(costs))


def loss_term(kind, values, attrs):
    """One loss term of a training program (tbdzoo/spec/losses.py) on float64 values."""
    if kind == "softmax_cross_entropy":
        return softmax_cross_entropy(values["logits"], values["labels"], attrs["label_smoothing"],
                                     attrs["ignore_index"])
    if kind == "ctc":
        return ctc(values["logits"], values["labels"], values["input_lengths"],
                   values["label_lengths"], attrs["blank"])
    if kind == "policy_gradient":
        log_p = log_softmax(np.asarray(values["logits"], np.float64))
        actions = np.asarray(values["actions"]).astype(int)
        picked = log_p[np.arange(len(actions)), actions]
        return float(-np.mean(picked * np.asarray(values["advantages"], np.float64)))
    if kind == "entropy":
        log_p = log_softmax(np.asarray(values["logits"], np.float64))
        return float(np.mean(-(np.exp(log_p) * log_p).sum(axis=-1)))
    if kind == "squared_error":
        diff = np.asarray(values["prediction"], np.float64) - np.asarray(values["target"])
        return float(0.5 * np.mean(diff ** 2))
    if kind == "mean":
        return float(np.mean(values["x"]))
    if kind == "norm_penalty":
        x = np.asarray(values["x"]).reshape(len(values["x"]), -1)
        return float(np.mean((np.sqrt((x ** 2).sum(axis=1)) - attrs["target"]) ** 2))
    if kind in _LOSS_TERMS:
        return _LOSS_TERMS[kind](values, attrs)
    raise NotImplementedError("no NumPy reference for loss kind {!r}".format(kind))


def loss(graph, outputs, batch):
    """The graph's loss, or the first phase's objective of its training program."""
    if graph.program is not None:
        program = graph.program
        total = 0.0
        for name, weight in program.objectives[program.phases[0]["objective"]]:
            term = program.losses[name]
            values = {role: outputs[v] if v in outputs else np.asarray(batch[v])
                      for role, v in term["inputs"].items()}
            total += weight * loss_term(term["kind"], values, term["attrs"])
        return total
    spec = graph.loss
    return softmax_cross_entropy(outputs[spec["logits"]], batch[spec["labels"]],
                                 spec.get("label_smoothing", 0.0), spec.get("ignore_index"))


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


def frozen_batchnorm(x, p, a):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    scale = p["gamma"] / np.sqrt(p["running_var"] + a["eps"])
    return (x - p["running_mean"].reshape(shape)) * scale.reshape(shape) + p["beta"].reshape(shape)


OPS.update({
    "roi_align": lambda xs, p, a, training, mask: roi_align(xs[0], xs[1], xs[2], a),
    "to_batch": lambda xs, p, a, training, mask: xs[0].reshape((-1,) + xs[0].shape[2:]),
    "frozen_batchnorm": lambda xs, p, a, training, mask: frozen_batchnorm(xs[0], p, a),
})


def smooth_l1(prediction, target, weight, sigma=1.0, normalizer=1.0):
    """sum(weight * smoothL1_sigma(d)) / (normalizer * rows); 0.5 (sigma d)^2 below 1 / sigma^2."""
    d = np.abs(np.asarray(prediction, np.float64) - target)
    s2 = float(sigma) ** 2
    per = np.where(d < 1.0 / s2, 0.5 * s2 * d * d, d - 0.5 / s2)
    return float((weight * per).sum() / (normalizer * len(d)))


def sigmoid_cross_entropy(logits, labels, weight):
    """sum(weight * BCE-with-logits) / max(sum(weight), 1)."""
    z = np.asarray(logits, np.float64)
    bce = np.maximum(z, 0) - z * labels + np.log1p(np.exp(-np.abs(z)))
    return float((weight * bce).sum() / max(float(np.sum(weight)), 1.0))


_LOSS_TERMS = {
    "smooth_l1": lambda v, a: smooth_l1(v["prediction"], v["target"], v["weight"], a["sigma"],
                                        a["normalizer"]),
    "sigmoid_cross_entropy": lambda v, a: sigmoid_cross_entropy(v["logits"], v["labels"],
                                                                v["weight"]),
}
