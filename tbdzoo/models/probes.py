"""Probe models: one small graph per node type, for per-node consistency tests.

``get_model('probe/conv2d')`` finds them; ``list_models()`` does not list them. Each probe
feeds its node into a flatten -> dense -> softmax cross-entropy head, so a test compares the
node's forward output, its parameters' gradients and a short SGD trajectory. Shapes are odd
and padding asymmetric on purpose: they expose layout and padding mistakes.

Probes take the hyperparameters too: ``sequence_length`` sizes the (T, D) inputs and
``dropout`` is the dropout probe's rate (0 in consistency runs, whose backends draw different
masks; tests/test_dropout.py raises both to measure the masks).

Lengths inputs follow one naming convention: an int32 input of shape () named ``<x>_lengths``
holds the valid length of input ``<x>``'s first axis (its time axis). The batch maker draws them
ragged, one example at full length and one short, and draws the CTC probe's labels so that
every example can be aligned with its frames.

``PROGRAM_PROBES`` test a training program's machinery rather than a node; they are not
consistency cases of their own (their tests say how they are compared).
"""
from collections import OrderedDict

import numpy as np

from ..backends.common import sequences
from ..spec import Graph
from ..spec.program import Program, optimizer_of, schedule_of, single_objective
from ..spec.targets import register_targets
from .constraints import integer
from .registry import ModelDef

HPARAMS = {
    "batch_size": 3, "num_classes": 5, "optimizer": "sgd", "lr": 0.05, "momentum": 0.9,
    "nesterov": False, "weight_decay": 1e-4, "lr_schedule": "constant", "label_smoothing": 0.1,
    "vocab": 11, "sequence_length": 4, "dropout": 0.0,
}
RULES = {"num_classes": integer(2), "vocab": integer(2), "sequence_length": integer(1)}


def _image(g, c=3, h=9, w=8):
    return g.input("x", (c, h, w))


def _tokens(g, t=6):
    return g.input("tokens", (t,), dtype="int32")


def _head(g, x, label_smoothing=True):
    if len(g.shape_of(x)) > 1:
        x = g.add("head.flatten", "flatten", x)
    x = g.add("head.fc", "dense", x, units=HPARAMS["num_classes"])
    g.input("labels", (), dtype="int32", role="target")
    g.set_output(x)
    g.set_loss("softmax_cross_entropy", logits=x, labels="labels",
               label_smoothing=HPARAMS["label_smoothing"], ignore_index=None)
    return g


def conv2d(g, hp):
    x = _image(g)
    return _head(g, g.add("conv", "conv2d", x, filters=4, kernel=3, stride=2,
                          padding=((1, 0), (0, 1)), use_bias=True))


def conv2d_dilated(g, hp):
    """Dilation 2 with asymmetric padding: the kernel's taps skip a pixel, the padding does not."""
    x = _image(g)
    return _head(g, g.add("conv", "conv2d", x, filters=4, kernel=3, stride=1, dilation=2,
                          padding=((2, 1), (0, 2)), use_bias=True))


def conv2d_grouped(g, hp):
    """Two groups of 2 input channels, each producing 3 filters."""
    x = _image(g, 4, 7, 6)
    return _head(g, g.add("conv", "conv2d", x, filters=6, kernel=3, stride=(2, 1), groups=2,
                          padding=((0, 1), (1, 1)), use_bias=False))


def conv2d_depthwise(g, hp):
    """One group per channel (groups == channels == filters), as in MobileNet."""
    x = _image(g, 3, 8, 7)
    return _head(g, g.add("conv", "conv2d", x, filters=3, kernel=3, groups=3, padding=1,
                          use_bias=True))


def conv2d_1x1_strided(g, hp):
    x = _image(g)
    return _head(g, g.add("conv", "conv2d", x, filters=5, kernel=1, stride=2))


def batchnorm(g, hp):
    x = _image(g, 4, 5, 6)
    return _head(g, g.add("bn", "batchnorm", x, eps=1e-5, momentum=0.1))


def relu_add(g, hp):
    x = _image(g)
    y = g.add("relu", "relu", x)
    return _head(g, g.add("add", "add", [x, y]))


def maxpool2d(g, hp):
    x = _image(g)
    return _head(g, g.add("pool", "maxpool2d", x, kernel=3, stride=2, padding=((1, 0), (1, 1))))


def avgpool2d(g, hp):
    x = _image(g)
    return _head(g, g.add("pool", "avgpool2d", x, kernel=3, stride=2, padding=((1, 1), (1, 0)),
                          count_include_pad=False))


def avgpool2d_include_pad(g, hp):
    x = _image(g)
    return _head(g, g.add("pool", "avgpool2d", x, kernel=3, stride=2, padding=1,
                          count_include_pad=True))


def global_avgpool(g, hp):
    return _head(g, g.add("gap", "global_avgpool", _image(g)))


def flatten_dense(g, hp):
    """The head's flatten itself is the node under test: canonical (C, H, W) order."""
    return _head(g, _image(g, 2, 3, 4))


def _sequence(g, hp, d=6):
    return g.input("x", (hp["sequence_length"], d))


def dense_sequence(g, hp):
    x = _sequence(g, hp)
    return _head(g, g.add("dense", "dense", x, units=3))


def embedding(g, hp):
    return _head(g, g.add("embed", "embedding", _tokens(g), vocab=HPARAMS["vocab"], dim=4, scale=2.0))


def positional_encoding(g, hp):
    x = g.add("embed", "embedding", _tokens(g), vocab=HPARAMS["vocab"], dim=6)
    return _head(g, g.add("pos", "positional_encoding", x))


def layernorm(g, hp):
    x = _sequence(g, hp)
    return _head(g, g.add("norm", "layernorm", x, eps=1e-6))


def dropout(g, hp):
    return _head(g, g.add("drop", "dropout", _sequence(g, hp), rate=hp["dropout"]))


def _attention(g, causal, cross):
    tokens = _tokens(g, 6)
    x = g.add("embed", "embedding", tokens, vocab=HPARAMS["vocab"], dim=8)
    if cross:
        mem_tokens = g.input("memory_tokens", (5,), dtype="int32")
        mem = g.add("memory", "embedding", mem_tokens, vocab=HPARAMS["vocab"], dim=8)
        return _head(g, g.add("attn", "multi_head_attention", [x, mem, mem_tokens], num_heads=2))
    return _head(g, g.add("attn", "multi_head_attention", [x, x, tokens], num_heads=2, causal=causal))


def attention_self(g, hp):
    return _attention(g, causal=False, cross=False)


def attention_causal(g, hp):
    return _attention(g, causal=True, cross=False)


def attention_cross(g, hp):
    return _attention(g, causal=False, cross=True)


def tied_dense(g, hp):
    x = g.add("embed", "embedding", _tokens(g), vocab=HPARAMS["vocab"], dim=4)
    x = g.add("tied", "dense", x, units=HPARAMS["vocab"], use_bias=False,
              shared={"weight": "embed.weight"})
    return _head(g, x)


def batchnorm_batch_stats(g, hp):
    """BatchNorm without running statistics: the batch's own normalise in inference too."""
    x = _image(g, 4, 5, 6)
    return _head(g, g.add("bn", "batchnorm", x, track_running_stats=False))


def concat(g, hp):
    x = _image(g)
    a = g.add("conv", "conv2d", x, filters=2, kernel=3, padding=1)
    return _head(g, g.add("cat", "concat", [a, x], axis=0))


def tanh(g, hp):
    return _head(g, g.add("tanh", "tanh", _image(g)))


def upsample_nearest(g, hp):
    """A strided convolution after the upsampling sees whether each pixel was repeated in place."""
    y = g.add("up", "upsample_nearest", _image(g, 3, 5, 4), factor=2)
    return _head(g, g.add("conv", "conv2d", y, filters=3, kernel=3, stride=2, padding=((1, 0), (0, 1))))


def reshape(g, hp):
    """A convolution over the reshaped example sees whether the element order is canonical."""
    y = g.add("reshape", "reshape", _image(g, 3, 4, 6), shape=(6, 4, 3))
    return _head(g, g.add("conv", "conv2d", y, filters=2, kernel=(1, 2)))


def channel_layernorm(g, hp):
    return _head(g, g.add("ln", "channel_layernorm", _image(g, 4, 5, 6), eps=1e-5))


def lerp(g, hp):
    x = _image(g, 3, 5, 4)
    t = g.input("t", (1,))
    a = g.add("conv", "conv2d", x, filters=3, kernel=3, padding=1)
    return _head(g, g.add("lerp", "lerp", [a, x, t]))


def scale(g, hp):
    return _head(g, g.add("scale", "scale", _image(g), factor=-0.5))


def stop_gradient(g, hp):
    """The stopped branch's convolution must get a zero gradient, the other one not."""
    x = _image(g, 3, 5, 4)
    a = g.add("stopped", "conv2d", x, filters=2, kernel=3, padding=1)
    a = g.add("stop", "stop_gradient", a)
    b = g.add("conv", "conv2d", x, filters=2, kernel=3, padding=1)
    return _head(g, g.add("add", "add", [a, b]))


def ones_like(g, hp):
    x = _image(g, 3, 5, 4)
    a = g.add("conv", "conv2d", x, filters=2, kernel=3, padding=1)
    return _head(g, g.add("add", "add", [g.add("ones", "ones_like", a), a]))


def conv2d_input_grad(g, hp):
    """The transposed convolution of a strided, asymmetrically padded convolution whose stride
    leaves the input's last row unread, sharing its kernel."""
    x = _image(g)
    y = g.add("conv", "conv2d", x, filters=4, kernel=3, stride=2, padding=((1, 0), (0, 1)))
    y = g.add("relu", "relu", y)
    return _head(g, g.add("dx", "conv2d_input_grad", y, kernel=3, stride=2,
                          padding=((1, 0), (0, 1)), input_shape=(3, 9, 8),
                          shared={"weight": "conv.weight"}))


def dense_input_grad(g, hp):
    x = _sequence(g, hp)
    y = g.add("fc", "dense", x, units=4)
    return _head(g, g.add("dx", "dense_input_grad", y, in_features=6, shared={"weight": "fc.weight"}))


def relu_grad(g, hp):
    x = _image(g, 3, 5, 4)
    a = g.add("conv_a", "conv2d", x, filters=2, kernel=3, padding=1)
    b = g.add("conv_b", "conv2d", x, filters=2, kernel=3, padding=1)
    return _head(g, g.add("mask", "relu_grad", [a, b]))


def channel_layernorm_input_grad(g, hp):
    x = _image(g, 4, 5, 6)
    y = g.add("ln", "channel_layernorm", x)
    dy = g.add("conv", "conv2d", y, filters=4, kernel=3, padding=1)
    return _head(g, g.add("dx", "channel_layernorm_input_grad", [dy, x],
                          shared={"gamma": "ln.gamma"}))


# -- recurrent models: every lengths input is named <x>_lengths (see the module docstring) ----
def _ragged(g, t=6, d=3, name="x"):
    x = g.input(name, (t, d))
    return x, g.input(name + "_lengths", (), dtype="int32")


def lstm(g, hp):
    return _head(g, g.add("rnn", "lstm", list(_ragged(g)), units=4))


def lstm_bidirectional_sum(g, hp):
    """Two layers whose directions are concatenated between them and summed at the end; the
    NMT initialisation (U(-0.1, 0.1) plus a forget bias of 1) at a larger range."""
    return _head(g, g.add("rnn", "lstm", list(_ragged(g)), units=3, num_layers=2,
                          bidirectional=True, merge="sum", init=("uniform", 0.3),
                          forget_bias=1.0))


def gru(g, hp):
    return _head(g, g.add("rnn", "gru", list(_ragged(g)), units=4))


def gru_bidirectional(g, hp):
    return _head(g, g.add("rnn", "gru", list(_ragged(g)), units=3, bidirectional=True))


def additive_attention(g, hp):
    """Queries over a ragged memory: memory rows past each length must get no weight."""
    query = g.input("query", (4, 6))
    memory, lengths = _ragged(g, t=5, d=3, name="memory")
    return _head(g, g.add("attn", "additive_attention", [query, memory, lengths], units=5))


def sequence_batchnorm(g, hp):
    x, lengths = _ragged(g, t=6, d=4)
    return _head(g, g.add("bn", "sequence_batchnorm", [x, lengths], eps=1e-5, momentum=0.1))


def clipped_relu(g, hp):
    """A ceiling of 0.5 on standard-normal inputs: both ends clip."""
    return _head(g, g.add("clip", "clipped_relu", _image(g), ceiling=0.5))


def transpose(g, hp):
    """(C, T, F) -> (T, C, F), then a convolution that sees whether the element order moved."""
    y = g.add("tr", "transpose", _image(g, 3, 5, 4), perm=(1, 0, 2))
    return _head(g, g.add("conv", "conv2d", y, filters=2, kernel=(2, 3), padding=((0, 1), (1, 0))))


def ctc(g, hp):
    """Deep Speech 2 in miniature: a strided convolution over (time, frequency), the lengths it
    leaves, a bidirectional GRU over them and CTC over 5 classes (blank 0)."""
    x, lengths = _ragged(g, t=9, d=4)
    y = g.add("image", "reshape", x, shape=(1, 9, 4))
    y = g.add("conv", "conv2d", y, filters=2, kernel=3, stride=(2, 1), padding=1, use_bias=True)
    y = g.add("clip", "clipped_relu", y, ceiling=20.0)
    y = g.add("tr", "transpose", y, perm=(1, 0, 2))
    y = g.add("frames", "reshape", y, shape=(5, 8))
    frames = g.add("frame_lengths", "lengths_after_conv", lengths, kernel=3, stride=2,
                   padding=(1, 1))
    y = g.add("rnn", "gru", [y, frames], units=3, bidirectional=True, merge="sum")
    y = g.add("bn", "sequence_batchnorm", [y, frames])
    logits = g.add("logits", "dense", y, units=HPARAMS["num_classes"])
    labels = g.input("labels", (3,), dtype="int32", role="target")
    label_lengths = g.input("labels_lengths", (), dtype="int32", role="target")
    g.set_output(logits)
    g.set_program(single_objective(g, hp, "ctc", logits=logits, labels=labels,
                                   input_lengths=frames, label_lengths=label_lengths))
    return g


# -- detection: RoIAlign's sample points come in as inputs, drawn by ``roi_align_inputs`` -----
def _roi_features(g):
    x = _image(g, 3, 7, 6)
    return g.add("conv", "conv2d", x, filters=4, kernel=3, padding=((1, 0), (0, 1)),
                 use_bias=True)


def _roi_align(g, features, rois=3, output_size=(2, 3), sampling_ratio=2):
    samples = output_size[0] * output_size[1] * sampling_ratio ** 2
    indices = g.input("roi_indices", (rois, samples, 4), dtype="int32")
    weights = g.input("roi_weights", (rois, samples, 4))
    return g.add("roi", "roi_align", [features, indices, weights], output_size=output_size,
                 sampling_ratio=sampling_ratio)


def _program(g, hp, losses):
    """One objective summing ``losses`` ({name: (kind, inputs)}), one group, one update."""
    p = Program()
    for name, (kind, inputs) in losses.items():
        p.loss(name, kind, **inputs)
    p.objective("total", {name: 1.0 for name in losses})
    p.group("all", "*", optimizer_of(hp), schedule_of(hp))
    p.phase("train", "total", "all")
    g.set_program(p)
    return g


def roi_align(g, hp):
    """Bilinear taps of 3 RoIs on a 7 x 6 feature map, 2 x 3 bins of 2 x 2 samples."""
    return _head(g, _roi_align(g, _roi_features(g)))


def roi_align_to_batch_head(g, hp):
    """Faster R-CNN's box head in miniature: RoIAlign, the RoIs folded into the batch, a
    convolution, global pooling, a classifier (softmax cross-entropy, ignore_index -1) and
    class-specific box regression (smooth L1) over the RoIs as examples."""
    y = g.add("rois", "to_batch", _roi_align(g, _roi_features(g)))
    y = g.add("head.conv", "conv2d", y, filters=5, kernel=3, padding=1)
    y = g.add("head.bn", "frozen_batchnorm", y)
    y = g.add("head.relu", "relu", y)
    y = g.add("head.pool", "global_avgpool", y)
    cls = g.add("cls", "dense", y, units=HPARAMS["num_classes"])
    box = g.add("box", "dense", y, units=4 * HPARAMS["num_classes"])
    labels = g.add("roi_labels", "to_batch", g.input("labels", (3,), dtype="int32", role="target"))
    targets = g.add("box_targets", "to_batch", g.input("targets", (3, 4 * HPARAMS["num_classes"]),
                                                     role="target"))
    weights = g.add("box_weights", "to_batch", g.input("targets_weight",
                                                       (3, 4 * HPARAMS["num_classes"]),
                                                       role="target"))
    g.set_output(cls)
    return _program(g, hp, OrderedDict([
        ("cls", ("softmax_cross_entropy", {"logits": cls, "labels": labels, "ignore_index": -1})),
        ("box", ("smooth_l1", {"prediction": box, "target": targets, "weight": weights,
                               "sigma": 1.0, "normalizer": 1.0}))]))


def frozen_batchnorm(g, hp):
    """A convolution before it receives the gradient through the frozen affine."""
    y = g.add("conv", "conv2d", _image(g, 3, 5, 6), filters=4, kernel=3, padding=1)
    return _head(g, g.add("bn", "frozen_batchnorm", y, eps=0.0))


def sigmoid_cross_entropy(g, hp):
    """An RPN head in miniature: objectness logits per anchor (sigmoid cross-entropy over the
    sampled ones) and box deltas (smooth L1 with sigma 3, normalised by the sampled count)."""
    y = g.add("conv", "conv2d", _image(g, 3, 5, 6), filters=4, kernel=3, padding=1)
    y = g.add("relu", "relu", y)
    logits = g.add("objectness", "conv2d", y, filters=3, kernel=1, use_bias=True)
    deltas = g.add("deltas", "conv2d", y, filters=12, kernel=1, use_bias=True)
    labels = g.input("labels", (3, 5, 6), role="target")
    sampled = g.input("labels_weight", (3, 5, 6), role="target")
    targets = g.input("targets", (12, 5, 6), role="target")
    positive = g.input("targets_weight", (12, 5, 6), role="target")
    g.set_output(logits)
    return _program(g, hp, OrderedDict([
        ("objectness", ("sigmoid_cross_entropy", {"logits": logits, "labels": labels,
                                                  "weight": sampled})),
        ("deltas", ("smooth_l1", {"prediction": deltas, "target": targets, "weight": positive,
                                  "sigma": 3.0, "normalizer": 16.0}))]))


def _policy(g):
    """Logits over 5 actions from a (7,) observation: the actor-critic losses' probes."""
    return g.add("policy", "dense", g.input("x", (7,)), units=HPARAMS["num_classes"])


def policy_gradient(g, hp):
    """The policy-gradient loss on recorded actions (``labels``) and advantages."""
    logits = _policy(g)
    actions = g.input("labels", (), dtype="int32", role="target")
    advantages = g.input("advantages", (), role="target")
    g.set_output(logits)
    g.set_program(single_objective(g, hp, "policy_gradient", logits=logits, actions=actions,
                                   advantages=advantages))
    return g


def entropy(g, hp):
    logits = _policy(g)
    g.set_output(logits)
    g.set_program(single_objective(g, hp, "entropy", logits=logits))
    return g


def squared_error(g, hp):
    """A (3,) prediction against a target: the value loss's kind on more than one element."""
    prediction = g.add("value", "dense", g.input("x", (7,)), units=3)
    target = g.input("target", (3,), role="target")
    g.set_output(prediction)
    g.set_program(single_objective(g, hp, "squared_error", prediction=prediction, target=target))
    return g


PROBES = OrderedDict((fn.__name__, fn) for fn in (
    conv2d, conv2d_dilated, conv2d_grouped, conv2d_depthwise, conv2d_1x1_strided, batchnorm,
    relu_add, maxpool2d, avgpool2d, avgpool2d_include_pad, global_avgpool, flatten_dense, dense_sequence,
    embedding, positional_encoding, layernorm,
    dropout, attention_self, attention_causal, attention_cross, tied_dense,
    batchnorm_batch_stats, concat, tanh, upsample_nearest, reshape, channel_layernorm, lerp, scale,
    stop_gradient, ones_like, conv2d_input_grad, dense_input_grad, relu_grad,
    channel_layernorm_input_grad, lstm, lstm_bidirectional_sum, gru, gru_bidirectional,
    additive_attention, sequence_batchnorm, clipped_relu, transpose, ctc, roi_align,
    roi_align_to_batch_head, frozen_batchnorm, sigmoid_cross_entropy, policy_gradient,
    entropy, squared_error))


TOP_SCORES = 2  # positions the targets probe keeps per example by score; one more at random


@register_targets("probe.top_scores")
def top_scores(values, inputs, hparams, rng):
    """A toy of detection's RoI sampling: per example, the ``TOP_SCORES`` positions of highest
    foreground score (the best non-background logit minus the background one; ties go to the
    lower position) and one more drawn at random among the rest keep their label; every other
    position is written 0, which the loss ignores."""
    logits, labels = values["logits"], inputs["labels"]
    scores = logits[..., 1:].max(axis=-1) - logits[..., 0]
    sampled = np.zeros_like(labels)
    for n in range(len(labels)):
        order = np.argsort(-scores[n], kind="stable")
        chosen = list(order[:TOP_SCORES])
        rest = order[TOP_SCORES:]
        if len(rest):
            chosen.append(rest[rng.randint(len(rest))])
        sampled[n, chosen] = labels[n, chosen]
    return {"sampled_labels": sampled}


def targets_topk(g, hp, repeat=1):
    """Per-position class scores over (P, D) features; the program's targets step reads them
    and writes which positions the cross-entropy counts (``top_scores``)."""
    x = g.input("x", (5, 3))
    h = g.add("hidden", "dense", x, units=4)
    h = g.add("hidden_tanh", "tanh", h)
    logits = g.add("logits", "dense", h, units=HPARAMS["num_classes"])
    g.input("labels", (5,), dtype="int32", role="target")
    sampled = g.input("sampled_labels", (5,), dtype="int32", role="target")
    g.set_output(logits)
    p = Program()
    p.loss("loss", "softmax_cross_entropy", logits=logits, labels=sampled, label_smoothing=0.0,
           ignore_index=0)
    p.objective("loss", {"loss": 1.0})
    p.group("all", "*", optimizer_of(hp), schedule_of(hp))
    p.phase("train", "loss", "all", repeat=repeat)
    p.targets("sample", "probe.top_scores", reads=[logits], writes=[sampled],
              inputs=["labels"])
    g.set_program(p)
    return g


def targets_topk_repeated(g, hp):
    """The same with two updates per step, each on its own examples: the targets of both are
    computed before the first update, each from its own random stream."""
    return targets_topk(g, hp, repeat=2)


PROGRAM_PROBES = OrderedDict((fn.__name__, fn) for fn in (targets_topk, targets_topk_repeated))
ALL_PROBES = OrderedDict(list(PROBES.items()) + list(PROGRAM_PROBES.items()))


def ragged_lengths(rng, batch_size, t):
    """Lengths in [1, t]: the first example at full length, the last one short (about half)."""
    lengths = rng.randint(1, t + 1, size=batch_size)
    lengths[0] = t
    if batch_size > 1:
        lengths[-1] = max(1, t // 2)
    return lengths.astype(np.int32)


def ctc_labels(rng, frames, max_labels, num_classes):
    """(labels (N, max_labels), lengths (N,)): ids in [1, num_classes), padded with 0, each
    alignable with its example's ``frames`` (one frame per label, one more per repeat). The
    first example repeats a label when its frames allow, so the blank between repeats is
    exercised."""
    n = len(frames)
    labels, lengths = np.zeros((n, max_labels), np.int32), np.zeros(n, np.int32)
    for i, f in enumerate(frames):
        length = rng.randint(1, min(max_labels, int(f)) + 1)
        row = []
        for _ in range(length):  # no two equal neighbours: length frames suffice
            choices = [c for c in range(1, num_classes) if not row or c != row[-1]]
            row.append(choices[rng.randint(len(choices))])
        if i == 0 and length >= 2 and length + 1 <= f:
            row[1] = row[0]
        labels[i, :length], lengths[i] = row, length
    return labels, lengths


def roi_align_inputs(rng, batch_size, rois, samples, height, width):
    """(indices (N, R, S, 4) int32, weights (N, R, S, 4)): each sample's four bilinear taps,
    the neighbouring cells (y, x), (y, x + 1), (y + 1, x), (y + 1, x + 1) of a random point
    with their interpolation weights, as tbdzoo/models/faster_rcnn/detection/ computes them."""
    shape = (batch_size, rois, samples)
    y, x = rng.randint(0, height - 1, size=shape), rng.randint(0, width - 1, size=shape)
    ly, lx = rng.uniform(size=shape), rng.uniform(size=shape)
    base = y * width + x
    indices = np.stack([base, base + 1, base + width, base + width + 1], axis=-1)
    weights = np.stack([(1 - ly) * (1 - lx), (1 - ly) * lx, ly * (1 - lx), ly * lx], axis=-1)
    return indices.astype(np.int32), weights.astype(np.float32)


def _batch_for(build_graph):
    def make(hp, batch_size, seed):
        graph = build_graph(hp)
        rng = np.random.RandomState(seed)
        batch = {}
        written = graph.program.written_inputs() if graph.program is not None else []
        for inp in graph.inputs.values():
            if inp.name in written:
                continue  # the program's targets step writes it every step
            shape = (batch_size,) + inp.shape
            if _is_lengths(graph, inp):
                if inp.role == "feature":
                    t = graph.inputs[inp.name[:-len("_lengths")]].shape[0]
                    batch[inp.name] = ragged_lengths(rng, batch_size, t)
            elif inp.role == "target" and graph.program is not None and \
                    inp.name + "_lengths" in graph.inputs:
                pass  # CTC labels, drawn below with their lengths
            elif inp.role == "target" and inp.dtype == "float32":  # advantages, value targets
                batch[inp.name] = rng.standard_normal(shape).astype(np.float32)
            elif inp.role == "target":
                batch[inp.name] = rng.randint(0, hp["num_classes"], size=shape).astype(np.int32)
            elif inp.dtype == "int32":
                tokens = rng.randint(1, hp["vocab"], size=shape).astype(np.int32)
                for row in tokens:  # pad (id 0) the tail of each row, never all of it
                    row[rng.randint(max(1, shape[1] // 2), shape[1] + 1):] = 0
                batch[inp.name] = tokens
            else:
                batch[inp.name] = rng.standard_normal(shape).astype(np.float32)
        for loss in (graph.program.losses.values() if graph.program is not None else ()):
            if loss["kind"] == "ctc":
                roles = loss["inputs"]
                frames = sequences.resolve_lengths(graph, roles["input_lengths"], batch)
                batch[roles["labels"]], batch[roles["label_lengths"]] = ctc_labels(
                    rng, frames, graph.inputs[roles["labels"]].shape[0],
                    graph.shape_of(roles["logits"])[1])
        for node in graph.nodes.values():
            if node.op == "roi_align" and node.inputs[1] in graph.inputs:
                _, height, width = graph.shape_of(node.inputs[0])
                rois, samples, _ = graph.shape_of(node.inputs[1])
                batch[node.inputs[1]], batch[node.inputs[2]] = roi_align_inputs(
                    rng, batch_size, rois, samples, height, width)
        for loss in (graph.program.losses.values() if graph.program is not None else ()):
            ignore = loss["attrs"].get("ignore_index")
            labels = _input_behind(graph, loss["inputs"].get("labels"))
            if loss["kind"] == "softmax_cross_entropy" and ignore is not None and \
                    labels in batch and batch[labels].ndim > 1:
                batch[labels][0, -1] = ignore  # one ignored RoI
            for role in ("weight", "labels"):  # 0/1 masks and binary labels
                name = loss["inputs"].get(role)
                if name in graph.inputs and graph.inputs[name].dtype == "float32":
                    batch[name] = rng.randint(0, 2, size=batch[name].shape).astype(np.float32)
        return batch
    return make


def _input_behind(graph, name):
    """The graph input that value ``name`` is, or comes from through to_batch folds."""
    while name in graph.nodes and graph.nodes[name].op == "to_batch":
        name = graph.nodes[name].inputs[0]
    return name


def _is_lengths(graph, inp):
    """An input named <x>_lengths, int32 of shape (), where <x> is an input."""
    return inp.name.endswith("_lengths") and inp.dtype == "int32" and inp.shape == () and \
        inp.name[:-len("_lengths")] in graph.inputs


def get_probe(name):
    fn = ALL_PROBES[name]

    def build_graph(hp):
        return fn(Graph("probe/" + name), hp)
    return ModelDef("probe/" + name, "node test", {"tiny": dict(HPARAMS), "paper": dict(HPARAMS)},
                    build_graph, _batch_for(build_graph), "examples/s",
                    lambda hp, batch: len(next(iter(batch.values())))).constrain(RULES)
