"""Which metric each model is trained to (its card's ``training.metrics``: range and
direction), and the parsing of ``METRIC=VALUE``. A model without a training card has no task
yet (docs/training.md lists them)."""
import collections

from .errors import TrainingError
from .proxies import training_of

__all__ = ["Target", "metrics_of", "parse_target"]

class Target(collections.namedtuple("Target", "metric value")):
    """A metric and the value to reach; ``met(x)`` says whether ``x`` reaches it."""

    def met(self, value):
        if value is None or value != value:       # None or NaN: not measured yet
            return False
        return value >= self.value if self.metric.higher_is_better else value <= self.value

    def __str__(self):
        return "{}={:g}".format(self.metric.name, self.value)


def metrics_of(model_name):
    return training_of(model_name).metrics


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
                            "{:g}".format(name, value, metric.low, metric.high)) from None
    if not metric.low < number <= metric.high:
        raise TrainingError("target {}={:g} is out of range: {} takes a value above {:g} and at "
                            "most {:g}".format(name, number, name, metric.low, metric.high))
    if not metric.higher_is_better and number == metric.high:
        raise TrainingError("target {}={:g} is met before any training; give a value below "
                            "{:g}".format(name, number, metric.high))
    return Target(metric, number)


def _example(metric):
    return metric.low + 0.8 * (metric.high - metric.low)
