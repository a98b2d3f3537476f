"""Loss kinds: their input roles, attributes, checks against a graph and exact reduction.

Each kind reduces to one scalar per batch. The reductions are part of the definition because
frameworks disagree on them (PyTorch's CTC 'mean' divides by target lengths, TensorFlow's by
nothing), and every backend implements the one written here. Valid Python 3.6.
"""
from collections import OrderedDict

_REGISTRY = OrderedDict()


def get(kind):
    try:
        return _REGISTRY[kind]
    except KeyError:
        raise ValueError("unknown loss kind {!r}; known: {}".format(kind, ", ".join(_REGISTRY)))


def names():
    return list(_REGISTRY)


def register(cls):
    _REGISTRY[cls.kind] = cls()
    return cls


class LossDef(object):
    kind = None
    inputs = ()         # roles, each naming a graph value
    optional = ()       # roles that may be left out
    defaults = {}

    def normalize(self, attrs, name):
        extra = sorted(set(attrs) - set(self.defaults))
        if extra:
            raise ValueError("loss {!r} ({}): unknown attribute(s) {}; known: {}".format(
                name, self.kind, ", ".join(extra), ", ".join(sorted(self.defaults)) or "none"))
        out = dict(self.defaults)
        out.update(attrs)
        return OrderedDict(sorted(out.items()))

    def check(self, graph, inputs, attrs, name):
        """Raise ValueError naming the loss when shapes or dtypes cannot work."""

    @staticmethod
    def _fail(name, kind, message):
        raise ValueError("loss {!r} ({}): {}".format(name, kind, message))


@register
class SoftmaxCrossEntropy(LossDef):
    """Mean over counted positions of -sum_k q_k log softmax(logits)_k with
    q = (1 - eps) onehot(label) + eps / K; positions whose label is ``ignore_index`` do not count."""
    kind = "softmax_cross_entropy"
    inputs = ("logits", "labels")
    defaults = {"label_smoothing": 0.0, "ignore_index": None}

    def check(self, graph, inputs, attrs, name):
        logits, labels = graph.shape_of(inputs["logits"]), graph.shape_of(inputs["labels"])
        if tuple(labels) != tuple(logits[:-1]):
            self._fail(name, self.kind, "labels {} must have the logits' shape {} without the "
                       "class axis".format(labels, logits))
        if graph.dtype_of(inputs["labels"]) != "int32":
            self._fail(name, self.kind, "labels must be int32 class ids")
        if not 0.0 <= attrs["label_smoothing"] < 1.0:
            self._fail(name, self.kind, "label_smoothing must be in [0, 1)")


@register
class Mean(LossDef):
    """The mean of every element of ``x`` over the batch (a critic's score: its sign is the
    objective's weight)."""
    kind = "mean"
    inputs = ("x",)

    def check(self, graph, inputs, attrs, name):
        if graph.dtype_of(inputs["x"]) != "float32":
            self._fail(name, self.kind, "x must be a float32 value")


@register
class NormPenalty(LossDef):
    """mean over examples of (||x_n||_2 - target)^2, the norm taken over each example's
    elements: WGAN-GP's gradient penalty when ``x`` is the critic's input gradient."""
    kind = "norm_penalty"
    inputs = ("x",)
    defaults = {"target": 1.0}

    def check(self, graph, inputs, attrs, name):
        if graph.dtype_of(inputs["x"]) != "float32":
            self._fail(name, self.kind, "x must be a float32 value")
