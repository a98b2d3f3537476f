"""The normalized SGD and Adam of tbdzoo/backends/common/optimizers.py.

Keras' own optimizers differ (decoupled or no weight decay, Keras momentum sign, Adam's
epsilon-hat), so they are not used. The updates run as TensorFlow's fused training kernels
(one kernel per variable), fed the arguments that make each kernel's documented formula equal
ours; coupled weight decay is added to the gradient first. ``apply`` runs inside the compiled
train step; the learning rate is a tensor argument, so a new value never retraces the step.
"""
import tensorflow as tf

from ..common import optimizers as normalized


def _dense(grad):
    """Embedding gradients arrive as IndexedSlices; weight decay needs the full tensor."""
    return tf.convert_to_tensor(grad) if isinstance(grad, tf.IndexedSlices) else grad


def _slots(variables, name):
    return [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                        name="{}_{}".format(name, i)) for i, v in enumerate(variables)]


class SGD(object):
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

    def apply(self, grads, lr):
        for i, (w, g) in enumerate(zip(self.variables, grads)):
            g = normalized.coupled_gradient(_dense(g), w, self.weight_decay)
            if self.momentum:
                tf.raw_ops.ResourceApplyMomentum(
                    var=w.handle, accum=self.buffers[i].handle, lr=lr, grad=g,
                    momentum=tf.constant(self.momentum, g.dtype), use_nesterov=self.nesterov)
            else:
                w.assign_sub(lr * g)


class Adam(object):
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

    def apply(self, grads, lr):
        t = self.t.assign_add(1.0)
        beta1_power, beta2_power = tf.pow(self.beta1, t), tf.pow(self.beta2, t)
        scalars = dict(beta1_power=beta1_power, beta2_power=beta2_power, lr=lr,
                       beta1=tf.constant(self.beta1), beta2=tf.constant(self.beta2),
                       epsilon=normalized.adam_kernel_epsilon(self.eps, beta2_power, tf.sqrt))
        for w, g, m, v in zip(self.variables, grads, self.m, self.v):
            g = normalized.coupled_gradient(_dense(g), w, self.weight_decay)
            tf.raw_ops.ResourceApplyAdam(var=w.handle, m=m.handle, v=v.handle, grad=g, **scalars)


def make(variables, hp):
    return {"sgd": SGD, "adam": Adam}[normalized.check(hp)](variables, hp)
