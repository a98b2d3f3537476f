"""Deep Speech 2 (Amodei et al. 2016) as TBD trained it on MXNet: two 2-D convolutions over a
spectrogram, seven bidirectional GRU layers, a fully connected layer, and CTC over characters.

The input is a normalised log spectrogram (tbdzoo/datasets/spectrogram.py): (T, 161) frames of
10 ms with per-example lengths. It is read as a one-channel image (1, T, 161) of time by
frequency; the convolutions subsample both axes without padding, and the lengths after each
convolution are computed in the graph (``lengths_after_conv``), so CTC reads exactly the valid
output steps. The channels of each step are flattened (channel-major, as the MXNet model's
transpose and reshape do) into the GRUs' input.

One deliberate change from TBD's model (docs/models/deepspeech2.md): BatchNorm sits on each recurrent
layer's input, over the batch and the valid steps (``sequence_batchnorm``, as the DS2 paper and
deepspeech.pytorch do), instead of on the input projection inside the GRU's gates, so that every
framework runs its fused GRU kernel.

Values carry their source: [T] TBD's ``deepspeech.cfg`` and ``train.py`` (tbd-suite,
SpeechRecognition/DeepSpeech2/MXNet), [M] the MXNet speech_recognition example they run
(``arch_deepspeech.py``, ``stt_layer_conv.py``, ``stt_layer_fc.py``, ``stt_layer_batchnorm.py``),
[P] the DS2 paper, [D] deepspeech.pytorch's loader (the front-end).
"""
import math

import numpy as np

from ...datasets import spectrogram, synthetic
from ...errors import BatchError
from ...spec import Graph
from ...spec.program import clip_of, single_objective
from .. import metrics
from ..card import Benchmark, Consistency, Measured, Training
from ..constraints import integer, integers, number
from ..registry import register_model

# The output classes: CTC's blank (id 0, written "_"), space, apostrophe and a-z.
ALPHABET = "_ '" + "abcdefghijklmnopqrstuvwxyz"

PAPER = {
    # the front-end [D]: 16 kHz, 20 ms Hamming window, 10 ms hop: 161 bins ([T] width = 161)
    "sample_rate": 16000, "window_ms": 20.0, "hop_ms": 10.0,
    "max_frames": 1600,              # [T] max_duration = 16.0 s: a synthetic batch pads to it
    "chars_per_second": 15.0,        # synthetic transcripts (docs/models/deepspeech2.md: an assumption)
    # [T] channel_num 32; filter and stride as (time, frequency): conv_layer1 [11, 41] stride
    # [2, 2], conv_layer2 [11, 21] stride [1, 2] ([P]: 41x11 and 21x11 over (frequency, time));
    # no padding ([M] Convolution's default).
    "channels": 32,
    "conv1_kernel": (11, 41), "conv1_stride": (2, 2),
    "conv2_kernel": (11, 21), "conv2_stride": (1, 2),
    # [M] every activation is a plain ReLU (0 here); the DS2 paper clips at 20 (relu_ceiling=20).
    "relu_ceiling": 0.0,
    "rnn_layers": 7, "rnn_units": 1760,   # [T] num_rnn_layer 7, num_hidden_rnn_list, rnn_type bigru
    "fc_units": 1760,                # [T] num_rear_fc_layers 1 of 1760, relu (0: no such layer)
    "num_classes": len(ALPHABET),    # 29 ([T] used bi-graphemes: docs/models/deepspeech2.md)
    "bn_eps": 1e-3,                  # [M] batchnorm eps 0.001
    "bn_momentum": 0.1,              # [M] momentum 0.9 of the running value: new-batch weight 0.1
    "batch_size": 8,                 # [T]
    # [T] sgd, momentum 0.9, learning_rate 3e-4, weight_decay 0. [T]'s train.py divides the rate
    # by learning_rate_annealing 1.1 once, after the first epoch; a timed run never gets there.
    "optimizer": "sgd", "lr": 3e-4, "momentum": 0.9, "nesterov": False, "weight_decay": 0.0,
    "lr_schedule": "constant",
    "grad_clip_value": 100.0,        # [T] clip_gradient = 100: element-wise
}

# A few frequency bins (an 1.6 kHz "sample rate" gives 17), small kernels, two GRU layers of 8,
# ragged utterances of 15 to 30 frames; the clipped ReLU, so tests exercise that node.
TINY = dict(PAPER, sample_rate=1600, max_frames=30, channels=3, conv1_kernel=(3, 5),
            conv2_kernel=(3, 3), relu_ceiling=20.0, rnn_layers=2, rnn_units=8, fc_units=6,
            batch_size=3)

RULES = {
    "sample_rate": integer(100), "window_ms": number(0.0, open_low=True),
    "hop_ms": number(0.0, open_low=True), "max_frames": integer(1),
    "chars_per_second": number(0.0, open_low=True), "channels": integer(1),
    "conv1_kernel": integers(1), "conv1_stride": integers(1),
    "conv2_kernel": integers(1), "conv2_stride": integers(1),
    "relu_ceiling": number(0.0), "rnn_layers": integer(1), "rnn_units": integer(1),
    "fc_units": integer(0), "num_classes": integer(2), "bn_eps": number(0.0, open_low=True),
    "bn_momentum": number(0.0, 1.0), "grad_clip_value": number(0.0),
}

CONVS = ("conv1", "conv2")


def _pairs(hp):
    for key in ("conv1_kernel", "conv1_stride", "conv2_kernel", "conv2_stride"):
        if len(hp[key]) != 2:
            return "{} = {} must be two integers, (time, frequency)".format(key, hp[key])


def _input_fits(hp):
    if _pairs(hp):
        return None
    bins = spectrogram.num_bins(hp["sample_rate"], hp["window_ms"])
    width = bins
    for conv in CONVS:
        width = (width - hp[conv + "_kernel"][1]) // hp[conv + "_stride"][1] + 1
    if width < 1:
        return ("the spectrogram's {} frequency bins are fewer than the convolutions' frequency "
                "kernels need; raise sample_rate or window_ms, or shrink the kernels".format(bins))
    if min_frames(hp) > hp["max_frames"]:
        return ("max_frames {} is shorter than the convolutions' receptive field in time ({} "
                "frames)".format(hp["max_frames"], min_frames(hp)))


def min_frames(hp):
    """The fewest input frames that give one output step: the convolutions' extent in time."""
    (k1, _), (s1, _), (k2, _) = hp["conv1_kernel"], hp["conv1_stride"], hp["conv2_kernel"]
    return (k2 - 1) * s1 + k1


def output_steps(hp, frames):
    """Output steps of utterances of ``frames`` frames: what ``lengths_after_conv`` computes
    (no padding, at least 1)."""
    steps = np.asarray(frames, dtype=np.int64)
    for conv in CONVS:
        k, s = hp[conv + "_kernel"][0], hp[conv + "_stride"][0]
        steps = np.maximum((steps - k) // s + 1, 1)
    return steps


def max_label_length(hp):
    """The padded transcript length: characters of the longest utterance."""
    return max(1, int(math.ceil(hp["max_frames"] * hp["hop_ms"] / 1000.0 * hp["chars_per_second"])))


def _batch(hp, batch_size, seed):
    return synthetic.utterances(
        batch_size, hp["max_frames"], hp["num_classes"], lambda n: int(output_steps(hp, n)),
        max_label_length(hp), hp["chars_per_second"], min_frames=min_frames(hp),
        sample_rate=hp["sample_rate"], window_ms=hp["window_ms"], hop_ms=hp["hop_ms"], seed=seed)


def check_batch(hp, batch):
    """Raise BatchError when an utterance's length leaves [the frames the convolutions read for
    one output step, the padded length], or a transcript holds anything but 0 (CTC's blank, which pads) past its
    length. The rest (transcript lengths, character ids in [1, num_classes),
    transcripts CTC can align with their output steps) is the shared check's
    (common/batches.py), from the graph."""
    if "spectrogram_lengths" in batch:
        lengths = np.asarray(batch["spectrogram_lengths"])
        low, padded = min_frames(hp), hp["max_frames"]
        bad = (lengths < low) | (lengths > padded)
        if bad.any():
            row = int(np.argwhere(bad)[0][0])
            raise BatchError("batch['spectrogram_lengths'][{}] = {} is outside [{}, {}]: at "
                             "most the padded length, and at least the {} frames the "
                             "convolutions read for one output step".format(
                                 row, int(lengths[row]), low, padded, low),
                             input="spectrogram_lengths", position=(row,),
                             value=int(lengths[row]), allowed=(low, padded))
    if "labels" not in batch or "label_lengths" not in batch:
        return
    labels, label_lengths = np.asarray(batch["labels"]), np.asarray(batch["label_lengths"])
    valid = (label_lengths >= 0) & (label_lengths <= labels.shape[1])  # else the shared check's
    past = (np.arange(labels.shape[1])[None, :] >= label_lengths[:, None]) & (labels != 0) \
        & valid[:, None]
    if past.any():
        row, col = (int(v) for v in np.argwhere(past)[0])
        raise BatchError("batch['labels'][{}, {}] = {} lies past label_lengths[{}] = {}: a "
                         "transcript is padded with 0 (CTC's blank)".format(
                             row, col, labels[row, col], row, label_lengths[row]),
                         input="labels", position=(row, col), value=int(labels[row, col]),
                         allowed=0)


def _audio_seconds(hp, batch):
    """Seconds of audio in the batch (valid frames of 10 ms each): the throughput unit."""
    return float(np.asarray(batch["spectrogram_lengths"]).sum()) * hp["hop_ms"] / 1000.0


def _xavier(fan_in):
    """[T] initializer Xavier, init_scale 2, factor_type in: U(-sqrt(2 / fan_in), +)."""
    return ("uniform", math.sqrt(2.0 / fan_in))


# -- the rest of the card (tbdzoo/models/card.py) -------------------------------------------
# The proxy: the paper's two convolutions with 8 channels, 2 bidirectional GRU layers of 64
# (not 7 of 1,760), utterances of up to 4 s (400 frames); SGD with momentum at the paper's 3e-4.
TRAINING = Training(metrics=(metrics.CER, metrics.WER), target="cer=0.7", eval_every=50,
                    task="tbdzoo.training.speech_task:SpeechTask", data_parallel="batch slices",
                    proxy={"channels": 8, "rnn_layers": 2, "rnn_units": 64, "fc_units": 64,
                           "batch_size": 16, "max_frames": 400})
# On a CPU the suite runs one utterance a step, and a smaller batch is not enough: one 16 s
# utterance is 0.6 TFLOP forward (docs/benchmarks.md), minutes per step on a small CPU, and
# even at 2 s a PyTorch step took 81 s on a busy 2-core machine (the GRUs' 1,760-wide weights
# are read once per time step), so a CPU suite run pads its synthetic utterances to 1 s. The
# record names the override.
BENCHMARK = Benchmark(cpu_batch_size=1, cpu_overrides={"max_frames": 100})
# Ragged utterances, convolutions, GRUs and CTC.
CONSISTENCY = Consistency()
MEASURED = Measured(parameters=366865757, flops_per_example=584872723040)


@register_model("deepspeech2", domain="speech recognition", configs={"paper": PAPER, "tiny": TINY},
                unit="audio seconds/s", items=_audio_seconds, synthetic_batch=_batch, rules=RULES,
                checks=(_pairs, _input_fits), check_batch=check_batch,
                training=TRAINING, benchmark=BENCHMARK, consistency=CONSISTENCY, measured=MEASURED)
def build(hp):
    g = Graph("deepspeech2")
    g.block("", "DeepSpeech2")
    g.block("rnn", "BatchRNNStack")
    bins = spectrogram.num_bins(hp["sample_rate"], hp["window_ms"])
    x = g.input("spectrogram", (hp["max_frames"], bins))
    lengths = g.input("spectrogram_lengths", (), dtype="int32")
    g.input("labels", (max_label_length(hp),), dtype="int32", role="target")
    g.input("label_lengths", (), dtype="int32", role="target")

    def activation(name, x):
        if hp["relu_ceiling"] > 0:
            return g.add(name, "clipped_relu", x, ceiling=hp["relu_ceiling"])
        return g.add(name, "relu", x)

    def batchnorm(name, x, lengths=None):
        kw = {"eps": hp["bn_eps"], "momentum": hp["bn_momentum"]}
        if lengths is None:
            return g.add(name, "batchnorm", x, **kw)
        return g.add(name, "sequence_batchnorm", [x, lengths], **kw)

    x = g.add("reshape", "reshape", x, shape=(1, hp["max_frames"], bins))
    for conv in CONVS:
        cin = g.shape_of(x)[0]
        kernel, stride = hp[conv + "_kernel"], hp[conv + "_stride"]
        x = g.add(conv, "conv2d", x, filters=hp["channels"], kernel=kernel, stride=stride,
                  weight_init=_xavier(cin * kernel[0] * kernel[1]))
        # [M] conv() applies its activation, then the model its BatchNorm
        x = activation(conv + ".act", x)
        x = batchnorm(conv + ".bn", x)
        lengths = g.add(conv + ".lengths", "lengths_after_conv", lengths, kernel=kernel[0],
                        stride=stride[0], padding=(0, 0))
    channels, steps, width = g.shape_of(x)
    x = g.add("transpose", "transpose", x, perm=(1, 0, 2))          # (T', C, F')
    x = g.add("flatten", "reshape", x, shape=(steps, channels * width))
    for i in range(hp["rnn_layers"]):
        x = batchnorm("rnn.{}.bn".format(i), x, lengths)
        x = g.add("rnn.{}".format(i), "gru", [x, lengths], units=hp["rnn_units"],
                  bidirectional=True, merge="concat")
    if hp["fc_units"]:
        # [M] sequence_fc under is_batchnorm: no bias, BatchNorm, then the activation
        x = g.add("fc", "dense", x, units=hp["fc_units"], use_bias=False,
                  init=_xavier(g.shape_of(x)[-1]))
        x = batchnorm("fc.bn", x, lengths)
        x = activation("fc.act", x)
    logits = g.add("output", "dense", x, units=hp["num_classes"], init=_xavier(g.shape_of(x)[-1]))
    g.set_output(logits)

    g.set_program(single_objective(g, hp, "ctc", clip=clip_of(hp), name="ctc", logits=logits,
                                   labels="labels", input_lengths=lengths,
                                   label_lengths="label_lengths"))
    return g
