"""The normalized optimizers (tbdzoo/backends/common/optimizers.py). PyTorch's SGD and Adam with
coupled weight decay are exactly those formulas, so the native ones are used."""
import torch

from ..common import optimizers as normalized


def make(params, hp, fused=False):
    """``fused``: one kernel for the whole update on a GPU (same formula, fewer launches)."""
    kw = {"fused": True} if fused else {}
    name, o = normalized.check(hp), normalized.hyperparameters(hp)
    if name == "sgd":
        return torch.optim.SGD(params, lr=hp["lr"], momentum=o["momentum"],
                               nesterov=o["nesterov"], weight_decay=o["weight_decay"], **kw)
    return torch.optim.Adam(params, lr=hp["lr"], betas=(o["beta1"], o["beta2"]),
                            eps=o["eps"], weight_decay=o["weight_decay"], **kw)


def set_learning_rate(optimizer, lr):
    for group in optimizer.param_groups:
        group["lr"] = lr
