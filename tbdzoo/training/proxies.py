"""Proxy configs: the paper config with overrides that make a model converge in a few minutes
on a 2-core CPU, on the data sets `tbd data make` writes. Each keeps the model's optimizer and
schedule and shrinks only its size (reports/2026-12-time-to-accuracy.md gives the measured steps
and minutes).
Each model's card holds its own (``get_model(name).training``: base_config, proxy); each
task module holds the ``tbd data make`` command of its data (``data_command``).
"""
from ..models import get_model, list_models
from .errors import TrainingError

__all__ = ["proxy_overrides", "training_of", "trainable_models"]


def trainable_models():
    """The models with a training task, in list_models() order."""
    return [m for m in list_models() if get_model(m).training is not None]


def training_of(model_name):
    """The model's training card; a TrainingError names the models `tbd train` trains."""
    if model_name not in list_models():
        raise TrainingError("unknown model {!r}; tbd train trains {}".format(
            model_name, ", ".join(sorted(trainable_models()))))
    training = get_model(model_name).training
    if training is None:   # a model registered elsewhere, without a task
        raise TrainingError(
            "{} has no training task yet: tbd train trains {} (docs/training.md says what is "
            "not covered)".format(model_name, ", ".join(sorted(trainable_models()))))
    return training


def proxy_overrides(model_name):
    """(base config, overrides) of the model's proxy."""
    training = training_of(model_name)
    return training.base_config, dict(training.proxy)
