"""The normalized optimizers (tbdzoo/backends/base.py). PyTorch's SGD and Adam with coupled
weight decay are exactly those formulas, so the native ones are used."""
import torch


def make(params, hp, fused=False):
    """``fused``: one kernel for the whole update on a GPU (same formula, fewer launches)."""
    kw = {"fused": True} if fused else {}
    if hp["optimizer"] == "sgd":
        return torch.optim.SGD(params, lr=hp["lr"], momentum=hp["momentum"],
                               nesterov=hp["nesterov"], weight_decay=hp["weight_decay"], **kw)
    if hp["optimizer"] == "adam":
        return torch.optim.Adam(params, lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]),
                                eps=hp["eps"], weight_decay=hp["weight_decay"], **kw)
    raise ValueError("optimizer {!r} is not implemented for torch".format(hp["optimizer"]))


def set_learning_rate(optimizer, lr):
    for group in optimizer.param_groups:
        group["lr"] = lr
