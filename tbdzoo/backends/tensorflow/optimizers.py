"""The normalized SGD and Adam of tbdzoo/backends/common/optimizers.py, and RMSProp, gradient
clipping and weight clipping as docs/optimizers.md defines them (training programs).

Keras' own optimizers differ (decoupled or no weight decay, Keras momentum sign, Adam's
epsilon-hat), so they are not used. The updates run as TensorFlow's fused training kernels
(one kernel per variable), fed the arguments that make each kernel's documented formula equal
ours; coupled weight decay is added to the gradient first. ``apply`` runs inside the compiled
train step; the learning rate is a tensor argument, so a new value never retraces the step.
"""
from . import framework  # noqa: F401  (first: TensorFlow imported as the backend needs it)

# isort: split
import tensorflow as tf

from ..common import optimizers as normalized


def dense(grad):
    """Embedding gradients arrive as IndexedSlices; weight decay needs the full tensor."""
    return tf.convert_to_tensor(grad) if isinstance(grad, tf.IndexedSlices) else grad


def _slots(variables, name):
    return [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                        name="{}_{}".format(name, i)) for i, v in enumerate(variables)]


class SGD:
    """g += wd * w;  buf = momentum * buf + g;  w -= lr * buf  (nesterov: g + momentum * buf).

    The momentum update is TensorFlow's fused ApplyMomentum kernel, whose definition is exactly
    this one (accum = accum * momentum + grad; var -= lr * accum, or lr * (grad + momentum *
    accum) with use_nesterov): one kernel per variable instead of five ops.
    """

    def __init__(self, variables, hp):
        self.variables = list(variables)
        hp = normalized.hyperparameters(hp)
        self.momentum, self.nesterov = hp["momentum"], hp["nesterov"]
        self.weight_decay = hp["weight_decay"]
        self.buffers = _slots(self.variables, "momentum") if self.momentum else []

    def slots(self):
        return list(self.buffers)

    def apply(self, grads, lr):
        for i, (w, g) in enumerate(zip(self.variables, grads)):
            g = normalized.coupled_gradient(dense(g), w, self.weight_decay)
            if self.momentum:
                tf.raw_ops.ResourceApplyMomentum(
                    var=w.handle, accum=self.buffers[i].handle, lr=lr, grad=g,
                    momentum=tf.constant(self.momentum, g.dtype), use_nesterov=self.nesterov)
            else:
                w.assign_sub(lr * g)


class Adam:
    """g += wd * w;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
    w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps), t = steps this optimizer took.

    Run as TensorFlow's fused ApplyAdam kernel, which computes
    w -= lr sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps'): with eps' = eps sqrt(1 - b2^t)
    (``adam_kernel_epsilon``) that is the formula above exactly; Keras' Adam instead uses the
    plain eps there.
    """

    def __init__(self, variables, hp):
        self.variables = list(variables)
        hp = normalized.hyperparameters(hp)
        self.beta1, self.beta2, self.eps = hp["beta1"], hp["beta2"], hp["eps"]
        self.weight_decay = hp["weight_decay"]
        self.m = _slots(self.variables, "adam_m")
        self.v = _slots(self.variables, "adam_v")
        self.t = tf.Variable(0.0, trainable=False, name="adam_t")

    def slots(self):
        return self.m + self.v

    def apply(self, grads, lr):
        t = self.t.assign_add(1.0)
        beta1_power, beta2_power = tf.pow(self.beta1, t), tf.pow(self.beta2, t)
        scalars = dict(beta1_power=beta1_power, beta2_power=beta2_power, lr=lr,
                       beta1=tf.constant(self.beta1), beta2=tf.constant(self.beta2),
                       epsilon=normalized.adam_kernel_epsilon(self.eps, beta2_power, tf.sqrt))
        for w, g, m, v in zip(self.variables, grads, self.m, self.v):
            g = normalized.coupled_gradient(dense(g), w, self.weight_decay)
            tf.raw_ops.ResourceApplyAdam(var=w.handle, m=m.handle, v=v.handle, grad=g, **scalars)


class RMSProp:
    """v = alpha v + (1 - alpha) g^2;  centred: a = alpha a + (1 - alpha) g, d = v - a^2, else
    d = v;  b = momentum b + lr g / sqrt(d + eps);  w -= b  (g after coupled weight decay).

    Epsilon inside the root and the learning rate inside the momentum buffer are TensorFlow's
    own definition, so the fused ApplyRMSProp and ApplyCenteredRMSProp kernels compute exactly
    this (ms = rho ms + (1 - rho) g^2; mom = momentum mom + lr g / sqrt(ms [- mg^2] + eps);
    var -= mom), with every slot starting at zero.
    """

    def __init__(self, variables, spec, square=None):
        """``square``: square averages to share with another RMSProp over the same variables
        (A3C's shared statistics, its learners' threads stepping one each); else its own."""
        self.variables = list(variables)
        self.alpha, self.eps = float(spec["alpha"]), float(spec["eps"])
        self.momentum, self.centered = float(spec["momentum"]), bool(spec["centered"])
        self.weight_decay = float(spec["weight_decay"])
        self.square = list(square) if square is not None else _slots(self.variables, "rms")
        self.buffers = _slots(self.variables, "momentum")
        self.average = _slots(self.variables, "mean_grad") if self.centered else []

    def slots(self):
        return self.square + self.buffers + self.average

    def apply(self, grads, lr):
        scalars = dict(lr=lr, rho=tf.constant(self.alpha), momentum=tf.constant(self.momentum),
                       epsilon=tf.constant(self.eps))
        for i, (w, g) in enumerate(zip(self.variables, grads)):
            g = normalized.coupled_gradient(dense(g), w, self.weight_decay)
            if self.centered:
                tf.raw_ops.ResourceApplyCenteredRMSProp(
                    var=w.handle, mg=self.average[i].handle, ms=self.square[i].handle,
                    mom=self.buffers[i].handle, grad=g, **scalars)
            else:
                tf.raw_ops.ResourceApplyRMSProp(var=w.handle, ms=self.square[i].handle,
                                                mom=self.buffers[i].handle, grad=g, **scalars)


def state_variables(optimizer):
    """Every variable ``optimizer`` keeps between steps: its slots and Adam's step counter."""
    return optimizer.slots() + ([optimizer.t] if isinstance(optimizer, Adam) else [])


def make(variables, hp):
    return {"sgd": SGD, "adam": Adam}[normalized.check(hp)](variables, hp)


def make_group(variables, spec):
    """The optimizer of a training program's parameter group (its ``optimizer`` entry)."""
    kind = spec["kind"]
    if kind == "rmsprop":
        return RMSProp(variables, spec)
    hp = dict(spec, optimizer=kind)
    hp.setdefault("nesterov", False)
    return make(variables, hp)


# PyTorch's clip_grad_norm_ adds this to the norm, so a zero gradient stays finite.
NORM_EPSILON = 1e-6


def clip_gradients(grads, clip):
    """A group's gradients clipped by global norm (each times min(1, c / (norm + 1e-6))) or
    element-wise to [-c, c], before weight decay (docs/optimizers.md)."""
    if clip is None:
        return grads
    c = float(clip["value"])
    if clip["kind"] == "global_norm":
        norm = tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(g)) for g in grads]))
        factor = tf.minimum(1.0, c / (norm + NORM_EPSILON))
        return [g * factor for g in grads]
    return [tf.clip_by_value(g, -c, c) for g in grads]


def clip_weights(variables, value):
    """The original WGAN's hook: every weight of the group into [-value, value]."""
    for w in variables:
        w.assign(tf.clip_by_value(w, -value, value))
