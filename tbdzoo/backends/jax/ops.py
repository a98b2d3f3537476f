"""The spec's node types in JAX: one function per op, ``fn(inputs, layer, attrs, ctx)``.

``layer`` is the node's Flax NNX module (tbdzoo/backends/jax/layers.py) for a node with
parameters, else None; ``ctx`` (:class:`Context`) says whether the pass trains, hands out the
dropout keys and the canonical values of parameters a node shares with another layer (the
Transformer's output projection reads the embedding table). Values are in the canonical
layouts (images (N, C, H, W)); the ops on images compute channels-last where they can
(``nnx.Conv``, BatchNorm; ReLU, sums, pooling, channel concatenation: ``channels_last``) and
transpose at their own boundary, so the transposes of neighbours cancel and XLA's program keeps
the images channels-last from one op to the next.
"""
from . import framework  # noqa: F401  (first: JAX imported quietly, full float32 precision)

# isort: split
import contextlib
import threading
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ...spec.tables import sinusoid_table
from ..common import attention

_CURRENT = threading.local()


class Context:
    """How a pass runs: ``training`` (batch statistics, dropout), ``key`` (a PRNG key of the
    step, or None: dropout then refuses to train) and, per node, ``shared``: {suffix:
    canonical value} of the parameters it reads from another layer."""

    def __init__(self, training=False, key=None):
        self.training, self.key = training, key
        self.shared, self.node, self.root = {}, None, None

    def rng(self):
        """The dropout key of the node being run: the step's key folded with its name."""
        if self.key is None:
            raise ValueError("node {!r} drops out in training, and this pass was given no "
                             "random key".format(self.node))
        return jax.random.fold_in(self.key, zlib.crc32(self.node.encode("utf-8")))


def opened():
    """The context of the pass being run, or None."""
    return getattr(_CURRENT, "ctx", None)


def current():
    """The context of the pass being run (an inference pass when none was opened)."""
    return opened() or Context()


@contextlib.contextmanager
def statistics_across(axis):
    """BatchNorm's batch statistics summed over the mesh axis ``axis`` while a data-parallel
    update is traced (``--bn-mode sync``): every replica normalises by the global batch's."""
    saved = getattr(_CURRENT, "axis", None)
    _CURRENT.axis = axis
    try:
        yield
    finally:
        _CURRENT.axis = saved


def replica_sum(x):
    """``x`` summed over the replicas whose statistics are shared (as it is otherwise)."""
    axis = getattr(_CURRENT, "axis", None)
    return x if axis is None else jax.lax.psum(x, axis)


def statistics_shared():
    return getattr(_CURRENT, "axis", None) is not None


@contextlib.contextmanager
def running(ctx):
    saved = getattr(_CURRENT, "ctx", None)
    _CURRENT.ctx = ctx
    try:
        yield ctx
    finally:
        _CURRENT.ctx = saved


def _pad(x, pads, value=0.0):
    (t, b), (l, r) = pads
    if not (t or b or l or r):
        return x
    return jnp.pad(x, ((0, 0), (0, 0), (t, b), (l, r)), constant_values=value)


def float32(x):
    """``x`` in float32 if it is a bf16 layer's bfloat16 output, other dtypes as they are: what
    computes in float32 under bf16 (normalisation's statistics, the losses) takes its input
    through this."""
    return x.astype(jnp.float32) if x.dtype == jnp.bfloat16 else x


def nhwc(x):
    return jnp.transpose(x, (0, 2, 3, 1))


def nchw(x):
    return jnp.transpose(x, (0, 3, 1, 2))


def channels_last(fn, *xs):
    """``fn`` of images (N, C, H, W) computed channels-last: ``fn`` takes and returns
    (N, H, W, C) arrays, transposed at the op's boundary. ``nnx.Conv`` works channels-last
    too, so a transpose back to (N, C, H, W) at one op's end meets the transpose to
    (N, H, W, C) at the next one's start and XLA removes the pair: the program keeps the
    images channels-last from op to op, where the CPU's convolutions and pooling windows want
    them. Other ranks go through as they are."""
    if xs[0].ndim != 4:
        return fn(*xs)
    return nchw(fn(*[nhwc(x) for x in xs]))


# -- layers -------------------------------------------------------------------------------------
def conv2d(inputs, layer, a, ctx):
    return nchw(layer(nhwc(inputs[0])))


def batchnorm(inputs, layer, a, ctx):
    return layer(inputs[0], use_running_average=not ctx.training)


def dense(inputs, layer, a, ctx):
    if "weight" in ctx.shared:
        return layer(inputs[0], ctx.shared["weight"])
    return layer(inputs[0])


def embedding(inputs, layer, a, ctx):
    if "weight" in ctx.shared:  # the table of another embedding (a shared vocabulary)
        out = jnp.take(ctx.shared["weight"], inputs[0], axis=0)
    else:
        out = layer(inputs[0])
    return out * a["scale"] if a["scale"] != 1.0 else out


def layernorm(inputs, layer, a, ctx):
    return layer(inputs[0])


def multi_head_attention(inputs, layer, a, ctx):
    rate = a["dropout"] if ctx.training else 0.0
    return layer(inputs[0], inputs[1], inputs[2], rate, ctx.rng() if rate else None)


def channel_layernorm(inputs, layer, a, ctx):
    return layer(inputs[0])


def lstm(inputs, layer, a, ctx):
    return layer(inputs[0], inputs[1])


def gru(inputs, layer, a, ctx):
    return layer(inputs[0], inputs[1])


def additive_attention(inputs, layer, a, ctx):
    return layer(inputs[0], inputs[1], inputs[2])


def sequence_batchnorm(inputs, layer, a, ctx):
    return layer(inputs[0], inputs[1], use_running_average=not ctx.training)


# -- derivative nodes (WGAN-GP's gradient penalty, tbdzoo/spec/derivative.py) -------------------
# Each is JAX's own derivative of the forward op (jax.vjp), which the step's backward pass then
# differentiates again.
def _conv(x, weight, a):
    return jax.lax.conv_general_dilated(
        x, weight, tuple(a["stride"]), [tuple(p) for p in a["padding"]],
        rhs_dilation=tuple(a["dilation"]), feature_group_count=a["groups"],
        dimension_numbers=("NCHW", "OIHW", "NCHW"))


def conv2d_input_grad(inputs, layer, a, ctx):
    dy, = inputs
    weight = ctx.shared["weight"]
    x = jnp.zeros((dy.shape[0],) + tuple(a["input_shape"]), weight.dtype)
    _, pull = jax.vjp(lambda v: _conv(v, weight, a), x)  # linear in x: exact at any point
    return pull(dy.astype(weight.dtype))[0]  # in the weight's float32 (under bf16 too)


def dense_input_grad(inputs, layer, a, ctx):
    return inputs[0] @ ctx.shared["weight"]


def relu_grad(inputs, layer, a, ctx):
    dy, x = inputs
    return jnp.where(x > 0, dy, 0.0)


def _channel_layernorm(x, gamma, eps):
    axes = tuple(range(1, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * gamma[:, None, None]


def channel_layernorm_input_grad(inputs, layer, a, ctx):
    dy, x = inputs
    gamma = ctx.shared["gamma"]
    _, pull = jax.vjp(lambda v: _channel_layernorm(v, gamma, a["eps"]), x)
    return pull(dy)[0]


# -- functions ----------------------------------------------------------------------------------
def relu(inputs, layer, a, ctx):
    return channels_last(jax.nn.relu, inputs[0])


def _sum(*xs):
    out = xs[0]
    for x in xs[1:]:
        out = out + x
    return out


def add(inputs, layer, a, ctx):
    if len({x.ndim for x in inputs}) != 1:  # broadcasting: as the shapes are
        return _sum(*inputs)
    return channels_last(_sum, *inputs)


def _window(a):
    """Window, strides and padding of a 2-D pooling over channels-last images."""
    return ((1,) + tuple(a["kernel"]) + (1,), (1,) + tuple(a["stride"]) + (1,),
            ((0, 0),) + tuple(tuple(p) for p in a["padding"]) + ((0, 0),))


def maxpool2d(inputs, layer, a, ctx):
    window, strides, padding = _window(a)
    return channels_last(lambda x: jax.lax.reduce_window(
        x, -jnp.inf, jax.lax.max, window, strides, padding), inputs[0])


def avgpool2d(inputs, layer, a, ctx):
    window, strides, padding = _window(a)

    def pool(x):
        total = jax.lax.reduce_window(x, 0.0, jax.lax.add, window, strides, padding)
        if a["count_include_pad"]:
            return total / float(a["kernel"][0] * a["kernel"][1])
        ones = jnp.ones((1,) + x.shape[1:3] + (1,), x.dtype)
        count = jax.lax.reduce_window(ones, 0.0, jax.lax.add, window, strides, padding)
        return total / count
    return channels_last(pool, inputs[0])


def global_avgpool(inputs, layer, a, ctx):
    return nhwc(inputs[0]).mean(axis=(1, 2))


def flatten(inputs, layer, a, ctx):
    x = inputs[0]
    return x.reshape(x.shape[0], -1)


def positional_encoding(inputs, layer, a, ctx):
    x = inputs[0]
    return x + jnp.asarray(sinusoid_table(x.shape[1], x.shape[2]), x.dtype)


def dropout(inputs, layer, a, ctx):
    x = inputs[0]
    if not ctx.training or not a["rate"]:
        return x
    keep = jax.random.bernoulli(ctx.rng(), 1.0 - a["rate"], x.shape)
    return jnp.where(keep, x / (1.0 - a["rate"]), 0.0)


def concat(inputs, layer, a, ctx):
    if a["axis"] == 0 and inputs[0].ndim == 4:  # images' channels: the last axis channels-last
        return channels_last(lambda *xs: jnp.concatenate(xs, axis=-1), *inputs)
    return jnp.concatenate(inputs, axis=a["axis"] + 1)


def tanh(inputs, layer, a, ctx):
    return jnp.tanh(inputs[0])


def upsample_nearest(inputs, layer, a, ctx):
    f = a["factor"]
    return jnp.repeat(jnp.repeat(inputs[0], f, axis=2), f, axis=3)


def reshape(inputs, layer, a, ctx):
    x = inputs[0]
    return x.reshape((x.shape[0],) + tuple(a["shape"]))


def scale(inputs, layer, a, ctx):
    return inputs[0] * a["factor"]


def lerp(inputs, layer, a, ctx):
    x, y, t = inputs
    t = t.reshape((t.shape[0],) + (1,) * (x.ndim - 1))
    return t * x + (1.0 - t) * y


def clipped_relu(inputs, layer, a, ctx):
    """min(max(x, 0), ceiling), with gradient 1 strictly inside (0, ceiling) and 0 elsewhere."""
    x = inputs[0]
    return jnp.where(x <= 0.0, 0.0, jnp.where(x >= a["ceiling"], a["ceiling"], x))


def transpose(inputs, layer, a, ctx):
    return jnp.transpose(inputs[0], (0,) + tuple(i + 1 for i in a["perm"]))


def lengths_after_conv(inputs, layer, a, ctx):
    (before, after), k = a["padding"], a["kernel"]
    out = (inputs[0] + (before + after - a["dilation"] * (k - 1) - 1)) // a["stride"] + 1
    return jnp.maximum(out, 1)


def frozen_batchnorm(inputs, layer, a, ctx):
    return layer(inputs[0])


def roi_align(inputs, layer, a, ctx):
    """out[n, r, c, i, j] = mean over bin (i, j)'s sr^2 samples of sum_k w * features[n, c].flat
    [idx], the taps (indices, weights) from the targets step, per image (jax.vmap); the
    backward pass scatter-adds the same taps (``_taps_summed``)."""
    features, indices, weights = inputs
    n, c = features.shape[:2]
    (oh, ow), sr = a["output_size"], a["sampling_ratio"]
    rois = indices.shape[1]
    per_bin = sr * sr * indices.shape[-1]
    idx = indices.reshape(n, rois * oh * ow, per_bin)
    w = jax.lax.stop_gradient(weights).astype(jnp.float32).reshape(idx.shape)
    flat = jnp.swapaxes(features.reshape(n, c, -1), 1, 2)           # (N, H*W, C)
    out = (jax.vmap(_taps_summed)(flat, idx, w) / (sr * sr)).astype(features.dtype)
    return jnp.swapaxes(out.reshape(n, rois, oh * ow, c), 2, 3).reshape(n, rois, c, oh, ow)


@jax.custom_vjp
def _taps_summed(flat, idx, w):
    """(P, C) float32: sum over t of w[p, t] * flat[idx[p, t]], for flat (H*W, C) and idx, w
    (P, T), summed in float32 (a bf16 map too). One tap a loop iteration, so no (P, T, C) array
    of gathered taps is ever held (Faster R-CNN's would be 1,568 MiB in float32: 128 RoIs x
    196 bins x 16 taps x 1,024 channels)."""
    def add(total, tap):
        i, weight = tap
        return total + flat[i].astype(jnp.float32) * weight[:, None], None
    total = jnp.zeros((idx.shape[0], flat.shape[1]), jnp.float32)
    return jax.lax.scan(add, total, (idx.T, w.T))[0]


def _taps_summed_forward(flat, idx, w):
    return _taps_summed(flat, idx, w), (idx, w, jnp.zeros((), flat.dtype), flat.shape)


def _taps_summed_backward(saved, grad):
    """Linear in ``flat``: its gradient scatter-adds each tap's weighted output gradient into
    the map (in float32), one tap an iteration. The taps come from the targets step: no
    gradient."""
    idx, w, like, shape = saved

    def add(total, tap):
        i, weight = tap
        return total.at[i].add(grad * weight[:, None]), None
    total = jnp.zeros(shape, jnp.float32)
    flat_grad = jax.lax.scan(add, total, (idx.T, w.T))[0]
    return flat_grad.astype(like.dtype), None, jnp.zeros_like(w)


_taps_summed.defvjp(_taps_summed_forward, _taps_summed_backward)


def to_batch(inputs, layer, a, ctx):
    x = inputs[0]
    return x.reshape((x.shape[0] * x.shape[1],) + tuple(x.shape[2:]))


def stop_gradient(inputs, layer, a, ctx):
    return jax.lax.stop_gradient(inputs[0])


def ones_like(inputs, layer, a, ctx):
    return jnp.ones_like(inputs[0])


def attention_bias(keys, pad_id, causal, t):
    """Additive mask (N, 1, T|1, S): -1e9 on padded keys and, if causal, on later keys."""
    bias = jnp.where(keys == pad_id, attention.MASKED_LOGIT, 0.0)[:, None, None, :]
    if causal:
        later = np.triu(np.ones((t, keys.shape[1]), bool), 1)
        bias = jnp.where(later[None, None], attention.MASKED_LOGIT, bias)
    return bias


# -- losses (tbdzoo/spec/losses.py) ------------------------------------------------------------
def softmax_cross_entropy(logits, labels, loss):
    """Mean over counted positions of -sum_k q_k log p_k, q = (1 - eps) onehot + eps / K;
    positions labelled ``ignore_index`` count neither in the sum nor in the mean."""
    k = logits.shape[-1]
    z = logits.reshape(-1, k).astype(jnp.float32)
    y = labels.reshape(-1)
    smoothing = loss.get("label_smoothing") or 0.0
    ignore = loss.get("ignore_index")
    # -sum_k q_k log p_k = lse(z) - (1 - eps) z_y - eps / K sum_k z_k, with log p_k = z_k - lse(z)
    # written out and z_y picked by a comparison, not a gather: every term is a row reduction of
    # z, and the derivative, softmax(z) - q, one elementwise pass, so XLA keeps no (positions, K)
    # array of log-probabilities and scatters nothing.
    lse = jax.nn.logsumexp(z, axis=-1)
    picked = jnp.where(jnp.arange(k)[None, :] == y[:, None], z, 0.0).sum(axis=-1)
    per = lse - (1.0 - smoothing) * picked
    if smoothing:
        per = per - smoothing / k * z.sum(axis=-1)
    if ignore is None:
        return per.mean()
    keep = (y != ignore).astype(per.dtype)
    return (per * keep).sum() / keep.sum()


def loss(kind, inputs, attrs):
    if kind not in _LOSSES:
        raise NotImplementedError("loss kind {!r} is not built yet on the jax backend".format(kind))
    return _LOSSES[kind](inputs, attrs)


def _softmax_cross_entropy_loss(inputs, attrs):
    return softmax_cross_entropy(inputs["logits"], inputs["labels"], attrs)


def _mean_loss(inputs, attrs):
    return inputs["x"].astype(jnp.float32).mean()


def _norm_penalty_loss(inputs, attrs):
    x = inputs["x"].astype(jnp.float32)
    norm = jnp.sqrt((x.reshape(x.shape[0], -1) ** 2).sum(axis=1))
    return ((norm - attrs["target"]) ** 2).mean()


def _ctc_loss(inputs, attrs):
    """Each example's summed cost, averaged over the batch (optax.ctc_loss's per-sequence
    cost, from the padding masks of the lengths)."""
    logits = inputs["logits"].astype(jnp.float32)
    t = logits.shape[1]
    labels = inputs["labels"]
    logit_pad = (jnp.arange(t)[None, :] >= inputs["input_lengths"][:, None]).astype(jnp.float32)
    label_pad = (jnp.arange(labels.shape[1])[None, :] >= inputs["label_lengths"][:, None]) \
        .astype(jnp.float32)
    costs = optax.ctc_loss(logits, logit_pad, labels, label_pad, blank_id=attrs["blank"])
    return costs.mean()


def _smooth_l1_loss(inputs, attrs):
    d = jnp.abs(inputs["prediction"].astype(jnp.float32) - inputs["target"])
    s2 = float(attrs["sigma"]) ** 2
    per = jnp.where(d < 1.0 / s2, 0.5 * s2 * d * d, d - 0.5 / s2)
    return (inputs["weight"] * per).sum() / (attrs["normalizer"] * d.shape[0])


def _sigmoid_cross_entropy_loss(inputs, attrs):
    weight = inputs["weight"].astype(jnp.float32)
    per = optax.sigmoid_binary_cross_entropy(inputs["logits"].astype(jnp.float32),
                                             inputs["labels"].astype(jnp.float32))
    return (weight * per).sum() / jnp.maximum(weight.sum(), 1.0)


def _policy_gradient_loss(inputs, attrs):
    log_p = jax.nn.log_softmax(inputs["logits"].astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(log_p, inputs["actions"][:, None], axis=-1)[:, 0]
    return -(picked * inputs["advantages"]).mean()


def _entropy_loss(inputs, attrs):
    log_p = jax.nn.log_softmax(inputs["logits"].astype(jnp.float32), axis=-1)
    return -(jnp.exp(log_p) * log_p).sum(axis=-1).mean()


def _squared_error_loss(inputs, attrs):
    diff = inputs["prediction"].astype(jnp.float32) - inputs["target"]
    return 0.5 * (diff * diff).mean()


_LOSSES = {"softmax_cross_entropy": _softmax_cross_entropy_loss, "mean": _mean_loss,
           "norm_penalty": _norm_penalty_loss, "ctc": _ctc_loss,
           "policy_gradient": _policy_gradient_loss, "entropy": _entropy_loss,
           "squared_error": _squared_error_loss, "smooth_l1": _smooth_l1_loss,
           "sigmoid_cross_entropy": _sigmoid_cross_entropy_loss}
