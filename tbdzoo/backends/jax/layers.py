"""Each parametrised node as a Flax NNX layer, and where its canonical parameters live there.

  conv2d               nnx.Conv (channels-last; kernel (kh, kw, C / groups, F))
  batchnorm            BatchNorm, an nnx.BatchNorm over axis 1 with the spec's running update
  dense                nnx.Linear (kernel (in, out)); TiedLinear when the weight is another
                       layer's (the Transformer's output projection reads the embedding table)
  embedding            nnx.Embed
  layernorm            nnx.LayerNorm (exact variance, not the fast E[x^2] - E[x]^2 form)
  channel_layernorm    nnx.LayerNorm over (C, H, W) with a scale and bias per channel
  multi_head_attention MultiHeadAttention: four nnx.Linear projections
  lstm, gru            recurrent.Recurrent: per layer and direction nnx.LSTMCell / GRUCell
  additive_attention   recurrent.AdditiveAttention (two nnx.Linear and v)
  sequence_batchnorm   recurrent.SequenceBatchNorm (statistics over the valid steps)
  frozen_batchnorm     FrozenBatchNorm (fixed statistics; Param or BatchStat as trained)

``CANONICAL[op]`` maps a parameter's suffix to (attribute path in the layer, the canonical
array's transform to the layer's layout, the inverse); NumPy and jax.numpy arrays both go
through them.
"""
from . import framework  # noqa: F401  (first: JAX imported quietly, full float32 precision)

# isort: split
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ...errors import UnsupportedOptionError
from . import ops, recurrent


def _same(x):
    return x


def _transposed(x):
    return x.T


def _conv_to_native(w):   # (F, C / groups, kh, kw) -> (kh, kw, C / groups, F)
    return w.transpose(2, 3, 1, 0)


def _conv_to_canonical(k):
    return k.transpose(3, 2, 0, 1)


class BatchNorm(nnx.BatchNorm):
    """``nnx.BatchNorm`` over axis 1 (channels of (N, C, ...)) with the spec's running update:
    in training the batch's mean and biased variance normalise, and the running statistics
    move by ``1 - self.momentum`` towards the batch mean and the *unbiased* batch variance
    (PyTorch's convention, which the spec keeps; Flax's own update takes the biased one).
    Without running statistics (``tracks`` False) the batch's own normalise in inference too.
    A bfloat16 input is normalised in float32 and comes back bfloat16, as PyTorch's autocast
    and Flax's mixed precision do, so a bf16 network's activations stay bf16 between layers.
    Images are normalised channels-last (``ops.channels_last``), as the convolutions around
    them run, so XLA's program keeps them channels-last through the layer."""

    def __init__(self, num_features, *, momentum, epsilon, tracks=True, rngs):
        super().__init__(num_features, axis=1, momentum=1.0 - momentum, epsilon=epsilon,
                         use_fast_variance=False, rngs=rngs)
        self.tracks = tracks
        if not tracks:
            del self.mean, self.var

    def __call__(self, x, use_running_average=None, *, mask=None):
        running = self.use_running_average if use_running_average is None else use_running_average
        return _channels_moved_last(lambda y: self._normalise(y, running), x)

    def _normalise(self, x, running):
        """The normalisation of ``x`` with its channels on the last axis."""
        returned, x = x.dtype, ops.float32(x)
        axes = tuple(range(x.ndim - 1))
        if running and self.tracks:
            mean, var = self.mean.value, self.var.value
        else:
            n = x.size // x.shape[-1]
            if ops.statistics_shared():     # --bn-mode sync: the global batch's moments
                n = ops.replica_sum(jnp.float32(n))
                mean = ops.replica_sum(x.sum(axis=axes)) / n
                var = ops.replica_sum(((x - mean) ** 2).sum(axis=axes)) / n
                unbiased = n / jnp.maximum(n - 1.0, 1.0)
            else:
                mean, var = _moments(x, axes)
                unbiased = n / max(n - 1, 1)
            if self.tracks and not running:
                keep = self.momentum
                self.mean.value = keep * self.mean.value + (1.0 - keep) * jax.lax.stop_gradient(mean)
                self.var.value = keep * self.var.value + (1.0 - keep) * jax.lax.stop_gradient(
                    var * unbiased)
        inv = self.scale.value * jax.lax.rsqrt(var + self.epsilon)
        return ((x - mean) * inv + self.bias.value).astype(returned)


def _channels_moved_last(fn, x):
    """``fn`` of (N, C, ...) computed with the channels on the last axis: images through
    ``ops.channels_last`` (so the transposes cancel against the channels-last convolutions
    around them), other ranks by moving axis 1."""
    if x.ndim == 4:
        return ops.channels_last(fn, x)
    return jnp.moveaxis(fn(jnp.moveaxis(x, 1, -1)), -1, 1)


def _moments(x, axes):
    """The mean and biased variance of ``x`` over ``axes`` (all but the last), in one pass over
    ``x``: both sums are taken of ``x - k``, ``k`` one of the channel's own values, so
    E[(x - k)^2] - E[x - k]^2 keeps float32's accuracy when the mean is far from zero (the
    shifted-data form of the textbook one-pass variance), and XLA reads ``x`` once for both
    (one multi-output reduction) where the two-pass form reads it twice."""
    k = jax.lax.stop_gradient(x[(0,) * len(axes)])
    d = x - k
    shifted = d.mean(axis=axes)
    var = jnp.maximum((d * d).mean(axis=axes) - shifted * shifted, 0.0)
    return k + shifted, var


class TiedLinear(nnx.Module):
    """y = x W^T + b with W another layer's parameter, handed in canonical (out, in) layout
    at each call (``ops.Context.shared``); the bias is its own."""

    def __init__(self, units, use_bias):
        self.bias = nnx.Param(jnp.zeros((units,), jnp.float32)) if use_bias else None
        self.dtype = None   # as nnx.Linear's: bfloat16 under bf16 (the model's _bf16_layers)

    def __call__(self, x, weight):
        bias = self.bias.value if self.bias is not None else None
        if self.dtype is not None:
            x, weight = x.astype(self.dtype), weight.astype(self.dtype)
            bias = bias.astype(self.dtype) if bias is not None else None
        y = x @ weight.T
        return y + bias if bias is not None else y


class MultiHeadAttention(nnx.Module):
    """Multi-head attention as the spec defines it: four ``nnx.Linear`` projections (query,
    key, value, out); heads split the projection's features in order; padded keys (and, if
    causal, later keys) get the logit -1e9; scores scaled by 1 / sqrt(d_head)."""

    def __init__(self, d_model, num_heads, causal, pad_id, rngs):
        for name in ("query", "key", "value", "out"):
            setattr(self, name, nnx.Linear(d_model, d_model, rngs=rngs))
        self.num_heads, self.causal, self.pad_id = num_heads, causal, pad_id

    def __call__(self, query, source, keys, dropout_rate=0.0, key=None):
        n, t, d = query.shape
        s, h = source.shape[1], self.num_heads
        dh = d // h

        def heads(x, layer, length):
            return layer(x).reshape(n, length, h, dh).transpose(0, 2, 1, 3)

        q, k, v = heads(query, self.query, t), heads(source, self.key, s), \
            heads(source, self.value, s)
        logits = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh) + \
            ops.attention_bias(keys, self.pad_id, self.causal, t)
        weights = jax.nn.softmax(logits, axis=-1)
        if dropout_rate:
            kept = jax.random.bernoulli(key, 1.0 - dropout_rate, weights.shape)
            weights = jnp.where(kept, weights / (1.0 - dropout_rate), 0.0)
        context = (weights @ v).transpose(0, 2, 1, 3).reshape(n, t, d)
        return self.out(context)


class FrozenBatchNorm(nnx.Module):
    """y = (x - running_mean) gamma / sqrt(running_var + eps) + beta over axis 1, statistics
    fixed (torchvision's FrozenBatchNorm2d); each tensor an ``nnx.Param`` if the spec trains
    it, else an ``nnx.BatchStat``. Images are scaled channels-last, as BatchNorm's are."""

    def __init__(self, num_features, epsilon, trainable):
        for name in ("scale", "bias", "mean", "var"):
            kind = nnx.Param if trainable[name] else nnx.BatchStat
            setattr(self, name, kind(jnp.zeros((num_features,), jnp.float32)))
        self.epsilon = epsilon

    def __call__(self, x):
        scale = self.scale.value * jax.lax.rsqrt(self.var.value + self.epsilon)
        shift = self.bias.value - self.mean.value * scale

        def affine(y):  # channels last
            return (ops.float32(y) * scale + shift).astype(y.dtype)
        return _channels_moved_last(affine, x)


class Shared(nnx.Module):
    """The layer of a node whose parameters all belong to other layers (WGAN-GP's derivative
    nodes read the critic's): nothing of its own; its op gets them through the context."""


_ATTENTION = {}
for _k, _name in (("q", "query"), ("k", "key"), ("v", "value"), ("o", "out")):
    _ATTENTION["W_" + _k] = (_name + ".kernel", _transposed, _transposed)
    _ATTENTION["b_" + _k] = (_name + ".bias", _same, _same)

CANONICAL = {
    "conv2d": {"weight": ("kernel", _conv_to_native, _conv_to_canonical),
               "bias": ("bias", _same, _same)},
    "batchnorm": {"gamma": ("scale", _same, _same), "beta": ("bias", _same, _same),
                  "running_mean": ("mean", _same, _same), "running_var": ("var", _same, _same)},
    "dense": {"weight": ("kernel", _transposed, _transposed), "bias": ("bias", _same, _same)},
    "embedding": {"weight": ("embedding", _same, _same)},
    "layernorm": {"gamma": ("scale", _same, _same), "beta": ("bias", _same, _same)},
    "multi_head_attention": _ATTENTION,
    "channel_layernorm": {"gamma": ("scale", _same, _same), "beta": ("bias", _same, _same)},
    "additive_attention": {"w_query": ("query.kernel", _transposed, _transposed),
                           "w_memory": ("memory.kernel", _transposed, _transposed),
                           "v": ("v", _same, _same)},
}
CANONICAL["sequence_batchnorm"] = CANONICAL["frozen_batchnorm"] = CANONICAL["batchnorm"]
RECURRENT = ("lstm", "gru")


def own_params(graph, node):
    """{suffix: canonical name} of the parameters ``node`` owns (not another layer's)."""
    return {s: full for s, full in graph.param_names(node).items()
            if full == node.name + "." + s}


def shared_params(graph, node, path=None):
    """{suffix: canonical name} of the parameters ``node`` reads from a layer other than its
    own (at ``path``: default its name; an application's node uses the applied block's)."""
    path = node.name if path is None else path
    return {s: full for s, full in graph.param_names(node).items() if full != path + "." + s}


def make(graph, node, rngs):
    """The Flax layer of ``node`` (its values are set afterwards, from canonical weights)."""
    a, op = node.attrs, node.op
    own = own_params(graph, node)
    if op == "dense" and "weight" not in own:
        return TiedLinear(a["units"], "bias" in own)
    if not own:
        return Shared()
    shape = graph.shape_of(node.inputs[0]) if node.inputs else None
    if op == "conv2d":
        return nnx.Conv(shape[0], a["filters"], tuple(a["kernel"]), tuple(a["stride"]),
                        padding=[tuple(p) for p in a["padding"]],
                        kernel_dilation=tuple(a["dilation"]), feature_group_count=a["groups"],
                        use_bias=a["use_bias"], rngs=rngs)
    if op == "batchnorm":
        return BatchNorm(shape[0], momentum=a["momentum"], epsilon=a["eps"],
                         tracks=a["track_running_stats"], rngs=rngs)
    if op == "dense":
        return nnx.Linear(shape[-1], a["units"], use_bias=a["use_bias"], rngs=rngs)
    if op == "embedding":
        return nnx.Embed(a["vocab"], a["dim"], rngs=rngs)
    if op == "layernorm":
        return nnx.LayerNorm(shape[-1], epsilon=a["eps"], use_fast_variance=False, rngs=rngs)
    if op == "channel_layernorm":  # one mean and variance per example over (C, H, W)
        return nnx.LayerNorm(shape[0], epsilon=a["eps"], reduction_axes=(1, 2, 3),
                             feature_axes=1, use_fast_variance=False, rngs=rngs)
    if op in RECURRENT:
        return recurrent.Recurrent(op, shape[-1], a, rngs)
    if op == "additive_attention":
        return recurrent.AdditiveAttention(shape[-1], graph.shape_of(node.inputs[1])[-1],
                                           a["units"], rngs)
    if op == "sequence_batchnorm":
        return recurrent.SequenceBatchNorm(shape[-1], momentum=a["momentum"], epsilon=a["eps"],
                                           tracks=a["track_running_stats"], rngs=rngs)
    if op == "frozen_batchnorm":
        params = graph.params()
        trainable = {attr: params[own[suffix]].trainable
                     for suffix, (attr, _, _) in CANONICAL[op].items()}
        return FrozenBatchNorm(shape[0], a["eps"], trainable)
    if op == "multi_head_attention":
        return MultiHeadAttention(shape[-1], a["num_heads"], a["causal"], a["pad_id"], rngs)
    raise UnsupportedOptionError(
        "op {!r} (node {!r} of {}) has no Flax layer on the jax backend yet; it is not built "
        "yet".format(op, node.name, graph.name))


def location(graph, name):
    """(module path of the owning layer, attribute path in it, to_native, to_canonical) of
    canonical parameter ``name``."""
    spec = graph.params()[name]
    node = graph.nodes[spec.owner]
    table = recurrent.canonical_map(node.op, node.attrs) if node.op in RECURRENT \
        else CANONICAL[node.op]
    attr, to_native, to_canonical = table[name[len(spec.owner) + 1:]]
    return spec.owner, attr, to_native, to_canonical
