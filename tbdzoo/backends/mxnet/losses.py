"""The spec's loss kinds (tbdzoo/spec/losses.py) in MXNet, each reducing to one scalar with
the reduction the spec defines; ``F`` is ``mx.symbol`` or ``mx.ndarray`` as in ops.py."""
from . import ops


def evaluate(F, kind, inputs, attrs, shapes):
    """The loss ``kind`` of ``inputs`` (role -> value; ``shapes``: role -> its shape without the
    batch axis)."""
    return _LOSSES[kind](F, inputs, attrs, shapes)


def _softmax_cross_entropy(F, inputs, attrs, shapes):
    return ops.softmax_cross_entropy(F, inputs["logits"], inputs["labels"], attrs)


def _mean(F, inputs, attrs, shapes):
    return F.mean(inputs["x"])


def _norm_penalty(F, inputs, attrs, shapes):
    """mean over examples of (||x_n||_2 - target)^2, the norm over each example's elements."""
    norms = F.sqrt(F.sum(F.square(F.reshape(inputs["x"], shape=(0, -1))), axis=1))
    return F.mean(F.square(norms - attrs["target"]))


def _ctc(F, inputs, attrs, shapes):
    return ops.ctc(F, inputs["logits"], inputs["labels"], inputs["input_lengths"],
                   inputs["label_lengths"], shapes["logits"][0], shapes["labels"][0])


def _smooth_l1(F, inputs, attrs, shapes):
    return ops.smooth_l1_loss(F, inputs["prediction"], inputs["target"], inputs["weight"], attrs)


def _sigmoid_cross_entropy(F, inputs, attrs, shapes):
    return ops.sigmoid_cross_entropy_loss(F, inputs["logits"], inputs["labels"], inputs["weight"])


def _policy_gradient(F, inputs, attrs, shapes):
    """-mean_n log softmax(logits_n)[a_n] * A_n; the actions arrive as float32 ids."""
    log_p = ops.log_softmax(F, inputs["logits"])
    return -F.mean(F.pick(log_p, inputs["actions"], axis=-1) * inputs["advantages"])


def _entropy(F, inputs, attrs, shapes):
    log_p = ops.log_softmax(F, inputs["logits"])
    return F.mean(-F.sum(F.exp(log_p) * log_p, axis=-1))


def _squared_error(F, inputs, attrs, shapes):
    return 0.5 * F.mean(F.square(inputs["prediction"] - inputs["target"]))


_LOSSES = {"softmax_cross_entropy": _softmax_cross_entropy, "mean": _mean,
           "norm_penalty": _norm_penalty, "ctc": _ctc, "policy_gradient": _policy_gradient,
           "entropy": _entropy, "squared_error": _squared_error,
           "smooth_l1": _smooth_l1, "sigmoid_cross_entropy": _sigmoid_cross_entropy}
