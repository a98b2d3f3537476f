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
        raise ValueError("unknown op {!r}; known ops: {}".format(op, ", ".join(_REGISTRY))) from None


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


class OpDef:
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
    """Token ids (T,) to vectors (T, dim), multiplied by ``scale`` (sqrt(d_model) in the
    Transformer). ``init``: an initialiser tuple of the table (TF NMT's ('uniform', 0.1)); left
    out, N(0, dim^-1/2), and the attribute stays out of the spec (its hash unchanged)."""
    name = "embedding"
    required = ("vocab", "dim")
    defaults = {"scale": 1.0, "init": None}

    def canonical(self, a):
        if a["init"] is None:
            del a["init"]
        else:
            init = a["init"]
            a["init"] = _check_init(tuple(init) if isinstance(init, list) else init,
                                    "embedding init")
        return a

    def infer_shape(self, in_shapes, a):
        return tuple(in_shapes[0]) + (a["dim"],)

    def params(self, in_shapes, a):
        init = a.get("init", ("normal", a["dim"] ** -0.5))
        return OrderedDict(weight=((a["vocab"], a["dim"]), init, True))

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
        _f, ho, wo = in_shapes[0]
        _c, h, w = a["input_shape"]
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


# -- recurrent models: Seq2Seq and Deep Speech 2 ----------------------------------------------
# Sequences are (T, D) per example with a per-example length () int32 input, 1 <= length <= T;
# positions t >= length are padding and every op below writes exactly 0 there.

def _check_lengths(shape, what="lengths"):
    if tuple(shape) != ():
        raise ValueError("{} must be one int32 per example (shape ()), got {}".format(what, shape))


def _check_int32(dtype, what="lengths"):
    if dtype != "int32":
        raise ValueError("{} must be int32, got {}".format(what, dtype))


def _check_init(init, what):
    if not isinstance(init, tuple) or not init or not isinstance(init[0], str):
        raise ValueError("{} must be an initialiser tuple such as ('uniform', 0.1), not {!r}"
                         .format(what, init))
    return init


class _Recurrent(OpDef):
    """A (multi-layer, optionally bidirectional) recurrent layer over (T, D) with lengths.

    Directions of stacked layers are concatenated (as cuDNN does); ``merge`` says how the two
    directions of the last layer combine. The backward direction reads each sequence reversed
    within its own length and writes its outputs back in forward time order."""
    gates = ()
    biases = ()
    required = ("units",)
    defaults = {"num_layers": 1, "bidirectional": False, "merge": "concat", "init": None}

    def canonical(self, a):
        for key in ("units", "num_layers"):
            if not isinstance(a[key], int) or isinstance(a[key], bool) or a[key] < 1:
                raise ValueError("{} {} must be an integer >= 1, not {!r}".format(
                    self.name, key, a[key]))
        if a["merge"] not in ("concat", "sum"):
            raise ValueError("{} merge must be 'concat' or 'sum', not {!r}".format(
                self.name, a["merge"]))
        if not isinstance(a["bidirectional"], bool):
            raise ValueError("{} bidirectional must be True or False".format(self.name))
        if a["init"] is None:  # PyTorch's default: U(-1/sqrt(H), 1/sqrt(H)) for every tensor
            a["init"] = ("uniform", 1.0 / a["units"] ** 0.5)
        a["init"] = _check_init(tuple(a["init"]), "{} init".format(self.name))
        return a

    @staticmethod
    def directions(a):
        return ("fw", "bw") if a["bidirectional"] else ("fw",)

    def infer_shape(self, in_shapes, a):
        if len(in_shapes) != 2:
            raise ValueError("{} takes inputs [x, lengths], got {} input(s)".format(
                self.name, len(in_shapes)))
        if len(in_shapes[0]) != 2:
            raise ValueError("x must be a sequence (T, D), got {}".format(in_shapes[0]))
        _check_lengths(in_shapes[1])
        dirs = len(self.directions(a))
        return (in_shapes[0][0], a["units"] * (dirs if a["merge"] == "concat" else 1))

    def out_dtype(self, in_dtypes, a):
        _check_int32(in_dtypes[1])
        return "float32"

    def layer_inputs(self, in_shapes, a):
        """D_l for each layer: D, then H * dirs."""
        h, dirs = a["units"], len(self.directions(a))
        return [in_shapes[0][1]] + [h * dirs] * (a["num_layers"] - 1)

    def bias_init(self, bias, a):
        return a["init"]

    def params(self, in_shapes, a):
        h, p = a["units"], OrderedDict()
        for layer, d_in in enumerate(self.layer_inputs(in_shapes, a)):
            for d in self.directions(a):
                prefix = "l{}.{}.".format(layer, d)
                for g in self.gates:
                    p[prefix + "w_" + g] = ((h, d_in), a["init"], True)
                for g in self.gates:
                    p[prefix + "u_" + g] = ((h, h), a["init"], True)
                for b in self.biases:
                    p[prefix + b] = ((h,), self.bias_init(b, a), True)
        return p

    elementwise = 0  # element-wise FLOPs per unit and step

    def flops(self, in_shapes, out, a):
        t, h, gates = in_shapes[0][0], a["units"], len(self.gates)
        dirs = len(self.directions(a))
        total = sum(dirs * t * (2 * gates * h * (d_in + h) + self.elementwise * h)
                    for d_in in self.layer_inputs(in_shapes, a))
        if dirs == 2 and a["merge"] == "sum":
            total += t * h
        return total


@register
class LSTM(_Recurrent):
    """Gates i, f, g, o; c' = f c + i g, h' = o tanh(c'); one bias per gate. ``forget_bias`` is
    added to b_f's initial value only (TF NMT's forget_bias=1.0 on U(-0.1, 0.1) is
    init=('uniform', 0.1), forget_bias=1.0): the cell itself adds no constant."""
    name = "lstm"
    gates = ("i", "f", "g", "o")
    biases = ("b_i", "b_f", "b_g", "b_o")
    defaults = dict(_Recurrent.defaults, forget_bias=0.0)
    elementwise = 13  # 4 bias adds, 4 activations, c' (3), tanh(c'), h'

    def canonical(self, a):
        a = _Recurrent.canonical(self, a)
        if not isinstance(a["forget_bias"], (int, float)) or isinstance(a["forget_bias"], bool):
            raise ValueError("lstm forget_bias must be a number, not {!r}".format(a["forget_bias"]))
        a["forget_bias"] = float(a["forget_bias"])
        return a

    def bias_init(self, bias, a):
        if bias == "b_f" and a["forget_bias"]:
            return ("shifted", a["forget_bias"], a["init"])
        return a["init"]


@register
class GRU(_Recurrent):
    """Gates r, z, n with the reset applied after the recurrent matmul (cuDNN, PyTorch, MXNet,
    Keras reset_after=True): n = tanh(W_n x + b_in + r (U_n h + b_hn)), h' = (1 - z) n + z h."""
    name = "gru"
    gates = ("r", "z", "n")
    biases = ("b_r", "b_z", "b_in", "b_hn")
    elementwise = 12  # 4 bias adds, 3 activations, r (.), h' (3), one more add


@register
class AdditiveAttention(OpDef):
    """Bahdanau attention without biases (TF's BahdanauAttention, normalize=False).

    inputs query (T, Dq), memory (S, Dm), memory_lengths (); e[t, s] = v . tanh(W_q q_t +
    W_m m_s), -1e9 for s >= memory_length (multi_head_attention's mask constant), softmax over
    s; output c_t = sum_s alpha[t, s] m_s, (T, Dm). ``init`` None is PyTorch dense's
    U(-1/sqrt(fan_in), 1/sqrt(fan_in)) per tensor (v's fan-in is A)."""
    name = "additive_attention"
    required = ("units",)
    defaults = {"init": None}

    def canonical(self, a):
        if not isinstance(a["units"], int) or isinstance(a["units"], bool) or a["units"] < 1:
            raise ValueError("additive_attention units must be an integer >= 1, not {!r}".format(
                a["units"]))
        if a["init"] is not None:
            a["init"] = _check_init(tuple(a["init"]), "additive_attention init")
        return a

    def infer_shape(self, in_shapes, a):
        if len(in_shapes) != 3:
            raise ValueError("additive_attention takes inputs [query, memory, memory_lengths], "
                             "got {} input(s)".format(len(in_shapes)))
        q, m, lengths = in_shapes
        if len(q) != 2 or len(m) != 2:
            raise ValueError("query {} and memory {} must be sequences (T, D)".format(q, m))
        _check_lengths(lengths, "memory_lengths")
        return (q[0], m[1])

    def out_dtype(self, in_dtypes, a):
        _check_int32(in_dtypes[2], "memory_lengths")
        return "float32"

    def params(self, in_shapes, a):
        (_, dq), (_, dm), units = in_shapes[0], in_shapes[1], a["units"]

        def init(fan_in):
            return a["init"] if a["init"] is not None else ("uniform", 1.0 / fan_in ** 0.5)
        return OrderedDict([("w_query", ((units, dq), init(dq), True)),
                            ("w_memory", ((units, dm), init(dm), True)),
                            ("v", ((units,), init(units), True))])

    def flops(self, in_shapes, out, a):
        (t, dq), (s, dm), units = in_shapes[0], in_shapes[1], a["units"]
        projections = 2 * units * (t * dq + s * dm)
        scores = t * s * (units + units + 2 * units)  # add, tanh, dot with v
        return projections + scores + 5 * t * s + 2 * t * s * dm


@register
class SequenceBatchNorm(BatchNorm):
    """inputs [x (T, D), lengths]: normalises features (the last axis) with statistics over the
    batch and the valid time steps only; padded positions give 0, in training and inference.
    Attributes, parameters and running statistics as ``batchnorm`` (running_var unbiased over
    the n valid positions)."""
    name = "sequence_batchnorm"

    def infer_shape(self, in_shapes, a):
        if len(in_shapes) != 2:
            raise ValueError("sequence_batchnorm takes inputs [x, lengths], got {} input(s)"
                             .format(len(in_shapes)))
        if len(in_shapes[0]) != 2:
            raise ValueError("x must be a sequence (T, D), got {}".format(in_shapes[0]))
        _check_lengths(in_shapes[1])
        return in_shapes[0]

    def out_dtype(self, in_dtypes, a):
        _check_int32(in_dtypes[1])
        return "float32"

    def params(self, in_shapes, a):
        return BatchNorm.params(self, [(in_shapes[0][-1],)], a)


@register
class ClippedReLU(OpDef):
    """min(max(x, 0), ceiling) (Deep Speech 2 clips at 20); gradient 1 strictly inside
    (0, ceiling), 0 elsewhere, at both ends included."""
    name = "clipped_relu"
    defaults = {"ceiling": 20.0}

    def canonical(self, a):
        if not isinstance(a["ceiling"], (int, float)) or isinstance(a["ceiling"], bool) or \
                not a["ceiling"] > 0:
            raise ValueError("clipped_relu ceiling must be a number > 0, not {!r}".format(
                a["ceiling"]))
        a["ceiling"] = float(a["ceiling"])
        return a


@register
class Transpose(OpDef):
    """Permutes the example's axes (the batch axis stays first): perm (1, 0, 2) turns
    (C, T, F) into (T, C, F)."""
    name = "transpose"
    required = ("perm",)

    def canonical(self, a):
        a["perm"] = tuple(a["perm"])
        return a

    def infer_shape(self, in_shapes, a):
        shape, perm = in_shapes[0], a["perm"]
        if sorted(perm) != list(range(len(shape))):
            raise ValueError("perm {} is not a permutation of the example axes 0..{} of {}"
                             " (the batch axis is not counted)".format(perm, len(shape) - 1, shape))
        return tuple(shape[i] for i in perm)

    def flops(self, in_shapes, out, a):
        return 0


@register
class LengthsAfterConv(OpDef):
    """The valid length after a convolution along one axis: floor((L + before + after -
    dilation (kernel - 1) - 1) / stride) + 1, at least 1. int32 in and out, no gradient."""
    name = "lengths_after_conv"
    required = ("kernel",)
    defaults = {"stride": 1, "padding": (0, 0), "dilation": 1}

    def canonical(self, a):
        for key in ("kernel", "stride", "dilation"):
            if not isinstance(a[key], int) or isinstance(a[key], bool) or a[key] < 1:
                raise ValueError("lengths_after_conv {} must be an integer >= 1 (one axis), not "
                                 "{!r}".format(key, a[key]))
        pad = a["padding"]
        pad = (pad, pad) if isinstance(pad, int) else tuple(pad)
        if len(pad) != 2 or any(not isinstance(p, int) or p < 0 for p in pad):
            raise ValueError("lengths_after_conv padding must be (before, after) of one axis, "
                             "not {!r}".format(a["padding"]))
        a["padding"] = pad
        return a

    def infer_shape(self, in_shapes, a):
        _check_lengths(in_shapes[0])
        return ()

    def out_dtype(self, in_dtypes, a):
        _check_int32(in_dtypes[0])
        return "int32"

    def flops(self, in_shapes, out, a):
        return 0


def length_after_conv(length, a):
    """The formula of ``lengths_after_conv`` on one integer (or a NumPy int array)."""
    out = (length + a["padding"][0] + a["padding"][1] - a["dilation"] * (a["kernel"] - 1) - 1) \
        // a["stride"] + 1
    return max(out, 1) if isinstance(out, int) else out.clip(min=1)


# -- detection: Faster R-CNN's graph side ------------------------------------------------------
# Anchors, proposals, RoI sampling and RoIAlign's sample points are computed in NumPy and fed
# to the graph as inputs; the graph gathers, folds RoIs into the batch and normalises.

def _check_positive_pair(value, what):
    value = _pair(value)
    if len(value) != 2 or any(not isinstance(v, int) or isinstance(v, bool) or v < 1
                              for v in value):
        raise ValueError("{} must be one integer >= 1 or a pair of them, not {!r}".format(
            what, value))
    return value


@register
class RoIAlign(OpDef):
    """inputs features (C, H, W), indices int32 (R, S, 4), weights float32 (R, S, 4), with
    S = oh * ow * sr * sr samples per RoI ordered (oh, ow, sr_y, sr_x) flattened; output
    (R, C, oh, ow): out[r, c, i, j] = the mean over the sr * sr samples s of bin (i, j) of
    sum_k weights[r, s, k] * features[c].flat[indices[r, s, k]] (bilinear interpolation with
    its four taps and weights precomputed). Gathers within the example; differentiable with
    respect to the features only (a scatter-add backward)."""
    name = "roi_align"
    required = ("output_size",)
    defaults = {"sampling_ratio": 2}

    def canonical(self, a):
        a["output_size"] = _check_positive_pair(a["output_size"], "roi_align output_size")
        sr = a["sampling_ratio"]
        if not isinstance(sr, int) or isinstance(sr, bool) or sr < 1:
            raise ValueError("roi_align sampling_ratio must be an integer >= 1 (a fixed number "
                             "of samples per bin side), not {!r}".format(sr))
        return a

    @staticmethod
    def samples(a):
        return a["output_size"][0] * a["output_size"][1] * a["sampling_ratio"] ** 2

    def infer_shape(self, in_shapes, a):
        if len(in_shapes) != 3:
            raise ValueError("roi_align takes inputs [features, indices, weights], got {} "
                             "input(s)".format(len(in_shapes)))
        features, indices, weights = (tuple(s) for s in in_shapes)
        if len(features) != 3:
            raise ValueError("features must be an image (C, H, W), got {}".format(features))
        s = self.samples(a)
        if len(indices) != 3 or indices[1:] != (s, 4):
            raise ValueError("indices must be (R, {}, 4): output_size {} x sampling_ratio {}^2 "
                             "samples of 4 taps per RoI, got {}".format(
                                 s, a["output_size"], a["sampling_ratio"], indices))
        if weights != indices:
            raise ValueError("weights {} must have the indices' shape {}".format(weights, indices))
        return (indices[0], features[0]) + tuple(a["output_size"])

    def out_dtype(self, in_dtypes, a):
        _check_int32(in_dtypes[1], "roi_align indices")
        if in_dtypes[0] != "float32" or in_dtypes[2] != "float32":
            raise ValueError("roi_align features and weights must be float32, got {} and {}"
                             .format(in_dtypes[0], in_dtypes[2]))
        return "float32"

    def flops(self, in_shapes, out, a):
        return 2 * 4 * a["sampling_ratio"] ** 2 * _prod(out)  # a multiply-add per tap


@register
class ToBatch(OpDef):
    """Folds the example's first axis into the batch: (R, ...) per example -> (...) per
    example, a batch of N examples -> N * R, image-major (example n's rows r at n * R + r).
    Nodes after it run over the R rows as ordinary examples (a box head over RoIs). Keeps
    its input's dtype (labels fold alike)."""
    name = "to_batch"

    def infer_shape(self, in_shapes, a):
        if len(in_shapes) != 1 or len(in_shapes[0]) < 1:
            raise ValueError("to_batch takes one input with at least one axis, got {}".format(
                in_shapes))
        return tuple(in_shapes[0][1:])

    def out_dtype(self, in_dtypes, a):
        return in_dtypes[0]

    def flops(self, in_shapes, out, a):
        return 0


def rows_per_example(in_shapes, op):
    """How many rows of its output one row of ``op``'s input makes: R for to_batch, else 1."""
    return in_shapes[0][0] if op == "to_batch" else 1


@register
class FrozenBatchNorm(OpDef):
    """y = (x - running_mean) / sqrt(running_var + eps) * gamma + beta over axis 0 (channels),
    all four per-channel tensors non-trainable state (torchvision's FrozenBatchNorm2d, eps
    1e-5 there; 0 for old Caffe weights), the same in training and inference. Backends may
    fold it into a per-channel scale and shift computed exactly this way. ``gamma_init``: the
    value gamma starts (and, frozen, stays) at."""
    name = "frozen_batchnorm"
    defaults = {"eps": 1e-5, "gamma_init": 1.0}

    def canonical(self, a):
        for key in ("eps", "gamma_init"):
            value = a[key]
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ValueError("frozen_batchnorm {} must be a number >= 0, not {!r}".format(
                    key, value))
            a[key] = float(value)
        return a

    def params(self, in_shapes, a):
        c = (in_shapes[0][0],)
        return OrderedDict([("gamma", (c, ("constant", a["gamma_init"]), False)),
                            ("beta", (c, ("zeros",), False)),
                            ("running_mean", (c, ("zeros",), False)),
                            ("running_var", (c, ("ones",), False))])

    def flops(self, in_shapes, out, a):
        return 2 * _prod(out)  # one multiply-add per element after folding
