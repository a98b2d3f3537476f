"""Every loss kind of tbdzoo/spec/losses.py in float64 NumPy, written from its definition."""
import numpy as np


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


def policy_gradient(logits, actions, advantages):
    """-mean(log softmax(logits)[action] * advantage)."""
    log_p = log_softmax(np.asarray(logits, np.float64))
    actions = np.asarray(actions).astype(int)
    picked = log_p[np.arange(len(actions)), actions]
    return float(-np.mean(picked * np.asarray(advantages, np.float64)))


def entropy(logits):
    """mean over rows of -sum_k p_k log p_k."""
    log_p = log_softmax(np.asarray(logits, np.float64))
    return float(np.mean(-(np.exp(log_p) * log_p).sum(axis=-1)))


def squared_error(prediction, target):
    """0.5 mean((prediction - target)^2)."""
    diff = np.asarray(prediction, np.float64) - np.asarray(target)
    return float(0.5 * np.mean(diff ** 2))


def norm_penalty(x, target):
    """mean over rows of (||row|| - target)^2 (WGAN-GP's gradient penalty)."""
    x = np.asarray(x, np.float64).reshape(len(x), -1)
    return float(np.mean((np.sqrt((x ** 2).sum(axis=1)) - target) ** 2))


# loss kind -> fn(values by role, attrs): every kind of tbdzoo/spec/losses.py
LOSSES = {
    "softmax_cross_entropy": lambda v, a: softmax_cross_entropy(
        v["logits"], v["labels"], a["label_smoothing"], a["ignore_index"]),
    "ctc": lambda v, a: ctc(v["logits"], v["labels"], v["input_lengths"], v["label_lengths"],
                            a["blank"]),
    "policy_gradient": lambda v, a: policy_gradient(v["logits"], v["actions"], v["advantages"]),
    "entropy": lambda v, a: entropy(v["logits"]),
    "squared_error": lambda v, a: squared_error(v["prediction"], v["target"]),
    "mean": lambda v, a: float(np.mean(v["x"])),
    "norm_penalty": lambda v, a: norm_penalty(v["x"], a["target"]),
    "smooth_l1": lambda v, a: smooth_l1(v["prediction"], v["target"], v["weight"], a["sigma"],
                                        a["normalizer"]),
    "sigmoid_cross_entropy": lambda v, a: sigmoid_cross_entropy(v["logits"], v["labels"],
                                                                v["weight"]),
}


def loss_term(kind, values, attrs):
    """One loss term of a training program (tbdzoo/spec/losses.py) on float64 values."""
    if kind not in LOSSES:
        raise NotImplementedError("no NumPy reference for loss kind {!r}".format(kind))
    return LOSSES[kind](values, attrs)
