"""Keras source of a model: ``keras.layers`` in one Layer class per block kind, NHWC images.

Writes text only (TensorFlow is not imported here): tbdzoo/export/ plans the classes, this
module says what each layer and op is in Keras, with the formulas of this backend's ops.py
(images NHWC inside and at the model's boundary, flattening in the spec's (C, H, W) order,
max-pool padding that never wins, BatchNorm momentum as Keras counts it: the weight of the old
statistics). Written so far: convolutional and dense layers, BatchNorm and the image ops; a
model with other layers (attention, recurrent, normalisations of its own) is refused, naming
the op.
"""
from collections import OrderedDict

from ...errors import UnsupportedOpError
from ...export.code import (
    Lines,
    forward_statements,
    is_lit,
    lit,
    literal,
    member_expr,
    member_ref,
    members_in_order,
    params_in_call_order,
    value,
)
from ...export.plan import Slot

FRAMEWORK = "Keras"
EXTENSION = ".py"

_TYPES = {"conv2d": "layers.Conv2D", "dense": "layers.Dense",
          "batchnorm": "layers.BatchNormalization"}
_OPS = ("relu", "add", "maxpool2d", "avgpool2d", "global_avgpool", "flatten", "dropout",
        "concat", "tanh", "scale")


def _pair(v):
    v = tuple(v)
    return v[0] if len(v) == 2 and v[0] == v[1] else v


def _refuse(node):
    raise UnsupportedOpError("the Keras source writer does not write op {!r} ({}) yet; export "
                             "this model to PyTorch or MXNet".format(node.op, node.name))


def _same_pads(size, kernel, stride, dilation):
    """TensorFlow's 'SAME' pads of one axis (the odd pixel after), as the backend's ops.py
    picks them: a convolution whose pads are these runs as 'SAME'."""
    effective = dilation * (kernel - 1) + 1
    out = -(-size // stride)
    total = max((out - 1) * stride + effective - size, 0)
    return (total // 2, total - total // 2)


def layer_type(graph, node):
    if node.op not in _TYPES or (node.op == "batchnorm" and (
            not node.attrs["track_running_stats"] or len(graph.shape_of(node.inputs[0])) != 3)):
        _refuse(node)
    if node.op == "conv2d" and node.attrs["groups"] != 1:
        _refuse(node)
    return _TYPES[node.op]


def layer_slots(graph, node):
    layer_type(graph, node)
    a, s = node.attrs, OrderedDict()
    if node.op == "conv2d":
        (t, b), (left, r) = a["padding"]
        _, h, w = graph.shape_of(node.inputs[0])
        same = tuple(_same_pads(size, k, st, d) for size, k, st, d in zip(
            (h, w), a["kernel"], a["stride"], a["dilation"]))
        zero = a["padding"] == ((0, 0), (0, 0))
        s["filters"] = Slot(a["filters"], "channels")
        s["kernel_size"] = Slot(_pair(a["kernel"]), "kernel_size")
        s["strides"] = Slot(_pair(a["stride"]), "stride")
        s["padding"] = Slot("same" if not zero and same == tuple(a["padding"]) else "valid",
                            "padding_mode")
        s["dilation_rate"] = Slot(_pair(a["dilation"]), "dilation")
        s["use_bias"] = Slot(a["use_bias"], "bias")
        s["pad"] = Slot(((0, 0), (0, 0)) if s["padding"].value == "same" else
                        ((t, b), (left, r)), "padding", call=True)
    elif node.op == "dense":
        s["units"] = Slot(a["units"], "channels")
        s["use_bias"] = Slot(a["use_bias"], "bias")
    else:
        s["momentum"] = Slot(1.0 - a["momentum"], "momentum")
        s["epsilon"] = Slot(a["eps"], "eps")
    return s


def op_slots(graph, node):
    if node.op not in _OPS:
        _refuse(node)
    out = OrderedDict((k, Slot(v, k, call=True)) for k, v in sorted(node.attrs.items())
                      if k != "shared")
    out["rank"] = Slot(len(graph.shape_of(node.inputs[0])), "rank", call=True)
    if node.op == "flatten":
        out["in_shape"] = Slot(tuple(graph.shape_of(node.inputs[0])), "in_shape", call=True)
    return out


_DEFAULTS = {"strides": 1, "padding": "valid", "dilation_rate": 1, "use_bias": True}


def _constructor(member):
    v = member.values
    if member.op == "conv2d":
        parts = [value(v["filters"]), value(v["kernel_size"])]
        for k in ("strides", "padding", "dilation_rate", "use_bias"):
            if not (is_lit(v[k]) and lit(v[k]) == _DEFAULTS[k]):
                parts.append("{}={}".format(k, value(v[k])))
    elif member.op == "dense":
        parts = [value(v["units"])]
        if not (is_lit(v["use_bias"]) and lit(v["use_bias"])):
            parts.append("use_bias={}".format(value(v["use_bias"])))
    else:
        parts = ["momentum={}".format(value(v["momentum"])),
                 "epsilon={}".format(value(v["epsilon"]))]
    return "{}({})".format(member.type, ", ".join(parts))


def _layer_call(cls, member, ins, training):
    ref = member_ref(cls, member.path)
    if member.op == "conv2d":
        pad = member.values["pad"]
        if is_lit(pad) and lit(pad) == ((0, 0), (0, 0)):
            return "{}({})".format(ref, ins[0])
        return "{}(pad({}, {}))".format(ref, ins[0], value(pad, True))
    if member.op == "batchnorm":
        return "{}({}, training=training)".format(ref, ins[0])
    return "{}({})".format(ref, ", ".join(ins))


def _member_expr(member, depth=0):
    """The expression building ``member``."""
    return member_expr(member, _constructor, "keras.Sequential([", "])", "*[{} for _ in range({})]", depth)


def _axis(axis, rank):
    """The NHWC tensor's axis of the spec's example ``axis`` (rank: the example's axes)."""
    if rank == 3:
        return {0: 3, 1: 1, 2: 2}[axis]
    return axis + 1


def _op(step, helpers):
    op, v, ins = step.op, step.values, step.ins

    def need_lit(*names):
        for n in names:
            if not is_lit(v[n]):
                raise UnsupportedOpError(
                    "the Keras source writer needs {} of op {!r} to be the same in every "
                    "instance of a class".format(n, op))
        return [lit(v[n]) for n in names]
    x = ins[0] if ins else None
    if op == "relu":
        return "ops.relu({})".format(x)
    if op == "add":
        return " + ".join(ins)
    if op == "maxpool2d":
        kernel, stride, padding = need_lit("kernel", "stride", "padding")
        if padding != ((0, 0), (0, 0)):
            x = "pad({}, {}, -np.inf)".format(x, literal(padding))
        return "ops.max_pool({}, {}, {}, padding=\"valid\")".format(
            x, literal(tuple(kernel)), literal(tuple(stride)))
    if op == "avgpool2d":
        kernel, stride, padding, include = need_lit("kernel", "stride", "padding",
                                                    "count_include_pad")
        if padding == ((0, 0), (0, 0)) or include:
            if padding != ((0, 0), (0, 0)):
                x = "pad({}, {})".format(x, literal(padding))
            return "ops.average_pool({}, {}, {}, padding=\"valid\")".format(
                x, literal(tuple(kernel)), literal(tuple(stride)))
        helpers.add("avg_pool")
        return "avg_pool({}, {}, {}, {})".format(x, literal(tuple(kernel)),
                                                literal(tuple(stride)), literal(padding))
    if op == "global_avgpool":
        return "ops.mean({}, axis=(1, 2))".format(x)
    if op == "flatten":
        shape, = need_lit("in_shape")
        size = 1
        for d in shape:
            size *= d
        if len(shape) == 3:
            x = "ops.transpose({}, (0, 3, 1, 2))".format(x)   # the spec's (C, H, W) order
        return "ops.reshape({}, (-1, {}))".format(x, size)
    if op == "dropout":
        helpers.add("dropout")
        return "dropout({}, {}, training)".format(x, value(v["rate"], True))
    if op == "concat":
        axis, rank = need_lit("axis", "rank")
        return "ops.concatenate([{}], axis={})".format(", ".join(ins), _axis(axis, rank))
    if op == "tanh":
        return "ops.tanh({})".format(x)
    if op == "scale":
        return "{} * {}".format(x, value(v["factor"], True))
    raise UnsupportedOpError("the Keras source writer does not write op {!r} yet".format(op))


_HELPERS = OrderedDict()
_HELPERS["avg_pool"] = '''
def avg_pool(x, pool_size, strides, padding):
    """Average pooling where each window divides by its cells inside the input."""
    ones = ops.ones_like(x[:1, :, :, :1])
    return ops.divide(ops.average_pool(pad(x, padding), pool_size, strides, padding="valid"),
                      ops.average_pool(pad(ones, padding), pool_size, strides, padding="valid"))
'''
_HELPERS["dropout"] = '''
def dropout(x, rate, training):
    """Inverted dropout in training, the identity otherwise."""
    return keras.random.dropout(x, rate) if training and rate else x
'''

_LOAD = '''
def _find(model, path):
    """The layer at tbdzoo's module path (``layer1.0.conv1``)."""
    layer = model
    for part in path.split("."):
        layer = layer.layers[int(part)] if part.isdigit() else getattr(layer, part)
    return layer


def _native(layer, suffix, array):
    """The Keras variable of tbdzoo's parameter ``suffix`` and the array in its layout."""
    if isinstance(layer, layers.Conv2D):
        return (layer.kernel, array.transpose(2, 3, 1, 0)) if suffix == "weight" else \\
            (layer.bias, array)
    if isinstance(layer, layers.Dense):
        return (layer.kernel, array.T) if suffix == "weight" else (layer.bias, array)
    names = {"gamma": "gamma", "beta": "beta", "running_mean": "moving_mean",
             "running_var": "moving_variance"}
    return getattr(layer, names[suffix]), array


def load(model, path):
    """Loads tbdzoo's canonical weights file (.npz) into ``model`` (built first by a call on
    zeros): convolution kernels OIHW -> HWIO, dense weights (out, in) -> kernels (in, out)."""
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files if k != "__manifest__"}
    model(*[np.zeros((1,) + shape, dtype) for shape, dtype in INPUT_SHAPES])
    for part, shapes in PARTS:   # parts call() does not reach are built on their own
        _find(model, part)(*[np.zeros((1,) + shape, dtype) for shape, dtype in shapes])
    done = set()
    for name, array in arrays.items():
        layer_path, _, suffix = name.rpartition(".")
        variable, value = _native(_find(model, layer_path), suffix, array)
        variable.assign(value)
        done.add(id(variable))
    missing = [v.path for v in model.weights if id(v) not in done]
    if missing:
        raise ValueError("{} does not fit this model: nothing in the file for {}".format(
            path, missing))
    return model
'''


def _write_class(cls, lines, plan):
    if cls.base == "list":
        raise UnsupportedOpError("the Keras source writer has no numbered block classes yet "
                                 "({})".format(cls.name))
    base = "keras.Model" if cls is plan.root else "layers.Layer"
    lines.add("class {}({}):".format(cls.name, base)).indent()
    lines.add('"""' + _class_doc(cls, plan) + '"""').add()
    params = params_in_call_order(cls)
    lines.add("def __init__({}):".format(", ".join(["self"] + [p.name for p in params]
                                                  + ["**kwargs"])))
    lines.indent().add("super().__init__(**kwargs)")
    for p in params:
        if p.call:
            lines.add("self.{0} = {0}".format(p.name))
    for m in members_in_order(cls):
        if "." in m.path:
            raise UnsupportedOpError("the Keras source writer does not attach a layer below "
                                     "another ({})".format(m.path))
        expr = _member_expr(m)
        if m.optional is not None:
            expr = "{} if {} else None".format(expr, m.optional.name)
        lines.add("{} = {}".format(member_ref(cls, m.path), expr))
    if cls.ties:
        raise UnsupportedOpError("the Keras source writer does not share parameters yet")
    lines.dedent().add()
    lines.add("def call({}):".format(", ".join(["self"] + cls.inputs + ["training=None"])))
    lines.indent()
    helpers = set()

    def render(step):
        if step.kind == "op":
            return _op(step, helpers)
        member = cls.members[step.path]
        if step.kind == "layer":
            return _layer_call(cls, member, step.ins, True)
        return "{}({}, training=training)".format(member_ref(cls, step.path),
                                                  ", ".join(step.ins))
    forward_statements(cls, lines, render)
    lines.dedent().dedent().add().add()


def _nhwc(shape):
    return tuple(shape[1:]) + (shape[0],) if len(shape) == 3 else tuple(shape)


def _class_doc(cls, plan):
    if cls is plan.root:
        g = plan.graph
        out = ["{}, as tbdzoo's specification builds it.".format(cls.kind), "",
               "Called with ({}):".format(", ".join(cls.inputs))]
        for name, node in zip(cls.inputs, cls.input_nodes):
            inp = g.inputs[node]
            out.append("  {}: {} of shape (N, {}){}".format(
                name, inp.dtype, ", ".join(str(d) for d in _nhwc(inp.shape)),
                " (NHWC)" if len(inp.shape) == 3 else "").replace(", )", ")"))
        out.append("and returns {} of shape (N, {}).".format(
            g.output, ", ".join(str(d) for d in _nhwc(g.shape_of(g.output)))).replace(", )", ")"))
        for path, block in getattr(plan, "parts", ()):
            out.append("Also a part of the model, not called by call(): self.{}({}) -> {}."
                       .format(path, ", ".join(block.inputs), ", ".join(block.outputs)))
        return "\n".join(out) + "\n"
    text = "{} ({} in this model).".format(cls.kind, cls.count) if cls.count > 1 else \
        "{}.".format(cls.kind)
    return text + ("\n\n" + cls.note + ".\n" if cls.note else "")


def write(plan, model_name, config, version):
    root = plan.root
    g = plan.graph
    lines = Lines()
    lines.add('"""{} in Keras, written by tbdzoo {} from its specification (config {!r}).'.format(
        model_name, version, config))
    lines.add("")
    lines.add("    model = build(\"{}.npz\")   # {}() with tbdzoo's weights file loaded".format(
        model_name, root.name))
    lines.add("    out = model({})   # images NHWC".format(", ".join(root.inputs)))
    lines.add("")
    lines.add("Layers sit where tbdzoo's parameter names say (``layer1.0.conv1`` is")
    lines.add("model.layer1.layers[0].conv1). Needs only Keras (with TensorFlow) and NumPy.")
    lines.add('"""')
    lines.add("import keras")
    lines.add("import numpy as np")
    lines.add("from keras import layers, ops").add()
    shapes = tuple((_nhwc(g.inputs[n].shape), g.inputs[n].dtype) for n in root.input_nodes)
    lines.add("INPUTS = {}".format(literal(tuple(root.inputs))))
    lines.add("INPUT_SHAPES = {}  # per example, with dtypes".format(literal(shapes)))
    parts = tuple((path, tuple((_nhwc(g.shape_of(i)), g.dtype_of(i)) for i in block.inputs))
                  for path, block in getattr(plan, "parts", ()))
    lines.add("PARTS = {}  # members call() does not reach, with their inputs".format(
        literal(parts))).add().add()
    lines.add('''def pad(x, padding, value=0.0):
    """Pads ((top, bottom), (left, right)) around an NHWC image."""
    (top, bottom), (left, right) = padding
    return ops.pad(x, [[0, 0], [top, bottom], [left, right], [0, 0]], constant_values=value)''')
    lines.add().add()
    helpers = set()
    for cls in plan.classes:
        for step in cls.steps:
            if step.kind == "op":
                _op(step, helpers)
    for name, text in _HELPERS.items():
        if name in helpers:
            lines.add(text.strip("\n")).add().add()
    for cls in plan.classes:
        _write_class(cls, lines, plan)
    lines.add(_LOAD.strip("\n")).add().add()
    lines.add("def build(weights=None):").indent()
    lines.add('"""A new {}, with the weights of tbdzoo\'s .npz file ``weights`` if given."""'.format(
        root.name))
    lines.add("model = {}()".format(root.name))
    lines.add("return load(model, weights) if weights is not None else model").dedent()
    return lines.text()
