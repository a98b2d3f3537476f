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

from ...errors import UnsupportedOptionError
from ...spec.optimizers import MODEL_OPTIMIZERS, optimizer_hyperparameters

# The optimizers and their hyperparameters: tbdzoo/spec/optimizers.py. A model may name
# MODEL_OPTIMIZERS; the others only a training program's parameter groups use (every backend
# implements them in its program code, docs/programs.md); tbdzoo/reference/optimizers.py
# computes all in NumPy.
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
