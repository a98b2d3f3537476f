"""The optimizers of docs/optimizers.md (SGD, Adam, RMSProp, gradient clipping) as CNTK
``universal`` learners.

CNTK's built-in momentum_sgd, adam and rmsprop use unit-gain momentum, per-sample learning-rate
conventions and their own epsilon placement, so each update is written here with ``C.assign``
and runs inside the trainer's native step. The universal learner receives the raw gradient of
the loss, and every loss is already the minibatch mean, so no rescaling is needed. Scalars that
change every step (the learning rate, Adam's bias corrections) live in constants the model sets
before each step. An optimizer owns its state once; a training program whose phases update one
group from several objectives asks it for one learner per phase, all sharing that state.
Valid Python 3.6.
"""
from . import framework  # noqa: F401  (first: CNTK imported quietly)

# isort: split
import math

import cntk as C
import numpy as np

from ..common import optimizers as normalized

CLIP_EPSILON = 1e-6   # global-norm clipping's guard (docs/optimizers.md)


def _scalar(value):
    return C.constant(float(value), shape=(), dtype=np.float32)


def _set(constant, value):
    constant.value = np.array(value, np.float32)


def clipped(grads, clip):
    """The group's gradients after global-norm or element-wise clipping (None: unchanged).

    The global norm is one reduction over the spliced, flattened gradients: a sum of one
    reduction per parameter made Inception-v3's step several times slower."""
    if clip is None:
        return list(grads)
    value = float(clip["value"])
    if clip["kind"] == "value":
        return [C.clip(g, -value, value) for g in grads]
    flat = [C.reshape(g, (-1,)) for g in grads]
    total = C.reduce_sum(C.square(C.splice(*flat, axis=0) if len(flat) > 1 else flat[0]),
                         axis=C.Axis.all_axes())
    factor = C.element_min(_scalar(1.0), value / (C.sqrt(total) + CLIP_EPSILON))
    return [g * factor for g in grads]


def finite_flag(grads):
    """1 where the global norm of ``grads`` is finite, else 0 (x - x is NaN for NaN and inf)."""
    flat = [C.reshape(g, (-1,)) for g in grads]
    total = C.reduce_sum(C.square(C.splice(*flat, axis=0) if len(flat) > 1 else flat[0]),
                         axis=C.Axis.all_axes())
    return C.equal(C.reshape(total - total, ()), 0.0)


def one_output(assigns):
    """The assignments as one function of a single output, which evaluates every one of them.

    CNTK's forward merges the evaluation orders of all the outputs it is asked for, each
    output's whole history, and sorts the result: with one output per assignment, and every
    assignment reading the global norm (so every gradient), a step cost time quadratic in
    the number of parameters (most of a proxy Inception-v3 step). One element of each
    assignment (a view), spliced into one vector, keeps that order linear."""
    firsts = [C.slice(C.reshape(a, (-1,)), 0, 0, 1) for a in assigns]
    return C.splice(*firsts, axis=0) if len(firsts) > 1 else firsts[0]


class _Optimizer:
    """Owns the per-parameter state and builds learners; ``prepare(lr)`` before each step."""

    def __init__(self, params, hp, clip=None):
        self.params = list(params)
        self.hp = hp
        self.clip = clip
        self.weight_decay = float(hp.get("weight_decay", 0.0))
        self.steps = 0
        self._lr = _scalar(hp.get("lr", 0.0))
        self._states = {}
        # 1 after a step whose gradients' global norm was finite, else 0 (docs/backends.md)
        self.finite = _scalar(1.0)
        self.learner = self.new_learner()

    def new_learner(self):
        """A learner over this optimizer's parameters and state. C.universal inspects the
        function's arity, so a bound method (with self) is refused."""
        return C.universal(lambda params, grads: self._updates(params, grads), self.params)

    def _state(self, param, slot):
        key = (param.uid, slot)
        if key not in self._states:
            self._states[key] = C.constant(np.zeros(param.shape, np.float32), shape=param.shape)
        return self._states[key]

    def _gradient(self, param, grad):
        """Coupled weight decay: the decay term joins the (clipped) gradient."""
        return normalized.coupled_gradient(grad, param, self.weight_decay)

    def _updates(self, params, grads):
        ops = [C.assign(self.finite, finite_flag(grads))]
        for param, grad in zip(params, clipped(grads, self.clip)):
            ops.extend(self._update(param, self._gradient(param, grad)))
        return one_output(ops)

    def state(self):
        """Every constant this optimizer keeps between steps (its slots)."""
        return list(self._states.values())

    def prepare(self, lr):
        """Load this step's scalars; call once before each optimizer step."""
        self.steps += 1
        _set(self._lr, lr)


class SGD(_Optimizer):
    """buf = momentum * buf + g;  w -= lr * buf  (nesterov: w -= lr * (g + momentum * buf))."""

    def _update(self, param, grad):
        momentum = float(self.hp["momentum"])
        if not momentum:
            return [C.assign(param, param - self._lr * grad)]
        buf = self._state(param, "momentum")
        new_buf = momentum * buf + grad
        step = grad + momentum * new_buf if self.hp["nesterov"] else new_buf
        return [C.assign(buf, new_buf), C.assign(param, param - self._lr * step)]


class Adam(_Optimizer):
    """m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
    w -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps), as PyTorch evaluates it."""

    def __init__(self, params, hp, clip=None):
        self._step_size = _scalar(0.0)
        self._bc2_sqrt = _scalar(1.0)
        super().__init__(params, hp, clip)

    def _update(self, param, grad):
        b1, b2, eps = float(self.hp["beta1"]), float(self.hp["beta2"]), float(self.hp["eps"])
        m, v = self._state(param, "m"), self._state(param, "v")
        new_m = b1 * m + (1.0 - b1) * grad
        new_v = b2 * v + (1.0 - b2) * C.square(grad)
        denom = C.sqrt(new_v) / self._bc2_sqrt + eps
        return [C.assign(m, new_m), C.assign(v, new_v),
                C.assign(param, param - self._step_size * new_m / denom)]

    def prepare(self, lr):
        super().prepare(lr)
        c1, c2 = normalized.adam_bias_corrections(float(self.hp["beta1"]),
                                                  float(self.hp["beta2"]), self.steps)
        _set(self._step_size, lr / c1)
        _set(self._bc2_sqrt, math.sqrt(c2))


class RMSProp(_Optimizer):
    """v = alpha v + (1 - alpha) g^2 (centred: a = alpha a + (1 - alpha) g, d = v - a^2, else
    d = v);  b = momentum b + lr g / sqrt(d + eps);  w -= b: epsilon inside the root and the
    learning rate inside the momentum buffer (docs/optimizers.md)."""

    def _update(self, param, grad):
        alpha, eps = float(self.hp["alpha"]), float(self.hp["eps"])
        momentum = float(self.hp["momentum"])
        v = self._state(param, "square_avg")
        new_v = alpha * v + (1.0 - alpha) * C.square(grad)
        ops = [C.assign(v, new_v)]
        denom = new_v
        if self.hp["centered"]:
            a = self._state(param, "grad_avg")
            new_a = alpha * a + (1.0 - alpha) * grad
            ops.append(C.assign(a, new_a))
            denom = new_v - C.square(new_a)
        step = self._lr * grad / C.sqrt(denom + eps)
        if momentum:
            b = self._state(param, "momentum")
            step = momentum * b + step
            ops.append(C.assign(b, step))
        ops.append(C.assign(param, param - step))
        return ops


def make(params, hp):
    """The optimizer of a model with one loss, from its flat hyperparameters."""
    name = normalized.check(hp)
    settings = dict(normalized.hyperparameters(hp), lr=hp.get("lr", 0.0))
    return {"sgd": SGD, "adam": Adam}[name](params, settings)


def make_group(params, optimizer, clip=None):
    """The optimizer of a program's parameter group: its optimizer entry and its clipping."""
    kinds = {"sgd": SGD, "adam": Adam, "rmsprop": RMSProp}
    hp = dict(optimizer)
    hp.setdefault("nesterov", False)
    return kinds[hp.pop("kind")](params, hp, clip)
