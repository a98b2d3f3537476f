"""The normalized SGD and Adam of tbdzoo/backends/common/optimizers.py as CNTK ``universal``
learners.

CNTK's built-in momentum_sgd and adam use unit-gain momentum and per-sample learning-rate
conventions, so the update is written here with ``C.assign`` and runs inside the trainer's
native step. The universal learner receives the raw gradient of the loss, and the loss is
already the minibatch mean, so no rescaling is needed. Scalars that change every step (the
learning rate, Adam's bias corrections) live in constants the model sets before each step.
Valid Python 3.6.
"""
import math

import cntk as C
import numpy as np

from ..common import optimizers as normalized


def _scalar(value):
    return C.constant(float(value), shape=(), dtype=np.float32)


def _set(constant, value):
    constant.value = np.array(value, np.float32)


class _Optimizer(object):
    """Owns the per-parameter state and builds the learner; ``prepare(lr)`` before each step."""

    def __init__(self, params, hp):
        self.params = list(params)
        self.hp = normalized.hyperparameters(hp)
        self.weight_decay = self.hp["weight_decay"]
        self.steps = 0
        self._lr = _scalar(hp.get("lr", 0.0))
        # C.universal inspects the function's arity, so a bound method (with self) is refused.
        self.learner = C.universal(lambda params, grads: self._updates(params, grads), self.params)

    def _state(self, param):
        return C.constant(np.zeros(param.shape, np.float32), shape=param.shape)

    def _gradient(self, param, grad):
        """Coupled weight decay: the decay term joins the gradient."""
        return normalized.coupled_gradient(grad, param, self.weight_decay)

    def _updates(self, params, grads):
        ops = []
        for param, grad in zip(params, grads):
            ops.extend(self._update(param, self._gradient(param, grad)))
        return C.combine(ops)

    def prepare(self, lr):
        """Load this step's scalars; call once before each optimizer step."""
        self.steps += 1
        _set(self._lr, lr)


class SGD(_Optimizer):
    """buf = momentum * buf + g;  w -= lr * buf  (nesterov: w -= lr * (g + momentum * buf))."""

    def _update(self, param, grad):
        momentum = self.hp["momentum"]
        if not momentum:
            return [C.assign(param, param - self._lr * grad)]
        buf = self._state(param)
        new_buf = momentum * buf + grad
        step = grad + momentum * new_buf if self.hp["nesterov"] else new_buf
        return [C.assign(buf, new_buf), C.assign(param, param - self._lr * step)]


class Adam(_Optimizer):
    """m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
    w -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps), as PyTorch evaluates it."""

    def __init__(self, params, hp):
        self._step_size = _scalar(0.0)
        self._bc2_sqrt = _scalar(1.0)
        super(Adam, self).__init__(params, hp)

    def _update(self, param, grad):
        b1, b2, eps = self.hp["beta1"], self.hp["beta2"], self.hp["eps"]
        m, v = self._state(param), self._state(param)
        new_m = b1 * m + (1.0 - b1) * grad
        new_v = b2 * v + (1.0 - b2) * C.square(grad)
        denom = C.sqrt(new_v) / self._bc2_sqrt + eps
        return [C.assign(m, new_m), C.assign(v, new_v),
                C.assign(param, param - self._step_size * new_m / denom)]

    def prepare(self, lr):
        super(Adam, self).prepare(lr)
        c1, c2 = normalized.adam_bias_corrections(self.hp["beta1"], self.hp["beta2"], self.steps)
        _set(self._step_size, lr / c1)
        _set(self._bc2_sqrt, math.sqrt(c2))


def make(params, hp):
    return {"sgd": SGD, "adam": Adam}[normalized.check(hp)](params, hp)
