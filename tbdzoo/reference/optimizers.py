"""Every optimizer, gradient clipping and weight hook of docs/optimizers.md in float64 NumPy:
what the backends' updates are held to (tests and ``tbd consistency``).

Written out plainly from the formulas, apart from the argument transforms the backends use
(tbdzoo/backends/common/optimizers.py), so a mistake in one of those cannot hide in both; the
hyperparameters each optimizer reads are named there, once.
"""
from collections import OrderedDict

import numpy as np

from ..backends.common.optimizers import check
from ..spec.optimizers import OPTIMIZERS, optimizer_hyperparameters

_BOOLEAN = ("nesterov", "centered")


class Optimizer:
    """One optimizer's state for one array. ``hparams``: a model's flat hyperparameters (the
    name under ``optimizer``) or a program group's optimizer entry (the name under ``kind``)."""

    def __init__(self, hparams):
        name = hparams["kind"] if "kind" in hparams else hparams["optimizer"]
        if name not in OPTIMIZERS:
            check(dict(hparams, optimizer=name))   # the error names the optimizers there are
        self.name = name
        self.hp = optimizer_hyperparameters(name, hparams)
        self.t = 0
        self.state = {}

    def step(self, weight, grad, lr):
        """The weight after one step with gradient ``grad`` and learning rate ``lr``."""
        hp, self.t = self.hp, self.t + 1
        w = np.asarray(weight, np.float64)
        g = np.asarray(grad, np.float64) + hp["weight_decay"] * w
        if self.name == "sgd":
            if not hp["momentum"]:
                return w - lr * g
            buf = hp["momentum"] * self.state.get("buf", 0.0) + g
            self.state["buf"] = buf
            return w - lr * (g + hp["momentum"] * buf if hp["nesterov"] else buf)
        if self.name == "rmsprop":
            return w - self._rmsprop_buffer(g, lr)
        b1, b2 = hp["beta1"], hp["beta2"]
        m = b1 * self.state.get("m", 0.0) + (1.0 - b1) * g
        v = b2 * self.state.get("v", 0.0) + (1.0 - b2) * g * g
        self.state["m"], self.state["v"] = m, v
        m_hat, v_hat = m / (1.0 - b1 ** self.t), v / (1.0 - b2 ** self.t)
        return w - lr * m_hat / (np.sqrt(v_hat) + hp["eps"])

    def _rmsprop_buffer(self, g, lr):
        """RMSProp's momentum buffer after this step: epsilon inside the root, the learning rate
        inside the buffer (docs/optimizers.md)."""
        hp, alpha = self.hp, self.hp["alpha"]
        v = alpha * self.state.get("v", 0.0) + (1.0 - alpha) * g * g
        self.state["v"] = v
        if hp["centered"]:
            a = alpha * self.state.get("a", 0.0) + (1.0 - alpha) * g
            self.state["a"] = a
            v = v - a * a
        b = hp["momentum"] * self.state.get("b", 0.0) + lr * g / np.sqrt(v + hp["eps"])
        self.state["b"] = b
        return b


def clip_gradients(grads, spec):
    """A group's gradients after its clipping (docs/optimizers.md), in float64: ``global_norm``
    scales all by min(1, c / (norm + 1e-6)), ``value`` clips each element to [-c, c]."""
    grads = [np.asarray(g, np.float64) for g in grads]
    if spec is None:
        return grads
    if spec["kind"] == "global_norm":
        norm = np.sqrt(sum(float(np.sum(g * g)) for g in grads))
        return [g * min(1.0, spec["value"] / (norm + 1e-6)) for g in grads]
    return [np.clip(g, -spec["value"], spec["value"]) for g in grads]


def clip_weights(weights, value):
    """The original WGAN's hook: every weight into [-value, value]."""
    return [np.clip(np.asarray(w, np.float64), -value, value) for w in weights]


def trajectory(hparams, weight, grads, rates, clip=None):
    """The weights after each step of one optimizer, one gradient and rate a step, each
    gradient clipped by ``clip`` (a group's clipping) first."""
    optimizer, out = Optimizer(hparams), []
    for grad, lr in zip(grads, rates):
        weight = optimizer.step(weight, clip_gradients([grad], clip)[0], lr)
        out.append(weight)
    return out


class Group:
    """One parameter group's update: its optimizer per parameter, its clipping, its schedule
    (``rate(step)``: the learning rate before update ``step``, from 0) and its step count."""

    def __init__(self, names, optimizer, clipping, rate):
        self.names = list(names)
        self.optimizers = OrderedDict((n, Optimizer(optimizer)) for n in self.names)
        self.clipping, self.rate, self.steps = clipping, rate, 0

    def update(self, weights, grads):
        """``weights`` (a dict, updated in place, float64) after one step on ``grads``."""
        lr = self.rate(self.steps)
        clipped = clip_gradients([grads[n] for n in self.names], self.clipping)
        for name, g in zip(self.names, clipped):
            weights[name] = self.optimizers[name].step(weights[name], g, lr)
        self.steps += 1
        return weights
