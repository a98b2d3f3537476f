"""Which metric each model is trained to, its range and direction, and the parsing of
``METRIC=VALUE``. A model missing from METRICS has no task yet (docs/training.md lists them)."""
import collections

from .errors import TrainingError
from ..models import list_models

__all__ = ["Metric", "Target", "METRICS", "metrics_of", "parse_target"]

Metric = collections.namedtuple("Metric", "name low high higher_is_better what")

_TOP1 = Metric("top1", 0.0, 1.0, True, "top-1 accuracy on the held-out split (val/)")
# CartPole-v1's episodes end at 500 steps, one reward a step.
_RETURN = Metric("return", 0.0, 500.0, True,
                 "mean return of the last 100 finished training episodes (train_a2c's window)")

_TOKENS = Metric("token_accuracy", 0.0, 1.0, True,
                 "teacher-forced next-word accuracy on the held-out split (tst2013)")
_SENTENCES = Metric("sentence_accuracy", 0.0, 1.0, True,
                    "fraction of held-out sentences with every word right, teacher-forced")
_EXACT = Metric("exact_match", 0.0, 1.0, True,
                "fraction of held-out sentences that greedy decoding writes word for word")
_BLEU = Metric("bleu", 0.0, 100.0, True,
               "corpus BLEU (0-100, sacrebleu on the data set's words) of greedy decoding on "
               "the held-out split")

_CER = Metric("cer", 0.0, 1.0, False, "character error rate of greedy CTC decoding on the "
              "held-out voices (test-clean); lower is better")
_WER = Metric("wer", 0.0, 1.0, False, "word error rate of the same decoding; lower is better")

_MAP = Metric("map", 0.0, 1.0, True, "PASCAL VOC2007 mAP (11-point AP at IoU 0.5, difficult "
              "objects ignored) of the detections on the held-out images (ImageSets/Main/test)")
_FRECHET = Metric("frechet", 0.0, 1000.0, False,
                  "Frechet distance of 500 generated images from the held-out images, on a "
                  "frozen classifier's features (valid_64x64/; training/frechet.py); lower is "
                  "better")

METRICS = {
    "resnet50": (_TOP1,),
    "inception_v3": (_TOP1,),
    "a3c": (_RETURN,),
    "seq2seq": (_TOKENS, _SENTENCES, _EXACT, _BLEU),
    "transformer": (_TOKENS, _SENTENCES, _EXACT, _BLEU),
    "deepspeech2": (_CER, _WER),
    "faster_rcnn": (_MAP,),
    "wgan": (_FRECHET,),
}


class Target(collections.namedtuple("Target", "metric value")):
    """A metric and the value to reach; ``met(x)`` says whether ``x`` reaches it."""

    def met(self, value):
        if value is None or value != value:       # None or NaN: not measured yet
            return False
        return value >= self.value if self.metric.higher_is_better else value <= self.value

    def __str__(self):
        return "{}={:g}".format(self.metric.name, self.value)


def metrics_of(model_name):
    if model_name not in METRICS:
        if model_name not in list_models():
            raise TrainingError("unknown model {!r}; tbd train trains {}".format(
                model_name, ", ".join(sorted(METRICS))))
        raise TrainingError(  # a model registered elsewhere, without a task here
            "{} has no training task yet: tbd train trains {} (docs/training.md says what is "
            "not covered)".format(model_name, ", ".join(sorted(METRICS))))
    return METRICS[model_name]


def parse_target(model_name, text):
    """``"top1=0.8"`` (or a (name, value) pair) as a Target checked against the model's
    metrics and the metric's range."""
    metrics = {m.name: m for m in metrics_of(model_name)}
    if isinstance(text, tuple):
        name, value = text
    else:
        name, sep, value = str(text).partition("=")
        if not sep:
            raise TrainingError("target {!r}: write METRIC=VALUE, e.g. {}={:g}".format(
                text, next(iter(metrics)), _example(next(iter(metrics.values())))))
    name = name.strip()
    if name not in metrics:
        raise TrainingError("{} is not a metric of {}; its metrics: {}".format(
            name, model_name, ", ".join("{} ({})".format(m.name, m.what)
                                        for m in metrics.values())))
    metric = metrics[name]
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TrainingError("target {}={!r}: the value must be a number between {:g} and "
                            "{:g}".format(name, value, metric.low, metric.high))
    if not metric.low < number <= metric.high:
        raise TrainingError("target {}={:g} is out of range: {} takes a value above {:g} and at "
                            "most {:g}".format(name, number, name, metric.low, metric.high))
    if not metric.higher_is_better and number == metric.high:
        raise TrainingError("target {}={:g} is met before any training; give a value below "
                            "{:g}".format(name, number, metric.high))
    return Target(metric, number)


def _example(metric):
    return metric.low + 0.8 * (metric.high - metric.low)
