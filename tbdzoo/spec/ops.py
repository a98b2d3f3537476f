"""Node types: attribute validation, shape inference, parameters and analytic FLOPs.

Canonical layouts (every backend converts at its boundary):
  activations  per-example shapes without the batch axis; images (C, H, W); sequences (T, D)
  conv kernel  (out, in / groups, kh, kw)
  dense        (out, in), applied to the last axis
  embedding    (vocab, dim)
  attention    W_q, W_k, W_v, W_o each (d_model, d_model) as (out, in); heads split the output
               axis in order, head h owning rows [h * d_head, (h + 1) * d_head)
Padding is explicit: ((top, bottom), (left, right)), resolved when the spec is built.
FLOPs count a multiply-add as 2 and are per example, forward only.
"""
from collections import OrderedDict


_REGISTRY = OrderedDict()
LOSSES = ("softmax_cross_entropy",)


def get(op):
    try:
        return _REGISTRY[op]
    except KeyError:
        raise ValueError("unknown op {!r}; known ops: {}".format(op, ", ".join(_REGISTRY)))


def names():
    return list(_REGISTRY)


def register(cls):
    _REGISTRY[cls.name] = cls()
    return cls


def _prod(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _pads(v):
    """Accept an int, (ph, pw) or ((top, bottom), (left, right)); return the last form."""
    if isinstance(v, int):
        return ((v, v), (v, v))
    v = tuple(v)
    if all(isinstance(p, int) for p in v):
        return ((v[0], v[0]), (v[1], v[1]))
    return tuple(tuple(p) for p in v)


def conv_out(size, k, s, p, d=1):
    return (size + p[0] + p[1] - d * (k - 1) - 1) // s + 1


class OpDef(object):
    """Defaults: one input, same shape, no parameters, FLOPs = output elements."""

    name = None
    defaults = {}
    required = ()

    def normalize(self, attrs):
        missing = [k for k in self.required if k not in attrs]
        if missing:
            raise ValueError("op {} needs attribute(s) {}".format(self.name, ", ".join(missing)))
        known = set(self.defaults) | set(self.required) | {"shared"}
        extra = sorted(set(attrs) - known)
        if extra:
            raise ValueError("op {} has no attribute(s) {}; known: {}".format(
                self.name, ", ".join(extra), ", ".join(sorted(known))))
        out = dict(self.defaults)
        out.update(attrs)
        return self.canonical(out)

    def canonical(self, attrs):
        return attrs

    def infer_shape(self, in_shapes, attrs):
        return in_shapes[0]

    def out_dtype(self, in_dtypes, attrs):
        return "float32"

    def params(self, in_shapes, attrs):
        return OrderedDict()

    def flops(self, in_shapes, out_shape, attrs):
        return _prod(out_shape)


@register
class Conv2D(OpDef):
    name = "conv2d"
    required = ("filters", "kernel")
    defaults = {"stride": 1, "padding": 0, "dilation": 1, "groups": 1, "use_bias": False,
                "weight_init": ("he_normal", "fan_out")}

    def canonical(self, a):
        a["kernel"], a["stride"], a["dilation"] = _pair(a["kernel"]), _pair(a["stride"]), _pair(a["dilation"])
        a["padding"] = _pads(a["padding"])
        a["weight_init"] = tuple(a["weight_init"])
        return a

    def infer_shape(self, in_shapes, a):
        c, h, w = in_shapes[0]
        if c % a["groups"] or a["filters"] % a["groups"]:
            raise ValueError("channels {} and filters {} must divide by groups {}".format(
                c, a["filters"], a["groups"]))
        ho = conv_out(h, a["kernel"][0], a["stride"][0], a["padding"][0], a["dilation"][0])
        wo = conv_out(w, a["kernel"][1], a["stride"][1], a["padding"][1], a["dilation"][1])
        if ho <= 0 or wo <= 0:
            raise ValueError("input {}x{} is too small for this convolution".format(h, w))
        return (a["filters"], ho, wo)

    def params(self, in_shapes, a):
        cin = in_shapes[0][0] // a["groups"]
        p = OrderedDict(weight=((a["filters"], cin) + a["kernel"], a["weight_init"], True))
        if a["use_bias"]:
            p["bias"] = ((a["filters"],), ("zeros",), True)
        return p

    def flops(self, in_shapes, out, a):
        cin = in_shapes[0][0] // a["groups"]
        return 2 * _prod(out) * cin * a["kernel"][0] * a["kernel"][1]


@register
class BatchNorm(OpDef):
    """Normalises axis 0 of the example (channels). ``momentum`` is the weight of the new batch
    in the running statistics (PyTorch's convention); running_var is updated with the unbiased
    batch variance, as PyTorch does. ``track_running_stats=False`` keeps no statistics and
    normalises by the batch in inference too (WGAN-GP's generator)."""
    name = "batchnorm"
    defaults = {"eps": 1e-5, "momentum": 0.1, "gamma_init": 1.0, "track_running_stats": True}

    def params(self, in_shapes, a):
        c = (in_shapes[0][0],)
        p = OrderedDict([("gamma", (c, ("constant", a["gamma_init"]), True)),
                         ("beta", (c, ("zeros",), True))])
        if a["track_running_stats"]:  # without them, inference normalises by the batch too
            p["running_mean"] = (c, ("zeros",), False)
            p["running_var"] = (c, ("ones",), False)
        return p

    def flops(self, in_shapes, out, a):
        return 4 * _prod(out)


@register
class ReLU(OpDef):
    name = "relu"


@register
class Add(OpDef):
    name = "add"

    def infer_shape(self, in_shapes, a):
        if len(in_shapes) < 2 or any(s != in_shapes[0] for s in in_shapes):
            raise ValueError("add needs two or more inputs of one shape, got {}".format(in_shapes))
        return in_shapes[0]

    def flops(self, in_shapes, out, a):
        return (len(in_shapes) - 1) * _prod(out)


class _Pool2D(OpDef):
    required = ("kernel",)
    defaults = {"stride": None, "padding": 0}

    def canonical(self, a):
        a["kernel"] = _pair(a["kernel"])
        a["stride"] = a["kernel"] if a["stride"] is None else _pair(a["stride"])
        a["padding"] = _pads(a["padding"])
        return a

    def infer_shape(self, in_shapes, a):
        c, h, w = in_shapes[0]
        return (c, conv_out(h, a["kernel"][0], a["stride"][0], a["padding"][0]),
                conv_out(w, a["kernel"][1], a["stride"][1], a["padding"][1]))

    def flops(self, in_shapes, out, a):
        return _prod(out) * a["kernel"][0] * a["kernel"][1]


@register
class MaxPool2D(_Pool2D):
    """Padding cells never win the max (they hold -inf)."""
    name = "maxpool2d"


@register
class AvgPool2D(_Pool2D):
    """``count_include_pad`` is explicit because the frameworks' defaults disagree."""
    name = "avgpool2d"
    defaults = dict(_Pool2D.defaults, count_include_pad=False)


@register
class GlobalAvgPool(OpDef):
    name = "global_avgpool"

    def infer_shape(self, in_shapes, a):
        return (in_shapes[0][0],)

    def flops(self, in_shapes, out, a):
        return _prod(in_shapes[0])


@register
class Flatten(OpDef):
    """Flattens in canonical (C, H, W) order, whatever layout a backend computes in."""
    name = "flatten"

    def infer_shape(self, in_shapes, a):
        return (_prod(in_shapes[0]),)

    def flops(self, in_shapes, out, a):
        return 0


@register
class Dense(OpDef):
    """y = x W^T + b on the last axis; ``shared={'weight': name}`` ties the weight to another."""
    name = "dense"
    required = ("units",)
    defaults = {"use_bias": True, "init": "torch_default"}

    def canonical(self, a):
        if isinstance(a["init"], list):
            a["init"] = tuple(a["init"])
        return a

    def infer_shape(self, in_shapes, a):
        return tuple(in_shapes[0][:-1]) + (a["units"],)

    def params(self, in_shapes, a):
        fan_in = in_shapes[0][-1]
        if a["init"] == "torch_default":  # what nn.Linear does; keeps the reference familiar
            w_init = ("uniform", 1.0 / fan_in ** 0.5)
            b_init = ("uniform", 1.0 / fan_in ** 0.5)
        elif a["init"] == "xavier_uniform":
            w_init, b_init = ("xavier_uniform",), ("zeros",)
        elif isinstance(a["init"], tuple):  # an explicit initialiser of the weight; bias zeros
            w_init, b_init = a["init"], ("zeros",)
        else:
            raise ValueError("dense init must be torch_default, xavier_uniform or an "
                             "initialiser tuple such as ('uniform', 0.05)")
        p = OrderedDict(weight=((a["units"], fan_in), w_init, True))
        if a["use_bias"]:
            p["bias"] = ((a["units"],), b_init, True)
        return p

    def flops(self, in_shapes, out, a):
        return 2 * _prod(out) * in_shapes[0][-1]


@register
class Embedding(OpDef):
    """Token ids (T,) to vectors (T, dim), multiplied by ``scale`` (sqrt(d_model) in the Transformer)."""
    name = "embedding"
    required = ("vocab", "dim")
    defaults = {"scale": 1.0}

    def infer_shape(self, in_shapes, a):
        return tuple(in_shapes[0]) + (a["dim"],)

    def params(self, in_shapes, a):
        return OrderedDict(weight=((a["vocab"], a["dim"]), ("normal", a["dim"] ** -0.5), True))

    def flops(self, in_shapes, out, a):
        return _prod(out)


@register
class PositionalEncoding(OpDef):
    """Adds the sinusoidal table of Vaswani et al.: even features sin, odd features cos."""
    name = "positional_encoding"

    def infer_shape(self, in_shapes, a):
        if len(in_shapes[0]) != 2:
            raise ValueError("expects (T, D), got {}".format(in_shapes[0]))
        return in_shapes[0]


@register
class LayerNorm(OpDef):
    name = "layernorm"
    defaults = {"eps": 1e-5}

    def params(self, in_shapes, a):
        d = (in_shapes[0][-1],)
        return OrderedDict([("gamma", (d, ("ones",), True)), ("beta", (d, ("zeros",), True))])

    def flops(self, in_shapes, out, a):
        return 8 * _prod(out)


@register
class Dropout(OpDef):
    """Identity at inference; inverted dropout (scale 1/(1-rate)) in training."""
    name = "dropout"
    required = ("rate",)

    def flops(self, in_shapes, out, a):
        return 2 * _prod(out) if a["rate"] else 0


@register
class MultiHeadAttention(OpDef):
    """inputs: query (T, D), key/value source (S, D), key tokens (S,) whose ``pad_id`` entries are
    masked. ``causal`` masks keys after the query position. Masked logits are set to -1e9 before
    the softmax, scores are scaled by 1/sqrt(d_head), attention dropout follows the softmax."""
    name = "multi_head_attention"
    required = ("num_heads",)
    defaults = {"causal": False, "pad_id": 0, "dropout": 0.0}

    def infer_shape(self, in_shapes, a):
        q, kv, keys = in_shapes
        if len(q) != 2 or len(kv) != 2 or q[1] != kv[1]:
            raise ValueError("query {} and key/value {} must be (T, D) with one D".format(q, kv))
        if tuple(keys) != (kv[0],):
            raise ValueError("key tokens {} must be ({},)".format(keys, kv[0]))
        if q[1] % a["num_heads"]:
            raise ValueError("d_model {} must divide by num_heads {}".format(q[1], a["num_heads"]))
        if a["causal"] and q[0] != kv[0]:
            raise ValueError("causal attention needs T == S")
        return q

    def params(self, in_shapes, a):
        d = in_shapes[0][1]
        p = OrderedDict()
        for k in ("q", "k", "v", "o"):
            p["W_" + k] = ((d, d), ("xavier_uniform",), True)
            p["b_" + k] = ((d,), ("zeros",), True)
        return p

    def flops(self, in_shapes, out, a):
        (t, d), (s, _) = in_shapes[0], in_shapes[1]
        return 2 * d * d * (2 * t + 2 * s) + 2 * 2 * t * s * d + 5 * a["num_heads"] * t * s


# -- ops the generative and Inception models need --------------------------------------------
@register
class Concat(OpDef):
    """Joins inputs along ``axis`` of the example (0: channels of an image)."""
    name = "concat"
    defaults = {"axis": 0}

    def infer_shape(self, in_shapes, a):
        if len(in_shapes) < 2:
            raise ValueError("concat needs two or more inputs")
        axis, first = a["axis"], in_shapes[0]
        if not 0 <= axis < len(first):
            raise ValueError("axis {} is outside shape {}".format(axis, first))
        for s in in_shapes[1:]:
            if len(s) != len(first) or any(x != y for i, (x, y) in enumerate(zip(s, first))
                                           if i != axis):
                raise ValueError("shapes {} differ outside axis {}".format(in_shapes, axis))
        return tuple(first[:axis]) + (sum(s[axis] for s in in_shapes),) + tuple(first[axis + 1:])

    def flops(self, in_shapes, out, a):
        return 0


@register
class Tanh(OpDef):
    name = "tanh"


@register
class UpsampleNearest(OpDef):
    """(C, H, W) -> (C, H * factor, W * factor), each pixel repeated factor x factor times."""
    name = "upsample_nearest"
    defaults = {"factor": 2}

    def infer_shape(self, in_shapes, a):
        c, h, w = in_shapes[0]
        if a["factor"] < 1:
            raise ValueError("factor must be >= 1")
        return (c, h * a["factor"], w * a["factor"])

    def flops(self, in_shapes, out, a):
        return 0


@register
class Reshape(OpDef):
    """The example's elements in canonical (row-major, channels-first) order, re-shaped."""
    name = "reshape"
    required = ("shape",)

    def canonical(self, a):
        a["shape"] = tuple(a["shape"])
        return a

    def infer_shape(self, in_shapes, a):
        if _prod(a["shape"]) != _prod(in_shapes[0]):
            raise ValueError("cannot reshape {} into {}".format(in_shapes[0], a["shape"]))
        return a["shape"]

    def flops(self, in_shapes, out, a):
        return 0


@register
class ChannelLayerNorm(OpDef):
    """Normalises each example over all its axes (C, H, W) with one mean and variance (biased),
    then scales and shifts per channel: WGAN-GP's critic normalisation."""
    name = "channel_layernorm"
    defaults = {"eps": 1e-5}

    def params(self, in_shapes, a):
        c = (in_shapes[0][0],)
        return OrderedDict([("gamma", (c, ("ones",), True)), ("beta", (c, ("zeros",), True))])

    def flops(self, in_shapes, out, a):
        return 8 * _prod(out)


@register
class Lerp(OpDef):
    """inputs a, b and per-example weights t of shape (1,): t a + (1 - t) b (WGAN-GP's
    interpolates between real and generated images)."""
    name = "lerp"

    def infer_shape(self, in_shapes, a):
        x, y, t = in_shapes
        if x != y or tuple(t) != (1,):
            raise ValueError("lerp needs two inputs of one shape and weights (1,), got {}".format(
                in_shapes))
        return x

    def flops(self, in_shapes, out, a):
        return 3 * _prod(out)


@register
class Scale(OpDef):
    """Multiplies by a constant."""
    name = "scale"
    required = ("factor",)


@register
class StopGradient(OpDef):
    """The identity whose gradient is zero (an advantage's value estimate, a fixed target)."""
    name = "stop_gradient"

    def flops(self, in_shapes, out, a):
        return 0


@register
class OnesLike(OpDef):
    """Ones of its input's shape: the seed of an input gradient."""
    name = "ones_like"

    def flops(self, in_shapes, out, a):
        return 0


# -- input-gradient ops: the backward pass of an op, as a forward op -------------------------
# tbdzoo/spec/derivative.py builds the gradient of a network's output with respect to its input
# from these, so a framework that cannot differentiate twice still trains on a gradient penalty:
# it differentiates this ordinary graph once. Their parameters are always the forward node's.

class _InputGrad(OpDef):
    tied = ()

    def normalize(self, attrs):
        missing = [t for t in self.tied if t not in attrs.get("shared", {})]
        if missing:
            raise ValueError("op {} uses its forward node's {}: pass shared={{...}}".format(
                self.name, ", ".join(missing)))
        return OpDef.normalize(self, attrs)

@register
class Conv2DInputGrad(_InputGrad):
    """The gradient of ``conv2d`` with respect to its input: dy (F, Ho, Wo) -> dx (C, H, W).

    The attributes are the forward convolution's, plus ``input_shape`` (C, H, W); the kernel is
    the forward node's (``shared={'weight': ...}``). Exactly: a transposed convolution without
    padding of dy, giving ((Ho - 1) s + d (k - 1) + 1) rows, from which rows [top, top + H) are
    taken (rows past its end, which the forward stride never read, are zeros); columns alike."""
    name = "conv2d_input_grad"
    tied = ("weight",)
    required = ("kernel", "input_shape")
    defaults = {"stride": 1, "padding": 0, "dilation": 1, "groups": 1}

    def canonical(self, a):
        a["kernel"], a["stride"], a["dilation"] = _pair(a["kernel"]), _pair(a["stride"]), _pair(a["dilation"])
        a["padding"] = _pads(a["padding"])
        a["input_shape"] = tuple(a["input_shape"])
        return a

    def infer_shape(self, in_shapes, a):
        f, ho, wo = in_shapes[0]
        c, h, w = a["input_shape"]
        if (ho, wo) != (conv_out(h, a["kernel"][0], a["stride"][0], a["padding"][0], a["dilation"][0]),
                        conv_out(w, a["kernel"][1], a["stride"][1], a["padding"][1], a["dilation"][1])):
            raise ValueError("dy {} is not what a convolution of {} gives".format(in_shapes[0],
                                                                                a["input_shape"]))
        return a["input_shape"]

    def params(self, in_shapes, a):
        f = in_shapes[0][0]
        c = a["input_shape"][0] // a["groups"]
        return OrderedDict(weight=((f, c) + a["kernel"], ("he_normal", "fan_out"), True))

    def flops(self, in_shapes, out, a):
        return 2 * _prod(in_shapes[0]) * (a["input_shape"][0] // a["groups"]) * \
            a["kernel"][0] * a["kernel"][1]


@register
class DenseInputGrad(_InputGrad):
    """The gradient of ``dense`` with respect to its input: dy (..., units) -> dy W (..., in)."""
    name = "dense_input_grad"
    tied = ("weight",)
    required = ("in_features",)

    def infer_shape(self, in_shapes, a):
        return tuple(in_shapes[0][:-1]) + (a["in_features"],)

    def params(self, in_shapes, a):
        return OrderedDict(weight=((in_shapes[0][-1], a["in_features"]), ("zeros",), True))

    def flops(self, in_shapes, out, a):
        return 2 * _prod(out) * in_shapes[0][-1]


@register
class ReluGrad(OpDef):
    """inputs dy and x, the ReLU's input or output (both are positive at the same places):
    dy where x > 0, else 0."""
    name = "relu_grad"

    def infer_shape(self, in_shapes, a):
        if len(in_shapes) != 2 or in_shapes[0] != in_shapes[1]:
            raise ValueError("relu_grad needs dy and x of one shape, got {}".format(in_shapes))
        return in_shapes[0]


@register
class ChannelLayerNormInputGrad(_InputGrad):
    """inputs dy and the forward input x, gamma shared with the forward node:
    dx = (g - mean(g) - xhat mean(g xhat)) / sqrt(var + eps), g = gamma_c dy, means over the
    example's elements (the closed form of the normalisation's Jacobian)."""
    name = "channel_layernorm_input_grad"
    tied = ("gamma",)
    defaults = {"eps": 1e-5}

    def infer_shape(self, in_shapes, a):
        if len(in_shapes) != 2 or in_shapes[0] != in_shapes[1] or len(in_shapes[0]) != 3:
            raise ValueError("needs dy and x of one (C, H, W) shape, got {}".format(in_shapes))
        return in_shapes[0]

    def params(self, in_shapes, a):
        return OrderedDict(gamma=((in_shapes[0][0],), ("ones",), True))

    def flops(self, in_shapes, out, a):
        return 12 * _prod(out)
