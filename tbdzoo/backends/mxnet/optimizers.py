"""The normalized SGD and Adam (tbdzoo/backends/common/optimizers.py) as fused MXNet update
operators.

MXNet's own optimizers differ: its SGD keeps ``-lr * buf`` as state (wrong when the learning
rate changes) and its NAG is the Sutskever form; its Adam folds the bias corrections into the
learning rate, which moves eps. The fused operators are still used, because unfused NDArray
arithmetic is an order of magnitude slower on the CPU; the arguments below make them compute
exactly the normalized formulas:

  sgd_mom_update(w, g, buf, lr=-1, momentum=m, wd)   buf = m buf + (g + wd w)   (its weight
                                                     output, w + buf, goes to g's storage)
  sgd_update(w, buf, lr, wd=0)                       w = w - lr buf
  sgd_update(y, x, lr=-b, wd=(a - 1) / b)            y = a y + b x   (see axpby)
  adam_update(..., lr * sqrt(c2) / c1, eps * sqrt(c2))   with c_i = 1 - beta_i^t, equals
                                                     w -= lr (m / c1) / (sqrt(v / c2) + eps)
                                                     (``adam_kernel_arguments``)

Every call is asynchronous; nothing here waits for the device. A stage applied to every
parameter (RMSProp's, the running statistics' update) goes through :class:`AxpbyAll`: one
operator call per 60 arrays instead of one per array, because on two CPU cores queueing
Inception-v3's ~1,500 per-parameter calls took as long as a quarter of their work.
"""
import numpy as np
from mxnet import nd

from ..common import optimizers as normalized


def axpby(y, x, a, b):
    """y = a * y + b * x in place, in one fused pass (``sgd_update`` computes
    (1 - lr wd) y - lr x); NDArray arithmetic would make three passes and two temporaries."""
    if b == 0:
        if a != 1:
            nd.sgd_update(y, x, lr=1.0, wd=1.0 - a, rescale_grad=0.0, out=y)
        return
    nd.sgd_update(y, x, lr=-b, wd=(a - 1.0) / b, out=y)


# preloaded_multi_sgd_update takes at most this many arrays a call (more crash MXNet 1.9).
_MULTI_LIMIT = 60


class AxpbyAll(object):
    """y_i = a_i y_i + b_i x_i for lists of arrays, in place, through
    preloaded_multi_sgd_update: it reads each array's lr and wd from two small device arrays,
    built once here from the fixed coefficients, and rounds as sgd_update does to within the
    last bit. Either every ``b_i`` is 0 (scaling only; ``xs`` unread) or none is."""

    def __init__(self, a, b, count, ctx):
        a = np.broadcast_to(np.asarray(a, np.float64), (count,))
        b = np.broadcast_to(np.asarray(b, np.float64), (count,))
        self.scale_only = bool(np.all(b == 0))
        if not self.scale_only and np.any(b == 0):
            raise ValueError("AxpbyAll: b must be zero for every array or for none")
        if self.scale_only:  # (1 - 1 (1 - a)) y - 0 y
            lrs, wds = np.ones(count), 1.0 - a
        else:                # (1 - (-b)(a - 1) / b) y - (-b) x
            lrs, wds = -b, (a - 1.0) / b
        self.chunks = [(start, nd.array(lrs[start:start + _MULTI_LIMIT], ctx=ctx),
                        nd.array(wds[start:start + _MULTI_LIMIT], ctx=ctx))
                       for start in range(0, count, _MULTI_LIMIT)]

    def __call__(self, ys, xs=None):
        for start, lrs, wds in self.chunks:
            y = ys[start:start + _MULTI_LIMIT]
            x = y if self.scale_only else xs[start:start + _MULTI_LIMIT]
            nd.preloaded_multi_sgd_update(*([v for pair in zip(y, x) for v in pair] + [lrs, wds]),
                                          rescale_grad=0.0 if self.scale_only else 1.0,
                                          num_weights=len(y), out=y)


class SGD(object):
    """g += wd w;  buf = momentum buf + g;  w -= lr buf  (nesterov: w -= lr (g + momentum buf))."""

    def __init__(self, params, momentum, nesterov, weight_decay):
        self.params = list(params)
        self.momentum, self.nesterov, self.wd = float(momentum), bool(nesterov), float(weight_decay)
        self.buffers = [nd.zeros(p.shape, ctx=p.list_ctx()[0]) for p in self.params] \
            if self.momentum else None

    def step(self, lr):
        """One update from the gradients in place; the gradients' storage is used as scratch."""
        for i, p in enumerate(self.params):
            w, g = p.data(), p.grad()
            if not self.momentum:
                nd.sgd_update(w, g, lr=lr, wd=self.wd, out=w)
            elif self.nesterov:
                self._nesterov(w, g, self.buffers[i], lr)
            else:
                nd.sgd_mom_update(w, g, self.buffers[i], lr=-1.0, momentum=self.momentum,
                                  wd=self.wd, out=g)
                nd.sgd_update(w, self.buffers[i], lr=lr, wd=0.0, out=w)

    def _nesterov(self, w, g, buf, lr):
        m = self.momentum
        axpby(g, w, 1.0, self.wd)      # g = g + wd w
        axpby(buf, g, m, 1.0)          # buf = m buf + g
        axpby(g, buf, 1.0, m)          # g = g + m buf
        axpby(w, g, 1.0, -lr)          # w = w - lr g


class Adam(object):
    """g += wd w;  m, v moving averages;  w -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps),
    t counting this optimizer's steps."""

    def __init__(self, params, beta1, beta2, eps, weight_decay):
        self.params = list(params)
        self.beta1, self.beta2, self.eps, self.wd = float(beta1), float(beta2), float(eps), \
            float(weight_decay)
        self.means = [nd.zeros(p.shape, ctx=p.list_ctx()[0]) for p in self.params]
        self.variances = [nd.zeros(p.shape, ctx=p.list_ctx()[0]) for p in self.params]
        self.t = 0  # steps this optimizer took, for the bias corrections

    def step(self, lr):
        self.t += 1
        lr_t, eps_t = normalized.adam_kernel_arguments(lr, self.beta1, self.beta2, self.eps, self.t)
        kw = dict(lr=lr_t, beta1=self.beta1, beta2=self.beta2, epsilon=eps_t, wd=self.wd)
        for p, m, v in zip(self.params, self.means, self.variances):
            w = p.data()
            nd.adam_update(w, p.grad(), m, v, out=w, **kw)


def make(params, hp):
    """The optimizer ``hp`` names, over the trainable Gluon Parameters ``params``."""
    cls = {"sgd": SGD, "adam": Adam}[normalized.check(hp)]
    return cls(params, **normalized.hyperparameters(hp))


class RMSProp(object):
    """g += wd w;  v = alpha v + (1 - alpha) g^2;  d = v (centred: v - a^2, a the moving mean
    of g);  b = momentum b + lr g / sqrt(d + eps);  w -= b  (docs/optimizers.md).

    MXNet's ``rmsprop_update`` is the momentum-free step with eps inside the root, and
    ``rmspropalex_update`` the centred one with the learning rate inside the momentum buffer
    (its ``delta`` is -b). The non-centred step with momentum is ``rmsprop_update`` applied
    to the buffer: b = momentum b, then b - (-lr) g / sqrt(v + eps), then w -= b."""

    def __init__(self, params, alpha, eps, momentum, centered, weight_decay):
        self.params = list(params)
        self.alpha, self.eps, self.momentum = float(alpha), float(eps), float(momentum)
        self.centered, self.wd = bool(centered), float(weight_decay)
        zeros = lambda: [nd.zeros(p.shape, ctx=p.list_ctx()[0]) for p in self.params]  # noqa: E731
        self.squares, self.buffers = zeros(), zeros()
        self.averages = zeros() if self.centered else None
        n, ctx = len(self.params), (self.params[0].list_ctx()[0] if self.params else None)
        self._decay = AxpbyAll(1.0, self.wd, n, ctx) if self.wd and n else None  # g += wd w
        self._damp = AxpbyAll(self.momentum, 0.0, n, ctx) if n else None          # b *= momentum
        self._apply = AxpbyAll(1.0, -1.0, n, ctx) if n else None                  # w -= b

    def step(self, lr):
        if not self.params:
            return
        ws, gs = [p.data() for p in self.params], [p.grad() for p in self.params]
        if self._decay is not None:
            self._decay(gs, ws)
        if self.centered:
            for w, g, v, a, b in zip(ws, gs, self.squares, self.averages, self.buffers):
                nd.rmspropalex_update(w, g, v, a, b, lr=lr, gamma1=self.alpha,
                                      gamma2=self.momentum, epsilon=self.eps, out=w)
            return
        self._damp(self.buffers)
        for g, v, b in zip(gs, self.squares, self.buffers):
            nd.rmsprop_update(b, g, v, lr=-lr, gamma1=self.alpha, epsilon=self.eps, out=b)
        self._apply(ws, self.buffers)


def make_group(params, spec):
    """The optimizer of a training program's parameter group (docs/optimizers.md)."""
    o = dict(spec)
    kind = o.pop("kind")
    o.pop("lr")
    if kind == "rmsprop":
        return RMSProp(params, **o)
    if kind == "adam":
        return Adam(params, **o)
    return SGD(params, **o)


def clip_gradients(params, clip):
    """A group's gradients in place: by global norm, every one times
    min(1, c / (n + 1e-6)) with n the norm of them all, or element-wise into [-c, c]. The
    factor stays on the device, so nothing waits."""
    if clip is None:
        return
    grads = [p.grad() for p in params]
    c = float(clip["value"])
    if clip["kind"] == "value":
        for g in grads:
            nd.clip(g, -c, c, out=g)
        return
    norm = nd.sqrt(nd.sum(nd.multi_sum_sq(*grads, num_arrays=len(grads))))
    factor = nd.clip(c / (norm + 1e-6), 0.0, 1.0)
    for g in grads:
        nd.broadcast_mul(g, factor, out=g)


def clip_weights(params, value):
    """The original WGAN's hook: every weight of the group into [-value, value]."""
    for p in params:
        w = p.data()
        nd.clip(w, -value, value, out=w)


def state_arrays(optimizer):
    """The arrays an optimizer keeps between steps (for the memory breakdown)."""
    return [a for name in ("buffers", "means", "variances", "squares", "averages")
            for a in getattr(optimizer, name, None) or []]
