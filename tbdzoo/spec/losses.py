"""Loss kinds: their input roles, attributes, checks against a graph and exact reduction.

Each kind reduces to one scalar per batch. The reductions are part of the definition because
frameworks disagree on them (PyTorch's CTC 'mean' divides by target lengths, TensorFlow's by
nothing), and every backend implements the one written here. Valid Python 3.6.
"""
from collections import OrderedDict

import numpy as np

from ..errors import BatchError

_REGISTRY = OrderedDict()


def get(kind):
    try:
        return _REGISTRY[kind]
    except KeyError:
        raise ValueError("unknown loss kind {!r}; known: {}".format(kind, ", ".join(_REGISTRY))) from None


def names():
    return list(_REGISTRY)


def register(cls):
    _REGISTRY[cls.kind] = cls()
    return cls


class LossDef:
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
        _check_same_batch(graph, inputs, name, self.kind)


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


@register
class CTC(LossDef):
    """Connectionist temporal classification over unnormalised scores (the backend applies
    log-softmax over C). Per example: -log p(labels[:label_length] | the first input_length
    frames), blank = class 0. Reduction: the SUM per example, the MEAN over the batch (warp-ctc's
    summed cost averaged over examples, so the learning rate does not scale with the batch; not
    PyTorch's 'mean', which also divides by each label length)."""
    kind = "ctc"
    inputs = ("logits", "labels", "input_lengths", "label_lengths")
    defaults = {"blank": 0}

    def check(self, graph, inputs, attrs, name):
        logits, labels = graph.shape_of(inputs["logits"]), graph.shape_of(inputs["labels"])
        if len(logits) != 2 or logits[1] < 2:
            self._fail(name, self.kind, "logits must be (T, C) with C >= 2 (blank and at least "
                       "one label), got {}".format(logits))
        if graph.dtype_of(inputs["logits"]) != "float32":
            self._fail(name, self.kind, "logits must be float32")
        if len(labels) != 1 or graph.dtype_of(inputs["labels"]) != "int32":
            self._fail(name, self.kind, "labels must be (L,) int32 label ids padded with 0, got "
                       "{} {}".format(labels, graph.dtype_of(inputs["labels"])))
        for role in ("input_lengths", "label_lengths"):
            if tuple(graph.shape_of(inputs[role])) != () or \
                    graph.dtype_of(inputs[role]) != "int32":
                self._fail(name, self.kind, "{} must be one int32 per example (shape ()), got "
                           "{} {}".format(role, graph.shape_of(inputs[role]),
                                          graph.dtype_of(inputs[role])))
        if attrs["blank"] != 0:
            self._fail(name, self.kind, "only blank=0 is supported (every backend's kernel "
                       "agrees on it); renumber the classes so the blank is 0")


def _check_same_batch(graph, inputs, name, kind):
    """Every input of a loss must come from one batch: all folded by ``to_batch``, or none."""
    rows = OrderedDict((role, graph.rows_per_example(v)) for role, v in inputs.items())
    if len(set(rows.values())) > 1:
        LossDef._fail(name, kind, "its inputs come from batches of different sizes (rows per "
                      "example {}): pass them through the same to_batch folds".format(
                          dict(rows)))


class _Elementwise(LossDef):
    """A loss over inputs of one float32 shape, each role named in ``inputs``."""

    def check(self, graph, inputs, attrs, name):
        shapes = OrderedDict((role, tuple(graph.shape_of(v))) for role, v in inputs.items())
        if len(set(shapes.values())) > 1:
            self._fail(name, self.kind, "inputs must have one shape, got {}".format(
                ", ".join("{} {}".format(r, s) for r, s in shapes.items())))
        for role, v in inputs.items():
            if graph.dtype_of(v) != "float32":
                self._fail(name, self.kind, "{} must be float32, got {}".format(
                    role, graph.dtype_of(v)))
        _check_same_batch(graph, inputs, name, self.kind)


@register
class SmoothL1(_Elementwise):
    """sum over the batch of weight * smoothL1_sigma(prediction - target), divided by
    (normalizer x the rows of the batch), where smoothL1_sigma(d) = 0.5 (sigma d)^2 if
    |d| < 1 / sigma^2, else |d| - 0.5 / sigma^2 (mx-rcnn's form; sigma 1 is the usual smooth
    L1 with beta 1). The rows are the prediction's batch: N images, or N * R RoIs after
    to_batch; ``normalizer`` makes it a mean over, say, 256 sampled anchors per image."""
    kind = "smooth_l1"
    inputs = ("prediction", "target", "weight")
    defaults = {"sigma": 1.0, "normalizer": 1.0}

    def check(self, graph, inputs, attrs, name):
        _Elementwise.check(self, graph, inputs, attrs, name)
        for key in ("sigma", "normalizer"):
            value = attrs[key]
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                self._fail(name, self.kind, "{} must be a number > 0, not {!r}".format(key, value))


@register
class SigmoidCrossEntropy(_Elementwise):
    """sum(weight * BCE-with-logits(logits, labels)) / max(sum(weight), 1), the sums over the
    whole batch, labels float 0/1: the mean over the sampled anchors (weight 1 for a sampled
    anchor, 0 otherwise), as torchvision's RPN and mx-rcnn's 'valid' normalisation."""
    kind = "sigmoid_cross_entropy"
    inputs = ("logits", "labels", "weight")


@register
class PolicyGradient(LossDef):
    """-mean over the batch of log softmax(logits)[action] * advantage: the policy-gradient term
    of A3C (Mnih et al. 2016). The advantages are an input, computed outside the graph from a
    rollout, so no gradient reaches the value estimate through them (the stop-gradient)."""
    kind = "policy_gradient"
    inputs = ("logits", "actions", "advantages")

    def check(self, graph, inputs, attrs, name):
        logits = tuple(graph.shape_of(inputs["logits"]))
        if len(logits) != 1 or logits[0] < 2:
            self._fail(name, self.kind, "logits must be (A,) per example with A >= 2 actions, "
                       "got {}".format(logits))
        for role, dtype in (("actions", "int32"), ("advantages", "float32")):
            shape = tuple(graph.shape_of(inputs[role]))
            if shape != () or graph.dtype_of(inputs[role]) != dtype:
                self._fail(name, self.kind, "{} must be one {} per example (shape ()), got {} "
                           "{}".format(role, dtype, shape, graph.dtype_of(inputs[role])))


@register
class Entropy(LossDef):
    """Mean over the batch of the entropy -sum_a p_a log p_a of p = softmax(logits). A bonus is
    a negative weight in the objective (A3C: -0.01)."""
    kind = "entropy"
    inputs = ("logits",)

    def check(self, graph, inputs, attrs, name):
        logits = tuple(graph.shape_of(inputs["logits"]))
        if len(logits) != 1 or logits[0] < 2:
            self._fail(name, self.kind, "logits must be (A,) per example with A >= 2, got {}"
                       .format(logits))


@register
class SquaredError(LossDef):
    """0.5 * the mean over every element of (prediction - target)^2: the half makes the
    gradient the plain error (prediction - target), so a weight of 1 is the common A2C/A3C value
    loss (OpenAI Baselines' vf_coef 0.5 times the mean squared error)."""
    kind = "squared_error"
    inputs = ("prediction", "target")

    def check(self, graph, inputs, attrs, name):
        a, b = tuple(graph.shape_of(inputs["prediction"])), tuple(graph.shape_of(inputs["target"]))
        if a != b:
            self._fail(name, self.kind, "prediction {} and target {} must have one shape".format(
                a, b))
        for role in self.inputs:
            if graph.dtype_of(inputs[role]) != "float32":
                self._fail(name, self.kind, "{} must be float32".format(role))


def ctc_required_frames(labels):
    """Frames a CTC alignment of ``labels`` needs: one per label plus one blank between each
    pair of equal neighbours."""
    labels = [int(v) for v in labels]
    return len(labels) + sum(1 for a, b in zip(labels, labels[1:]) if a == b)


def check_ctc_batch(labels, input_lengths, label_lengths, num_frames, num_classes, name="ctc",
                    inputs=None):
    """Raise BatchError naming the first example a CTC loss cannot score: a length outside
    [1, T] or [0, L], a label id outside [1, C), or more labels than its frames can align.
    Arguments are per-batch sequences (NumPy arrays or lists); ``inputs`` names the batch's
    (labels, input lengths, label lengths) inputs for the error."""
    labels_name, frames_name, lengths_name = inputs or ("labels", "input_lengths", "label_lengths")
    labels = np.asarray(labels, dtype=np.int64)
    input_lengths = np.asarray(input_lengths, dtype=np.int64).reshape(-1)
    label_lengths = np.asarray(label_lengths, dtype=np.int64).reshape(-1)
    if labels.ndim != 2:
        labels = labels.reshape(len(input_lengths), -1)
    max_labels = labels.shape[1]

    def refuse(n, message, input, position, value, allowed):
        raise BatchError("loss {!r} (ctc): example {}: {} (batch[{!r}][{}])".format(
            name, n, message, input, ", ".join(str(p) for p in position)), input=input,
            position=position, value=value, allowed=allowed)

    bad = np.flatnonzero((input_lengths < 1) | (input_lengths > num_frames))
    if len(bad):
        n = int(bad[0])
        refuse(n, "input_length {} is outside [1, {}]".format(input_lengths[n], num_frames),
               frames_name, (n,), int(input_lengths[n]), (1, num_frames))
    bad = np.flatnonzero((label_lengths < 0) | (label_lengths > max_labels))
    if len(bad):
        n = int(bad[0])
        refuse(n, "label_length {} is outside [0, {}]".format(label_lengths[n], max_labels),
               lengths_name, (n,), int(label_lengths[n]), (0, max_labels))
    inside = np.arange(max_labels)[None, :] < label_lengths[:, None]
    bad = inside & ((labels < 1) | (labels >= num_classes))
    if bad.any():
        n, k = (int(v) for v in np.argwhere(bad)[0])
        refuse(n, "label id {} is outside [1, {}) (0 is the blank)".format(
            labels[n, k], num_classes), labels_name, (n, k), int(labels[n, k]), (1, num_classes))
    repeats = np.concatenate([np.zeros((len(labels), 1), bool),
                              (labels[:, 1:] == labels[:, :-1]) & inside[:, 1:]], axis=1)
    need = label_lengths + repeats.sum(axis=1)
    bad = np.flatnonzero(need > input_lengths)
    if len(bad):
        n = int(bad[0])
        refuse(n, "{} labels need {} frames (one per label and a blank between repeats) but "
               "input_length is {}; shorten the labels or lengthen the input".format(
                   label_lengths[n], need[n], input_lengths[n]), labels_name, (n,),
               int(label_lengths[n]), "at most {} frames".format(input_lengths[n]))
