"""The spec's loss kinds (tbdzoo/spec/losses.py) in MXNet, each reducing to one scalar with
the reduction the spec defines; ``F`` is ``mx.symbol`` or ``mx.ndarray`` as in ops.py."""
from . import ops


def evaluate(F, kind, inputs, attrs):
    """The loss ``kind`` of ``inputs`` (role -> value)."""
    return _LOSSES[kind](F, inputs, attrs)


def _softmax_cross_entropy(F, inputs, attrs):
    return ops.softmax_cross_entropy(F, inputs["logits"], inputs["labels"], attrs)


def _mean(F, inputs, attrs):
    return F.mean(inputs["x"])


def _norm_penalty(F, inputs, attrs):
    """mean over examples of (||x_n||_2 - target)^2, the norm over each example's elements."""
    norms = F.sqrt(F.sum(F.square(F.reshape(inputs["x"], shape=(0, -1))), axis=1))
    return F.mean(F.square(norms - attrs["target"]))


def _ctc(F, inputs, attrs):
    return ops.ctc(F, inputs["logits"], inputs["labels"], inputs["input_lengths"],
                   inputs["label_lengths"])


_LOSSES = {"softmax_cross_entropy": _softmax_cross_entropy, "mean": _mean,
           "norm_penalty": _norm_penalty, "ctc": _ctc}
