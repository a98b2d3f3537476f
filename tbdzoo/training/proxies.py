"""Proxy configs: the paper config with overrides that make a model converge in a few minutes
on a 2-core CPU, on the data sets `tbd data make` writes. Each keeps the model's optimizer and
schedule and shrinks only its size (docs/training.md gives the measured steps and minutes).

    tbd data make fashion-mnist-imagenet --out data/fm32 --set size=32 \\
        --set train_per_class=200 --set val_per_class=50
"""
from .errors import TrainingError

__all__ = ["PROXIES", "proxy_overrides", "DATA_COMMAND"]

DATA_COMMAND = {
    "image_classification": "tbd data make fashion-mnist-imagenet --out DIR --set size=32 "
                            "--set train_per_class=200 --set val_per_class=50",
}

PROXIES = {
    # One bottleneck block a stage, 8 channels wide, 32 pixels, ten classes; SGD with momentum
    # at the paper's lr 0.1. train_examples sets steps_per_epoch from the data set's size, so
    # the step schedule's milestones (epochs 30, 60, 80) stay far beyond the target.
    "resnet50": {"image_size": 32, "num_classes": 10, "blocks": (1, 1, 1, 1), "width": 8,
                 "batch_size": 32, "train_examples": 2000},
    # Every layer of the paper at 299 pixels (the auxiliary head needs the 17 x 17 grid), each
    # channel count divided by 16, without the auxiliary head; RMSProp as in the paper.
    "inception_v3": {"num_classes": 10, "width_divisor": 16, "aux_head": False,
                     "batch_size": 16, "train_examples": 2000},
    # The cartpole config as it is: an MLP, 16 synchronous learners.
    "a3c": {},
}

# The config a proxy builds on, per model.
BASE_CONFIG = {"resnet50": "paper", "inception_v3": "paper", "a3c": "cartpole"}

# The target and evaluation interval `tbd train` and the benchmark use when none is given.
DEFAULTS = {
    "resnet50": {"target": "top1=0.65", "eval_every": 20},
    "inception_v3": {"target": "top1=0.65", "eval_every": 20},
    "a3c": {"target": "return=475", "eval_every": 10},
}


def proxy_overrides(model_name):
    """(base config, overrides) of the model's proxy."""
    if model_name not in PROXIES:
        raise TrainingError("{} has no proxy config; proxies exist for {}".format(
            model_name, ", ".join(sorted(PROXIES))))
    return BASE_CONFIG[model_name], dict(PROXIES[model_name])
