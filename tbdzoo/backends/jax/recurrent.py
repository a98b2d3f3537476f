"""The recurrent layers: LSTM and GRU over padded batches with per-example lengths, additive
attention and the sequence BatchNorm, as Flax NNX modules.

A recurrent node is a ``Recurrent`` module holding, per layer and direction, a cell at the
path of its canonical parameters (``l0.fw``: Flax's own ``nnx.LSTMCell``, whose per-gate
``ii``/``hi`` linears are the spec's ``w_i``/``u_i``/``b_i``; ``GRUCell``, the spec's GRU with
the reset gate applied after the recurrent product and its bias ``b_hn``, which Flax's
``nnx.GRUCell`` does not have). The backward direction runs each example's valid steps
reversed within its length, and outputs past an example's length are zero, as the spec
defines.

A layer is one ``jax.lax.scan`` over time for all its directions, and computes what the cells'
``__call__`` computes, arranged for a loop; a GPU runs each step of a scan as its own kernels,
so what a step does is what the loop costs:

- the input side's products of every step are one product before the loop
  (``input_products``);
- each step's recurrent products are one product of the gates' kernels side by side, for
  both directions at once (a batched product over the directions);
- the scan has its own derivative (``_recurrence``): the backward loop computes each step's
  gradient of the recurrent product and passes the carry's gradient back; the kernels'
  gradient is then one product over all steps. The derivative JAX derives itself adds each
  step's outer product into the kernels' gradient inside the loop, a read and a write of every
  recurrent weight at every step. The forward loop keeps of each step only what the cell's
  derivative needs (a GRU's r, z, n and U_n h + b_hn; an LSTM's four gates and c), the carry
  before each step following from the outputs.

Each loop iteration runs ``LOOP.unroll`` steps.
"""
from . import framework  # noqa: F401  (first: JAX imported quietly, full float32 precision)

# isort: split
import collections
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from ..common import attention
from . import ops


class Loop(collections.namedtuple("Loop", "unroll gates_multiple")):
    """How a recurrence's loops are laid out: ``unroll`` time steps per iteration (a GPU pays a
    fixed cost for each iteration of a loop as well as for each kernel), and the gates' side of
    the recurrent kernels padded to a multiple of ``gates_multiple`` in the backward loop
    (``_recurrence_backward``). benchmarks/jax_recurrence.py times the choices."""


LOOP = Loop(unroll=4, gates_multiple=256)


def _same(x):
    return x


def _transposed(x):
    return x.T


def valid(lengths, t):
    """(N, T) True where t < length."""
    return jnp.arange(t)[None, :] < lengths[:, None]


def _side_by_side(linears):
    """The kernels of ``nnx.Linear`` layers that share an input, side by side along the
    outputs, and their biases (zeros for a layer without one)."""
    kernel = jnp.concatenate([linear.kernel[...] for linear in linears], axis=1)
    bias = jnp.concatenate([linear.bias[...] if linear.bias is not None else
                            jnp.zeros((linear.out_features,), kernel.dtype)
                            for linear in linears])
    return kernel, bias


def _product(x, weights, like):
    """``x @ kernel + bias`` as the ``nnx.Linear`` ``like`` computes it (its dtype and
    precision)."""
    kernel, bias = weights
    if like.dtype is not None:
        x, kernel, bias = x.astype(like.dtype), kernel.astype(like.dtype), bias.astype(like.dtype)
    return jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())),
                               precision=like.precision) + bias


def _reverse_within(x, lengths):
    """Each example's first ``length`` steps reversed, the padding where it is."""
    t = x.shape[1]
    steps = jnp.arange(t)[None, :]
    index = jnp.where(steps < lengths[:, None], lengths[:, None] - 1 - steps, steps)
    return jnp.take_along_axis(x, index[:, :, None], axis=1)


class GRUCell(nnx.Module):
    """r = s(W_r x + U_r h + b_r), z = s(W_z x + U_z h + b_z),
    n = tanh(W_n x + b_in + r (U_n h + b_hn)), h' = (1 - z) n + z h: one ``nnx.Linear`` per
    gate and side (the input side's carry the biases b_r, b_z, b_in; ``hn`` carries b_hn)."""

    def __init__(self, in_features, hidden_features, rngs):
        self.ir = nnx.Linear(in_features, hidden_features, rngs=rngs)
        self.iz = nnx.Linear(in_features, hidden_features, rngs=rngs)
        self.in_ = nnx.Linear(in_features, hidden_features, rngs=rngs)
        self.hr = nnx.Linear(hidden_features, hidden_features, use_bias=False, rngs=rngs)
        self.hz = nnx.Linear(hidden_features, hidden_features, use_bias=False, rngs=rngs)
        self.hn = nnx.Linear(hidden_features, hidden_features, rngs=rngs)
        self.hidden_features = hidden_features

    def __call__(self, carry, x):
        return self.recur(carry, self.input_products(x), self.recurrent_weights())

    def input_products(self, x):
        """(..., 3H): W_r x + b_r, W_z x + b_z and W_n x + b_in, side by side."""
        return _product(x, _side_by_side((self.ir, self.iz, self.in_)), like=self.ir)

    def recurrent_weights(self):
        return _side_by_side((self.hr, self.hz, self.hn))

    def recurrent_product_layer(self):
        return self.hr

    def recur(self, carry, products, weights):
        """One step from the step's ``input_products`` and the ``recurrent_weights``."""
        return _GRU.combine(carry, products, _product(carry, weights, like=self.hr))

    def zero_carry(self, n, dtype):
        return jnp.zeros((n, self.hidden_features), dtype)


class LSTMCell(nnx.LSTMCell):
    """Flax's ``nnx.LSTMCell`` (gates i, f, g, o; c' = f c + i g, h' = o tanh(c')); ``recur``
    is its ``__call__`` from the step's ``input_products``."""

    def input_products(self, x):
        """(..., 4H): W_i x, W_f x, W_g x and W_o x side by side (the biases are the recurrent
        side's)."""
        return _product(x, _side_by_side((self.ii, self.if_, self.ig, self.io)), like=self.ii)

    def recurrent_weights(self):
        return _side_by_side((self.hi, self.hf, self.hg, self.ho))

    def recurrent_product_layer(self):
        return self.hi

    def recur(self, carry, products, weights):
        return _LSTM.combine(carry, products, _product(carry[1], weights, like=self.hi))

    def zero_carry(self, n, dtype):
        zeros = jnp.zeros((n, self.hidden_features), dtype)
        return zeros, zeros


class Direction(nnx.Module):
    """The cells of one layer, by direction (``fw``, ``bw``)."""


class Recurrent(nnx.Module):
    """A stack of ``num_layers`` recurrent layers (``l0``, ``l1``, ...), each with a cell per
    direction; the last layer's directions concatenated or summed (``merge``)."""

    def __init__(self, op, d_in, a, rngs):
        cell = LSTMCell if op == "lstm" else GRUCell
        self.layers = a["num_layers"]
        self.directions = ("fw", "bw") if a["bidirectional"] else ("fw",)
        self.merge = a["merge"]
        h = a["units"]
        for layer in range(a["num_layers"]):
            holder = Direction()
            for d in self.directions:
                setattr(holder, d, cell(d_in if layer == 0 else h * len(self.directions), h,
                                        rngs=rngs))
            setattr(self, "l{}".format(layer), holder)

    def __call__(self, x, lengths):
        mask = valid(lengths, x.shape[1])[:, :, None]
        for layer in range(self.layers):
            holder = getattr(self, "l{}".format(layer))
            outs = [y * mask for y in _run([getattr(holder, d) for d in self.directions],
                                            x, lengths)]
            last = layer == self.layers - 1
            x = sum(outs[1:], outs[0]) if last and self.merge == "sum" else \
                jnp.concatenate(outs, axis=-1)
        return x


def _run(cells, x, lengths, loop=LOOP):
    """[(N, T, H)]: each direction's cell over the examples' steps (the second direction's
    reversed within each example's length), in one scan laid out as ``loop``. The steps are
    padded at the end to a multiple of ``loop.unroll``: a scan whose iterations do not divide
    its steps runs the rest in a second loop and copies every stacked output to join the two."""
    steps = x.shape[1]
    x = jnp.pad(x, ((0, 0), (0, -steps % loop.unroll), (0, 0)))
    products = [cell.input_products(x) for cell in cells]
    products[1:] = [_reverse_within(p, lengths) for p in products[1:]]
    weights = [cell.recurrent_weights() for cell in cells]
    kernel = jnp.stack([k for k, _ in weights])                  # (D, H, G)
    bias = jnp.stack([b for _, b in weights])                    # (D, G)
    carry = jax.tree.map(lambda *c: jnp.stack(c),
                         *[cell.zero_carry(x.shape[0], x.dtype) for cell in cells])
    like = cells[0].recurrent_product_layer()
    kind = _LSTM if isinstance(cells[0], LSTMCell) else _GRU
    ys = _recurrence(kind, like.dtype, like.precision, loop,
                     jnp.moveaxis(jnp.stack(products), 2, 0), kernel, bias, carry)
    ys = jnp.moveaxis(ys, 0, 2)[:, :, :steps]                    # (D, N, T, H)
    return [ys[0]] + [_reverse_within(y, lengths) for y in ys[1:]]


def plain_scan(cells, x, lengths):
    """``_run`` as one plain ``jax.lax.scan`` a direction over the cells' ``recur``, which JAX
    differentiates itself: what the loop computes, written the simplest way (the test of its
    derivative and benchmarks/jax_recurrence.py compare against it)."""
    outs = []
    for index, cell in enumerate(cells):
        products = cell.input_products(x)
        if index:
            products = _reverse_within(products, lengths)
        weights = cell.recurrent_weights()

        def step(carry, p, cell=cell, weights=weights):
            return cell.recur(carry, p, weights)
        _, ys = jax.lax.scan(step, cell.zero_carry(x.shape[0], x.dtype),
                             jnp.swapaxes(products, 0, 1))
        ys = jnp.swapaxes(ys, 0, 1)
        outs.append(_reverse_within(ys, lengths) if index else ys)
    return outs


def _shifted(ys, first):
    """(T, ...): ``first``, then ``ys`` but its last step: the value before each step."""
    return jnp.concatenate([first[None].astype(ys.dtype), ys[:-1]])


class _GRU:
    """The GRU step's arithmetic after its products (the carry is h), and its derivative."""

    @staticmethod
    def hidden(carry):
        return carry

    @staticmethod
    def combine(carry, products, recurrent):
        return _GRU.step(carry, products, recurrent)[:2]

    @staticmethod
    def step(carry, products, recurrent):
        """(new carry, output, what the step's derivative needs: r, z, n and U_n h + b_hn)."""
        xr, xz, xn = jnp.split(products, 3, axis=-1)
        hr, hz, hn = jnp.split(recurrent, 3, axis=-1)
        r = jax.nn.sigmoid(xr + hr)
        z = jax.nn.sigmoid(xz + hz)
        n = jnp.tanh(xn + r * hn)
        h = (1.0 - z) * n + z * carry
        return h, h, (r, z, n, hn)

    @staticmethod
    def carries(saved, ys, carry):
        """The carry before each step (T, ...), from the outputs and the initial ``carry``."""
        return _shifted(ys, carry)

    @staticmethod
    def step_backward(saved, carry, dh):
        """(gradient of the carry before the step, of the step's input products, of its
        recurrent products) from ``dh``, the gradient of the step's new carry and output."""
        r, z, n, hn = saved
        dn = dh * (1.0 - z)
        da_n = dn * (1.0 - n * n)
        da_z = dh * (carry - n) * z * (1.0 - z)
        da_r = da_n * hn * r * (1.0 - r)
        return (dh * z, jnp.concatenate([da_r, da_z, da_n], axis=-1),
                jnp.concatenate([da_r, da_z, da_n * r], axis=-1))

    @staticmethod
    def add_to_hidden(dcarry, dh):
        """``dcarry`` with ``dh`` added to its h's gradient."""
        return dcarry + dh.astype(dcarry.dtype)


class _LSTM:
    """The LSTM step's arithmetic after its products (the carry is (c, h)), with
    ``nnx.LSTMCell``'s default gate and activation functions (sigmoid and tanh, the spec's), and
    its derivative."""

    @staticmethod
    def hidden(carry):
        return carry[1]

    @staticmethod
    def combine(carry, products, recurrent):
        return _LSTM.step(carry, products, recurrent)[:2]

    @staticmethod
    def step(carry, products, recurrent):
        """(new carry, output, what the step's derivative needs: the gates and the new c)."""
        c, _ = carry
        i, f, g, o = jnp.split(products + recurrent, 4, axis=-1)
        i, f, g, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)
        c = f * c + i * g
        h = o * jnp.tanh(c)
        return (c, h), h, (i, f, g, o, c)

    @staticmethod
    def carries(saved, ys, carry):
        return _shifted(saved[4], carry[0]), _shifted(ys, carry[1])

    @staticmethod
    def step_backward(saved, carry, dcarry):
        """As ``_GRU.step_backward``; the input and recurrent products' gradients are one."""
        i, f, g, o, c = saved
        dc, dh = dcarry
        tanh_c = jnp.tanh(c)
        dc = dc + dh * o * (1.0 - tanh_c * tanh_c)
        gates = jnp.concatenate([dc * g * i * (1.0 - i), dc * carry[0] * f * (1.0 - f),
                                 dc * i * (1.0 - g * g), dh * tanh_c * o * (1.0 - o)], axis=-1)
        return (dc * f, jnp.zeros_like(dh)), gates, gates

    @staticmethod
    def add_to_hidden(dcarry, dh):
        return dcarry[0], dcarry[1] + dh.astype(dcarry[1].dtype)


def _cast(x, dtype):
    return x if dtype is None else x.astype(dtype)


def _recurrent_product(h, kernel, bias, dtype, precision):
    """(D, N, G): each direction's ``h @ kernel + bias`` in the cells' dtype."""
    return jnp.einsum("dnh,dhg->dng", _cast(h, dtype), kernel, precision=precision) + bias[:, None]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _recurrence(kind, dtype, precision, loop, products, kernel, bias, carry):
    """(T, D, N, H): the outputs of a cell ``kind`` over time, per direction, from its input
    products (T, D, N, G), its recurrent kernels (D, H, G) and biases (D, G) and the initial
    carry (leaves (D, N, H))."""
    return _recurrence_forward(kind, dtype, precision, loop, products, kernel, bias, carry)[0]


def _recurrence_forward(kind, dtype, precision, loop, products, kernel, bias, carry):
    """The outputs, and what the derivative keeps of each step: what the cell's
    ``step_backward`` needs (the gates, and an LSTM's c) and the outputs, from which the carry
    before each step follows."""
    k, b = _cast(kernel, dtype), _cast(bias, dtype)

    def step(carry, p):
        recurrent = _recurrent_product(kind.hidden(carry), k, b, dtype, precision)
        new, y, saved = kind.step(carry, p, recurrent)
        return new, (y, saved)
    _, (ys, saved) = jax.lax.scan(step, carry, products, unroll=loop.unroll)
    return ys, (saved, ys, carry, kernel, bias, products[:0])   # [:0]: their dtype, no bytes


def _recurrence_backward(kind, dtype, precision, loop, residuals, dys):
    saved, ys, carry, kernel, bias, products = residuals
    # The loop's product contracts over the gates (G), a long side against a batch of a few
    # rows; XLA splits such a product along G and pads G to a multiple of its parts. Padded
    # here, outside the loop, the kernel is not copied again at every step (zeros add nothing).
    pad = ((0, 0), (0, 0), (0, -kernel.shape[-1] % loop.gates_multiple))
    k = jnp.pad(_cast(kernel, dtype), pad)
    carries = kind.carries(saved, ys, carry)

    def step(dcarry, xs):
        saved_t, carry_t, dy = xs
        dprevious, dp, drecurrent = kind.step_backward(saved_t, carry_t,
                                                       kind.add_to_hidden(dcarry, dy))
        dh = jnp.einsum("dng,dhg->dnh", jnp.pad(drecurrent, pad).astype(k.dtype), k,
                        precision=precision)
        dprevious = jax.tree.map(lambda d, like: d.astype(like.dtype), dprevious, dcarry)
        return kind.add_to_hidden(dprevious, dh), (dp, drecurrent)
    zeros = jax.tree.map(jnp.zeros_like, carry)
    dcarry, (dproducts, drecurrents) = jax.lax.scan(
        step, zeros, (saved, carries, dys), reverse=True, unroll=loop.unroll)
    hs = _cast(kind.hidden(carries), dtype)
    dkernel = jnp.einsum("tdnh,tdng->dhg", hs, drecurrents.astype(hs.dtype),
                         precision=precision,
                         preferred_element_type=jnp.float32).astype(kernel.dtype)
    dbias = ops.float32(drecurrents).sum(axis=(0, 2)).astype(bias.dtype)
    return dproducts.astype(products.dtype), dkernel, dbias, dcarry


_recurrence.defvjp(_recurrence_forward, _recurrence_backward)


class AdditiveAttention(nnx.Module):
    """e[t, s] = v . tanh(W_q q_t + W_m m_s), -1e9 past the memory's length; c_t = softmax(e) m.
    ``query`` and ``memory`` are bias-free ``nnx.Linear`` layers, ``v`` a parameter."""

    def __init__(self, d_query, d_memory, units, rngs):
        self.query = nnx.Linear(d_query, units, use_bias=False, rngs=rngs)
        self.memory = nnx.Linear(d_memory, units, use_bias=False, rngs=rngs)
        self.v = nnx.Param(jnp.zeros((units,), jnp.float32))

    def __call__(self, query, memory, lengths):
        keys, queries = self.memory(memory), self.query(query)
        scores = jnp.tanh(queries[:, :, None, :] + keys[:, None, :, :]) @ self.v.value
        scores = jnp.where(valid(lengths, memory.shape[1])[:, None, :], scores,
                           attention.MASKED_LOGIT)
        return jax.nn.softmax(scores, axis=-1) @ memory


class SequenceBatchNorm(nnx.BatchNorm):
    """``nnx.BatchNorm`` over the features of (N, T, D) with statistics over the batch's valid
    steps only, and the spec's running update (new-batch weight, variance unbiased over the
    valid steps); padding comes out zero."""

    def __init__(self, num_features, *, momentum, epsilon, tracks=True, rngs):
        super().__init__(num_features, momentum=1.0 - momentum, epsilon=epsilon,
                         use_fast_variance=False, rngs=rngs)
        self.tracks = tracks
        if not tracks:
            del self.mean, self.var

    def __call__(self, x, lengths, use_running_average=None):
        running = self.use_running_average if use_running_average is None else use_running_average
        returned, x = x.dtype, ops.float32(x)    # statistics in float32
        keep = valid(lengths, x.shape[1])[:, :, None].astype(x.dtype)
        if running and self.tracks:
            mean, var = self.mean.value, self.var.value
        else:
            count = ops.replica_sum(keep.sum())     # every replica's valid steps (sync)
            mean = ops.replica_sum((x * keep).sum(axis=(0, 1))) / count
            var = ops.replica_sum((((x - mean) ** 2) * keep).sum(axis=(0, 1))) / count
            if self.tracks and not running:
                m = self.momentum
                self.mean.value = m * self.mean.value + (1.0 - m) * jax.lax.stop_gradient(mean)
                unbiased = var * count / jnp.maximum(count - 1.0, 1.0)
                self.var.value = m * self.var.value + (1.0 - m) * jax.lax.stop_gradient(unbiased)
        y = (x - mean) * (self.scale.value * jax.lax.rsqrt(var + self.epsilon)) + self.bias.value
        return (y * keep).astype(returned)


def canonical_map(op, a):
    """{suffix: (attribute path, to_native, to_canonical)} of a recurrent node's parameters."""
    out = {}
    dirs = ("fw", "bw") if a["bidirectional"] else ("fw",)
    for layer in range(a["num_layers"]):
        for d in dirs:
            prefix = "l{}.{}.".format(layer, d)
            if op == "lstm":
                for g, name in (("i", "i"), ("f", "f"), ("g", "g"), ("o", "o")):
                    flax_in = "if_" if g == "f" else "i" + name
                    out[prefix + "w_" + g] = (prefix + flax_in + ".kernel", _transposed, _transposed)
                    out[prefix + "u_" + g] = (prefix + "h" + name + ".kernel", _transposed,
                                              _transposed)
                    out[prefix + "b_" + g] = (prefix + "h" + name + ".bias", _same, _same)
            else:
                for g, side in (("r", "r"), ("z", "z"), ("n", "n_")):
                    out[prefix + "w_" + g] = (prefix + "i" + side + ".kernel", _transposed,
                                              _transposed)
                    out[prefix + "u_" + g] = (prefix + "h" + g + ".kernel", _transposed,
                                              _transposed)
                out[prefix + "b_r"] = (prefix + "ir.bias", _same, _same)
                out[prefix + "b_z"] = (prefix + "iz.bias", _same, _same)
                out[prefix + "b_in"] = (prefix + "in_.bias", _same, _same)
                out[prefix + "b_hn"] = (prefix + "hn.bias", _same, _same)
    return out
