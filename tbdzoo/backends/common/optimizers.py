"""The normalized optimizers: every backend's SGD and Adam compute exactly these formulas
(PyTorch's, with coupled weight decay), so a few steps on any backend give one trajectory.

  sgd:  g += wd * w;  buf = momentum * buf + g;  w -= lr * buf   (nesterov: g + momentum * buf)
  adam: g += wd * w;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
        w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps),  t = steps this optimizer took
  rmsprop (training programs' groups only): g += wd * w;  v = alpha v + (1 - alpha) g^2;
        centred: a = alpha a + (1 - alpha) g, d = v - a^2, else d = v;
        b = momentum b + lr g / sqrt(d + eps);  w -= b

Frameworks' own optimizers differ (docs/backends.md says how), so backends feed fused update
kernels the arguments below, which make each kernel's documented formula equal these.
"""
import math

import numpy as np

from ...errors import UnsupportedOptionError
from ...spec.optimizers import MODEL_OPTIMIZERS, OPTIMIZERS, optimizer_hyperparameters

# The optimizers and their hyperparameters: tbdzoo/spec/optimizers.py. A model may name
# MODEL_OPTIMIZERS; the others only a training program's parameter groups use (every backend
# implements them in its program code, docs/programs.md); the reference below computes all.
NAMES = MODEL_OPTIMIZERS


def check(hparams):
    """Refuse an optimizer no backend implements, naming the ones that exist."""
    name = hparams["optimizer"]
    if name not in MODEL_OPTIMIZERS:
        raise UnsupportedOptionError("optimizer {!r} is not implemented; set optimizer to one of: "
                                     "{}".format(name, ", ".join(NAMES)))
    return name


def hyperparameters(hparams):
    """The optimizer's own hyperparameters from ``hparams``, as Python floats and bools."""
    return optimizer_hyperparameters(check(hparams), hparams)


def coupled_gradient(grad, weight, weight_decay):
    """g + wd * w, the gradient every formula above starts from (any array type)."""
    return grad + weight_decay * weight if weight_decay else grad


# -- argument transforms for fused Adam kernels --------------------------------------------------
def adam_bias_corrections(beta1, beta2, t):
    """(1 - b1^t, 1 - b2^t) for step ``t`` (counted from 1)."""
    return 1.0 - beta1 ** t, 1.0 - beta2 ** t


def adam_kernel_epsilon(eps, beta2_power, sqrt=math.sqrt):
    """eps' = eps sqrt(1 - b2^t). A kernel computing w -= lr_t m / (sqrt(v) + eps') with
    lr_t = lr sqrt(1 - b2^t) / (1 - b1^t) (TensorFlow's ApplyAdam, MXNet's adam_update with
    the rate below) computes the formula above exactly: multiply its denominator by
    sqrt(1 - b2^t). ``sqrt`` is the framework's when ``beta2_power`` is a tensor."""
    return eps * sqrt(1.0 - beta2_power)


def adam_kernel_arguments(lr, beta1, beta2, eps, t):
    """(lr_t, eps') for a kernel that applies no bias correction itself (see above)."""
    c1, c2 = adam_bias_corrections(beta1, beta2, t)
    return lr * math.sqrt(c2) / c1, adam_kernel_epsilon(eps, beta2 ** t)


# -- the NumPy reference -------------------------------------------------------------------------
class ReferenceOptimizer(object):
    """The formulas above in float64 NumPy, for one array: what tests hold every backend to.
    Written out plainly, apart from the argument transforms the backends use, so a mistake in
    one of those cannot hide in both. ``hparams``: a model's flat hyperparameters (the name
    under ``optimizer``) or a program group's optimizer entry (the name under ``kind``)."""

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


def reference_clip(grads, clip):
    """A group's gradients after its clipping (docs/optimizers.md), in float64: ``global_norm``
    scales all by min(1, c / (norm + 1e-6)), ``value`` clips each element to [-c, c]."""
    grads = [np.asarray(g, np.float64) for g in grads]
    if clip is None:
        return grads
    if clip["kind"] == "global_norm":
        norm = np.sqrt(sum(float(np.sum(g * g)) for g in grads))
        return [g * min(1.0, clip["value"] / (norm + 1e-6)) for g in grads]
    return [np.clip(g, -clip["value"], clip["value"]) for g in grads]


def reference_trajectory(hparams, weight, grads, rates, clip=None):
    """The weights after each step of the reference optimizer, one gradient and rate a step,
    each gradient clipped by ``clip`` first."""
    optimizer, out = ReferenceOptimizer(hparams), []
    for grad, lr in zip(grads, rates):
        weight = optimizer.step(weight, reference_clip([grad], clip)[0], lr)
        out.append(weight)
    return out
