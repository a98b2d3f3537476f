"""The normalized SGD, Adam and RMSProp (tbdzoo/backends/common/optimizers.py,
docs/optimizers.md) as fused MXNet update operators.

MXNet's own optimizers differ: its SGD keeps ``-lr * buf`` as state (wrong when the learning
rate changes) and its NAG is the Sutskever form; its Adam folds the bias corrections into the
learning rate, which moves eps; its RMSProp has no momentum unless centred. The fused
operators are still used, because unfused NDArray arithmetic is an order of magnitude slower
on the CPU; the arguments below make them compute exactly the normalized formulas:

  sgd_mom_update(w, g, buf, lr=-1, momentum=m, wd)   buf = m buf + (g + wd w)   (its weight
                                                     output, w + buf, goes to g's storage)
  sgd_update(w, buf, lr, wd=0)                       w = w - lr buf
  sgd_update(y, x, lr=-b, wd=(a - 1) / b)            y = a y + b x   (see axpby)
  adam_update(..., lr * sqrt(c2) / c1, eps * sqrt(c2))   with c_i = 1 - beta_i^t, equals
                                                     w -= lr (m / c1) / (sqrt(v / c2) + eps)
                                                     (``adam_kernel_arguments``)
  RMSProp                                            see :class:`RMSProp`

Global-norm clipping enters every update as the operators' ``rescale_grad`` (a factor read
back once per step, :func:`gradient_scale`); nothing else waits for the device. Each large
array gets its own operator call: MXNet's multi-array updates visit every array at every
index up to the largest one's size, and over Inception-v3's weights they took three times as
long as one call per array. Many small arrays go together instead (:class:`AxpbyAll` for the
running statistics, :class:`FlatGroup` for RMSProp), because on two CPU cores queueing
Inception-v3's ~1,500 per-parameter calls took as long as a quarter of their work.
"""
from . import framework  # noqa: F401  (first: numpy.bool for mxnet 1.9.1, quiet import)

# isort: split
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


class AxpbyAll:
    """y_i = a_i y_i + b_i x_i for lists of small arrays, in place, through
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


class SGD:
    """g += wd w;  buf = momentum buf + g;  w -= lr buf  (nesterov: w -= lr (g + momentum buf))."""

    def __init__(self, params, momentum, nesterov, weight_decay):
        self.params = list(params)
        self.momentum, self.nesterov, self.wd = float(momentum), bool(nesterov), float(weight_decay)
        self.buffers = [nd.zeros(p.shape, ctx=p.list_ctx()[0]) for p in self.params] \
            if self.momentum else None

    def step(self, lr, grad_scale=1.0):
        """One update from the gradients, each times ``grad_scale`` (global-norm clipping);
        the gradients' storage is used as scratch."""
        for i, p in enumerate(self.params):
            w, g = p.data(), p.grad()
            if not self.momentum:
                nd.sgd_update(w, g, lr=lr, wd=self.wd, rescale_grad=grad_scale, out=w)
            elif self.nesterov:
                if grad_scale != 1.0:
                    nd._internal._mul_scalar(g, scalar=grad_scale, out=g)
                self._nesterov(w, g, self.buffers[i], lr)
            else:
                nd.sgd_mom_update(w, g, self.buffers[i], lr=-1.0, momentum=self.momentum,
                                  wd=self.wd, rescale_grad=grad_scale, out=g)
                nd.sgd_update(w, self.buffers[i], lr=lr, wd=0.0, out=w)

    def _nesterov(self, w, g, buf, lr):
        m = self.momentum
        axpby(g, w, 1.0, self.wd)      # g = g + wd w
        axpby(buf, g, m, 1.0)          # buf = m buf + g
        axpby(g, buf, 1.0, m)          # g = g + m buf
        axpby(w, g, 1.0, -lr)          # w = w - lr g


class Adam:
    """g += wd w;  m, v moving averages;  w -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps),
    t counting this optimizer's steps."""

    def __init__(self, params, beta1, beta2, eps, weight_decay):
        self.params = list(params)
        self.beta1, self.beta2, self.eps, self.wd = float(beta1), float(beta2), float(eps), \
            float(weight_decay)
        self.means = [nd.zeros(p.shape, ctx=p.list_ctx()[0]) for p in self.params]
        self.variances = [nd.zeros(p.shape, ctx=p.list_ctx()[0]) for p in self.params]
        self.t = 0  # steps this optimizer took, for the bias corrections

    def step(self, lr, grad_scale=1.0):
        self.t += 1
        lr_t, eps_t = normalized.adam_kernel_arguments(lr, self.beta1, self.beta2, self.eps, self.t)
        kw = dict(lr=lr_t, beta1=self.beta1, beta2=self.beta2, epsilon=eps_t, wd=self.wd,
                  rescale_grad=grad_scale)
        for p, m, v in zip(self.params, self.means, self.variances):
            w = p.data()
            nd.adam_update(w, p.grad(), m, v, out=w, **kw)


def make(params, hp):
    """The optimizer ``hp`` names, over the trainable Gluon Parameters ``params``."""
    cls = {"sgd": SGD, "adam": Adam}[normalized.check(hp)]
    return cls(params, **normalized.hyperparameters(hp))


class FlatGroup:
    """Several 1-D parameters (batch-norm scales and shifts, biases) updated as one array:
    gathered before the update and scattered back after, three operator calls in all, where
    one update call per array would cost Inception-v3's 190 such arrays more in queueing than
    in work. The weights of more dimensions stay separate: they hold nearly all the values,
    and gathering them would cost passes."""

    def __init__(self, params):
        self.params = list(params)
        sizes = [p.shape[0] for p in self.params]
        self.indices = tuple(int(i) for i in np.cumsum([0] + sizes[:-1]))
        ctx = self.params[0].list_ctx()[0]
        self.weight, self.grad = nd.zeros((sum(sizes),), ctx=ctx), nd.zeros((sum(sizes),), ctx=ctx)
        self.shape = self.weight.shape

    def gather(self):
        """(weights, gradients) as two flat arrays, copied from the parameters."""
        nd.concat(*[p.data() for p in self.params], dim=0, out=self.weight)
        nd.concat(*[p.grad() for p in self.params], dim=0, out=self.grad)
        return self.weight, self.grad

    def scatter(self):
        """The updated flat weights back into the parameters."""
        nd._internal._split_v2(self.weight, indices=self.indices, axis=0,
                               out=[p.data() for p in self.params])


class RMSProp:
    """g = grad_scale g + wd w;  v = alpha v + (1 - alpha) g^2;  d = v (centred: v - a^2, a the
    moving mean of g);  b = momentum b + lr g / sqrt(d + eps);  w -= b  (docs/optimizers.md).

    MXNet's fused operators give the whole step in at most two passes per array, every one
    reading ``grad_scale * g + wd * w`` (its ``rescale_grad`` and ``wd``) as the gradient:

    - no momentum, not centred: ``rmsprop_update`` (eps inside the root), one pass;
    - centred: ``rmspropalex_update``, whose ``delta`` is -b (the learning rate inside the
      momentum buffer), one pass;
    - momentum, not centred (MXNet has no such operator): ``rmsprop_update`` with learning
      rate ``L = 2^64`` writes ``c = w - L s``, s = g / sqrt(v + eps), into the gradient's
      storage; then ``sgd_mom_update(w, c, -b, lr=1, momentum, wd=lr/L, rescale_grad=-lr/L)``
      computes ``-b <- momentum (-b) - (lr/L) w + (lr/L) c = -(momentum b + lr s)`` and
      ``w + (-b)``. ``L`` is a power of two, so ``L s`` is exact, and large: ``c`` rounds
      to float32 relative to ``L s`` (bounded, as |s| <= 1/sqrt(1 - alpha)), not to ``w``.

    The 1-D parameters go through one :class:`FlatGroup`; state arrays start at zero."""

    SCALE = 2.0 ** 64

    def __init__(self, params, alpha, eps, momentum, centered, weight_decay):
        self.params = list(params)
        self.alpha, self.eps, self.momentum = float(alpha), float(eps), float(momentum)
        self.centered, self.wd = bool(centered), float(weight_decay)
        flat = [p for p in self.params if len(p.shape) == 1]
        self.flat = FlatGroup(flat) if len(flat) > 1 else None
        self.units = [p for p in self.params if self.flat is None or len(p.shape) != 1]
        shapes = [p.shape for p in self.units] + ([self.flat.shape] if self.flat else [])
        ctx = self.params[0].list_ctx()[0] if self.params else None

        def zeros():
            return [nd.zeros(s, ctx=ctx) for s in shapes]
        # the buffer even without momentum: every backend keeps the documented slots
        # (tbdzoo/profiling/memory.py counts them)
        self.squares, self.buffers = zeros(), zeros()
        self.averages = zeros() if self.centered else None

    def step(self, lr, grad_scale=1.0):
        """One update from the gradients, each times ``grad_scale`` (global-norm clipping);
        the gradients' storage is used as scratch."""
        arrays = [(p.data(), p.grad()) for p in self.units]
        if self.flat is not None:
            arrays.append(self.flat.gather())
        kw = dict(gamma1=self.alpha, epsilon=self.eps, wd=self.wd, rescale_grad=grad_scale)
        for i, (w, g) in enumerate(arrays):
            v = self.squares[i]
            if self.centered:
                nd.rmspropalex_update(w, g, v, self.averages[i], self.buffers[i], lr=lr,
                                      gamma2=self.momentum, out=w, **kw)
            elif not self.momentum:
                nd.rmsprop_update(w, g, v, lr=lr, out=w, **kw)
            else:
                nd.rmsprop_update(w, g, v, lr=self.SCALE, out=g, **kw)
                nd.sgd_mom_update(w, g, self.buffers[i], lr=1.0, momentum=self.momentum,
                                  wd=lr / self.SCALE, rescale_grad=-lr / self.SCALE, out=w)
        if self.flat is not None:
            self.flat.scatter()


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


def sum_of_squares(arrays):
    """The sum of the squares of every element of ``arrays``, an NDArray of one element: one
    ``dot`` per array. ``multi_sum_sq`` is slower on the CPU (it visits every array up to the
    largest one's size: 38 ms against 9 ms over Seq2Seq's 26 M gradients) and less exact (one
    float32 running sum: 1.2e-4 relative off float64 over ResNet-50's, against 2e-6)."""
    return nd.add_n(*[nd.dot(a.reshape(-1), a.reshape(-1)) for a in arrays])


def gradient_scale(params, clip, squares=None):
    """The factor a group's gradients are to be multiplied by before the update (1.0 unless
    clipping by global norm: min(1, c / (n + 1e-6)), n the norm of them all); value
    clipping is applied in place here. The norm is read back, one wait per step as in
    Gluon's ``clip_global_norm``, so that the factor enters the fused update as its
    ``rescale_grad`` instead of costing a pass over the gradients; ``squares``, the
    gradients' sum of squares where the step guard has read it already."""
    if clip is None:
        return 1.0
    grads = [p.grad() for p in params]
    c = float(clip["value"])
    if clip["kind"] == "value":
        for g in grads:
            nd.clip(g, -c, c, out=g)
        return 1.0
    if squares is None:
        squares = float(sum_of_squares(grads).asscalar())
    norm = squares ** 0.5
    return min(1.0, c / (norm + 1e-6))


def clip_gradients(params, clip):
    """A group's gradients clipped in place (by global norm or element-wise into [-c, c])."""
    scale = gradient_scale(params, clip)
    if scale != 1.0:
        for p in params:
            g = p.grad()
            nd._internal._mul_scalar(g, scalar=scale, out=g)


def clip_weights(params, value):
    """The original WGAN's hook: every weight of the group into [-value, value]."""
    for p in params:
        w = p.data()
        nd.clip(w, -value, value, out=w)


def state_arrays(optimizer):
    """The arrays an optimizer keeps between steps (for the memory breakdown)."""
    return [a for name in ("buffers", "means", "variances", "squares", "averages")
            for a in getattr(optimizer, name, None) or []]
