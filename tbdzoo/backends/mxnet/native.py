"""The native model: a tree of Gluon ``HybridBlock``s built from the spec's blocks
(tbdzoo/spec/tree.py), with Gluon's own layers at the canonical module paths.

- Every block of the tree is a HybridBlock whose class is named by its kind (``ResNet``,
  ``Bottleneck``, ``InceptionA``, ``EncoderLayer``...): one class per kind, made once by
  :func:`block_class`. A block whose children ``0 .. n-1`` feed one another is a
  :class:`Sequential` (Gluon's HybridSequential: ``net.layer1[0]``).
- Layers are Gluon's: ``nn.Conv2D`` (:class:`PaddedConv2D` where the padding is asymmetric),
  ``nn.BatchNorm``, ``nn.Dense`` (``flatten=False``: the spec's dense acts on the last axis),
  ``nn.Embedding`` (:class:`ScaledEmbedding` where the spec scales it), ``nn.LayerNorm``.
  Layers Gluon has no block for (multi-head attention, LSTM and GRU with one bias per gate and
  lengths, sequence batch norm, channel layer norm, additive attention, frozen batch norm) are
  :class:`NodeLayer` subclasses named after the op, running the backend's op function.
- Parameter names are the canonical ones: a layer at path ``layer1.0.conv1`` has the Gluon
  prefix ``layer1.0.conv1.``, so its weight is ``layer1.0.conv1.weight`` in
  ``collect_params()``, in ``save_parameters`` files and in ``export``; Gluon's BatchNorm,
  Dense, Conv2D, Embedding and LayerNorm use the canonical suffixes themselves (``gamma``,
  ``beta``, ``running_mean``, ``running_var``, ``weight``, ``bias``). A parameter shared by
  two layers (a tied embedding) is one Parameter under its first name.
- A block's forward runs its steps in order: layers and child blocks looked up among its
  children when it runs (replacing ``net.fc`` changes the model), parameter-free nodes as
  functions of ``F``. Constant tables a node reads (a positional encoding, a pooling's
  divisors) are Parameters named ``__constant__.<key>`` that never train.
- The root's forward takes the inputs the output reads, in the order of ``input_names``, in
  the canonical layouts (images NCHW, sequences (N, T, ...)), and returns the output node.
"""
from . import framework  # noqa: F401  (first: numpy.bool for mxnet 1.9.1, quiet import)

# isort: split
import contextlib
import warnings

from mxnet import gluon
from mxnet.gluon import nn

from ...spec import tree as spec_tree
from ..common import pooling
from . import ops

CONSTANT_PREFIX = "__constant__."  # canonical names never start with an underscore

_KINDS = {}


def block_class(kind):
    """The HybridBlock subclass for blocks of ``kind`` (one class per kind)."""
    if kind not in _KINDS:
        _KINDS[kind] = type(kind, (GraphBlock,), {
            "__module__": __name__,
            "__doc__": "A {} block of a tbdzoo model (see GraphBlock).".format(kind)})
    return _KINDS[kind]


def child(block, path):
    """The block at dotted ``path`` below ``block`` (looked up among registered children, so a
    replaced child is the one found)."""
    if path in block._children:
        return block._children[path]
    for part in path.split("."):
        block = block._children[part]
    return block


def _register(block, name, param):
    """Registers ``param`` as the parameter ``name`` of ``block`` (what ``hybrid_forward``
    receives) and in its ParameterDict under the Parameter's own (canonical) name."""
    block._reg_params[name] = param
    object.__setattr__(block, name, param)
    block.params._params[param.name] = param


def _adopt(layer, params):
    """Gives a Gluon layer the model's Parameters in place of the ones it made."""
    if set(layer._reg_params) != set(params):
        raise ValueError("{} has parameters {}, the node {}".format(
            type(layer).__name__, sorted(layer._reg_params), sorted(params)))
    for name, param in params.items():
        layer.params._params.pop(layer._reg_params[name].name, None)
        _register(layer, name, param)
    return layer


class _Constants:
    """Registers the constant tables a node reads and hands them to the op function."""

    def _hold_constants(self, keys, parameters):
        self._constant_keys = list(keys)
        for key in self._constant_keys:
            _register(self, CONSTANT_PREFIX + key, parameters[CONSTANT_PREFIX + key])

    def _context(self, params, node_name, in_shapes):
        ctx = ops.GraphContext({k: params[CONSTANT_PREFIX + k] for k in self._constant_keys},
                               False)
        ctx.node_name, ctx.in_shapes = node_name, in_shapes
        return ctx


# -- layers ----------------------------------------------------------------------------------
class PaddedConv2D(nn.Conv2D):
    """Gluon's Conv2D after an explicit, possibly asymmetric, zero padding
    ``((top, bottom), (left, right))``, which Convolution's own padding cannot express."""

    def __init__(self, pads, **kwargs):
        super().__init__(padding=(0, 0), **kwargs)
        self.pads = tuple(tuple(p) for p in pads)

    def hybrid_forward(self, F, x, weight, bias=None):
        return super().hybrid_forward(F, ops._pad(F, x, self.pads), weight, bias)

    def __repr__(self):
        return super().__repr__()[:-1] + ", pads={})".format(self.pads)


class ScaledEmbedding(nn.Embedding):
    """Gluon's Embedding, its output times a constant (a Transformer's sqrt(d_model))."""

    def __init__(self, input_dim, output_dim, scale, **kwargs):
        super().__init__(input_dim, output_dim, **kwargs)
        self.scale = scale

    def hybrid_forward(self, F, x, weight):
        return super().hybrid_forward(F, x, weight) * self.scale

    def __repr__(self):
        return super().__repr__()[:-1] + ", scale={:g})".format(self.scale)


_LAYER_NAMES = {"lstm": "LSTM", "gru": "GRU", "multi_head_attention": "MultiHeadAttention",
                "sequence_batchnorm": "SequenceBatchNorm", "batchnorm": "BatchStatisticsNorm",
                "channel_layernorm": "ChannelLayerNorm", "frozen_batchnorm": "FrozenBatchNorm"}
_LAYER_CLASSES = {}


class NodeLayer(gluon.HybridBlock, _Constants):
    """A layer Gluon has no block for: the backend's op function on its inputs (in the node's
    order) and its canonical parameters, held under their suffixes (``W_q``, ``l0.fw.w_r``)."""

    def __init__(self, graph, node, parameters, prefix):
        super().__init__(prefix=prefix)
        self.op, self.attrs, self.node_name = node.op, dict(node.attrs), node.name
        self._fn = getattr(ops, node.op)
        self._in_shapes = [tuple(graph.shape_of(i)) for i in node.inputs]
        for suffix, full in graph.param_names(node).items():
            _register(self, suffix, parameters[full])
        self._hold_constants(ops.constants_for(node, self._in_shapes, training=False),
                             parameters)

    def hybrid_forward(self, F, *inputs, **params):
        ctx = self._context(params, self.node_name, self._in_shapes)
        own = {k: v for k, v in params.items() if not k.startswith(CONSTANT_PREFIX)}
        return self._fn(F, list(inputs), own, self.attrs, ctx)

    def __repr__(self):
        attrs = ", ".join("{}={}".format(k, v) for k, v in sorted(self.attrs.items())
                          if isinstance(v, (bool, int, float, str)))
        children = "".join("\n  ({}): {}".format(k, gluon.block._indent(repr(b), 2))
                           for k, b in self._children.items())
        if not children:
            return "{}({})".format(type(self).__name__, attrs)
        return "{}({},{}\n)".format(type(self).__name__, attrs, children)


_SHOWING = {}


def _showing_children(layer):
    """Gives a Gluon layer that holds another layer (Deep Speech 2's ``fc.bn`` below ``fc``) a
    class of the same name whose printout lists that layer too."""
    cls = type(layer)
    if isinstance(layer, NodeLayer) or cls in _SHOWING.values():
        return
    if cls not in _SHOWING:
        def __repr__(self):
            children = "".join("\n  ({}): {}".format(k, gluon.block._indent(repr(b), 2))
                               for k, b in self._children.items())
            return cls.__repr__(self)[:-1] + "," + children + "\n)"
        _SHOWING[cls] = type(cls.__name__, (cls,), {"__module__": cls.__module__,
                                                    "__repr__": __repr__})
    layer.__class__ = _SHOWING[cls]


def _node_layer_class(op):
    if op not in _LAYER_CLASSES:
        name = _LAYER_NAMES.get(op) or "".join(w.capitalize() for w in op.split("_"))
        _LAYER_CLASSES[op] = type(name, (NodeLayer,), {
            "__module__": __name__, "__doc__": "The spec's {} as a Gluon layer.".format(op)})
    return _LAYER_CLASSES[op]


def make_layer(graph, node, parameters, prefix):
    """The Gluon layer of a parametrised node, holding the model's Parameters."""
    a, params = node.attrs, graph.param_names(node)
    own = {suffix: parameters[full] for suffix, full in params.items()}
    in_shape = tuple(graph.shape_of(node.inputs[0])) if node.inputs else ()
    if node.op == "conv2d" and len(node.inputs) == 1:
        kw = dict(channels=a["filters"], kernel_size=tuple(a["kernel"]),
                  strides=tuple(a["stride"]), dilation=tuple(a["dilation"]),
                  groups=a["groups"], use_bias="bias" in params, in_channels=in_shape[0],
                  prefix=prefix)
        symmetric = pooling.symmetric(a["padding"])
        if symmetric is None:
            return _adopt(PaddedConv2D(a["padding"], **kw), own)
        return _adopt(nn.Conv2D(padding=tuple(symmetric), **kw), own)
    if node.op == "batchnorm" and a["track_running_stats"] and len(in_shape) >= 1 and \
            set(params) == {"gamma", "beta", "running_mean", "running_var"}:
        return _adopt(nn.BatchNorm(axis=1, momentum=1.0 - a["momentum"], epsilon=a["eps"],
                                   in_channels=in_shape[0], prefix=prefix), own)
    if node.op == "dense" and len(node.inputs) == 1:
        return _adopt(nn.Dense(a["units"], use_bias="bias" in params, flatten=False,
                               in_units=in_shape[-1], prefix=prefix), own)
    if node.op == "embedding" and len(node.inputs) == 1:
        if a["scale"] != 1.0:
            return _adopt(ScaledEmbedding(a["vocab"], a["dim"], a["scale"], prefix=prefix), own)
        return _adopt(nn.Embedding(a["vocab"], a["dim"], prefix=prefix), own)
    if node.op == "layernorm" and set(params) == {"gamma", "beta"}:
        return _adopt(nn.LayerNorm(axis=-1, epsilon=a["eps"], in_channels=in_shape[-1],
                                   prefix=prefix), own)
    return _node_layer_class(node.op)(graph, node, parameters, prefix)


# -- blocks ----------------------------------------------------------------------------------
class _Step:
    __slots__ = ("kind", "path", "fn", "attrs", "node_name", "in_shapes", "inputs", "outputs")

    def __init__(self, graph, step):
        self.kind, self.path = step.kind, step.path
        self.inputs, self.outputs = list(step.inputs), list(step.outputs)
        self.fn = self.attrs = self.node_name = self.in_shapes = None
        if step.kind == "op":
            node = graph.nodes[step.node]
            self.fn, self.attrs, self.node_name = getattr(ops, node.op), node.attrs, node.name
            self.in_shapes = [tuple(graph.shape_of(i)) for i in node.inputs]


class Sequential(nn.HybridSequential):
    """A block of children ``0 .. n-1``, each feeding the next (Gluon's HybridSequential)."""


class GraphBlock(gluon.HybridBlock, _Constants):
    """A block of the spec's tree (subclassed per kind by :func:`block_class`). ``input_names``
    are the values its forward takes, in order; ``output_names`` what it returns (one value,
    or a tuple in this order)."""

    def __init__(self, block, graph, parameters, prefix):
        super().__init__(prefix=prefix)
        self.input_names, self.output_names = list(block.inputs), list(block.outputs)
        self._steps = [_Step(graph, s) for s in block.steps]
        self._cache_warned = False
        layers = {path: make_layer(graph, graph.nodes[name], parameters, name + ".")
                  for path, name in block.layers.items()}
        below = {}  # layers below another layer (Deep Speech 2's rnn.0.bn below rnn.0)
        for path in layers:
            parent, _, local = path.rpartition(".")
            if parent in layers:
                below[path] = (parent, local)
        for step in block.steps:  # registered in the order the forward runs them
            if step.kind == "layer" and step.path not in below:
                setattr(self, step.path, layers[step.path])
            elif step.kind == "block":
                setattr(self, step.path, build_block(block.children[step.path], graph,
                                                     parameters))
        for path, layer in layers.items():
            if path in below:
                parent, local = below[path]
                _showing_children(layers[parent])
                setattr(layers[parent], local, layer)
            elif path not in self._children:
                setattr(self, path, layer)
        for local, sub in block.children.items():  # not called by forward: an auxiliary head
            if local not in self._children:
                setattr(self, local, build_block(sub, graph, parameters))
        keys = []
        for node_name in (s.node for s in block.steps if s.kind == "op"):
            node = graph.nodes[node_name]
            in_shapes = [tuple(graph.shape_of(i)) for i in node.inputs]
            keys += [k for k in ops.constants_for(node, in_shapes, training=False)
                     if k not in keys]
        self._hold_constants(keys, parameters)

    def hybrid_forward(self, F, *inputs, **params):
        values = dict(zip(self.input_names, inputs))
        for step in self._steps:
            args = [values[i] for i in step.inputs]
            if step.kind == "op":
                ctx = self._context(params, step.node_name, step.in_shapes)
                values[step.outputs[0]] = step.fn(F, args, {}, step.attrs, ctx)
                continue
            out = child(self, step.path)(*args)
            if len(step.outputs) == 1:
                values[step.outputs[0]] = out
            else:
                values.update(zip(step.outputs, out))
        out = [values[o] for o in self.output_names]
        return out[0] if len(out) == 1 else tuple(out)

    def forward(self, *args):
        """As Gluon's; the graph's first build does not warn of the parameters of children the
        forward does not call (an auxiliary head, a GAN's critic): they are trained by the
        model's training program, not by this forward."""
        if self._cache_warned or not self._active:
            return super().forward(*args)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Parameter .* is not used by any computation")
            out = super().forward(*args)
        self._cache_warned = self._cached_op is not None
        return out

    def _infer_attrs(self, infer_fn, attr, *args):
        """Gluon's shape (or type) inference for a layer made after the fact (a new head),
        which sets only the Parameters this forward reads: Gluon's own sets every Parameter
        of every child, also of children the forward does not call."""
        inputs, out = self._get_graph(*args)
        given = [a for a in gluon.block._flatten(args, "input")[0] if a is not None]
        arg_attrs, _, aux_attrs = getattr(out, infer_fn)(
            **{i.name: getattr(a, attr) for i, a in zip(inputs, given)})
        if arg_attrs is None:
            raise ValueError("cannot infer the {} of {}'s parameters from inputs {}".format(
                attr, type(self).__name__, [getattr(a, attr) for a in given]))
        found = dict(zip(out.list_arguments(), arg_attrs))
        found.update(zip(out.list_auxiliary_states(), aux_attrs))
        for param in self.collect_params().values():
            if param.name in found:
                setattr(param, attr, found[param.name])

    def hybridize(self, active=True, **kwargs):
        self._cache_warned = False
        super().hybridize(active, **kwargs)

    def _clear_cached_op(self):
        self._cache_warned = False
        super()._clear_cached_op()


def build_block(block, graph, parameters):
    """The Gluon block of the tree's ``block`` (a :class:`Sequential` or its kind's class)."""
    prefix = block.name + "." if block.name else ""
    if block.kind == spec_tree.SEQUENTIAL:
        seq = Sequential(prefix=prefix)
        for step in block.steps:
            if step.kind == "layer":
                seq.add(make_layer(graph, graph.nodes[step.node], parameters, step.node + "."))
            else:
                seq.add(build_block(block.children[step.path], graph, parameters))
        return seq
    return block_class(block.kind)(block, graph, parameters, prefix)


def build(graph, parameters):
    """The root block of ``graph`` over ``parameters`` (canonical name -> Parameter, with the
    constant tables under ``__constant__.``)."""
    return build_block(spec_tree.build_tree(graph), graph, parameters)


def blocks(block):
    """``block`` and every block below it."""
    yield block
    for sub in block._children.values():
        yield from blocks(sub)


def has_hooks(block):
    return any(b._forward_hooks or b._forward_pre_hooks for b in blocks(block))


@contextlib.contextmanager
def imperative(block):
    """Runs ``block`` block by block (each child called, its hooks firing) while keeping the
    hybridized graphs for the next call."""
    every = list(blocks(block))
    active = [b._active for b in every]
    for b in every:
        b._active = False
    try:
        yield block
    finally:
        for b, a in zip(every, active):
            b._active = a


def structure(block, path=""):
    """(parent, local name, child, path) for every block below ``block``, as built."""
    out = []
    for name, sub in block._children.items():
        where = path + "." + name if path else name
        out.append((block, name, sub, where))
        out.extend(structure(sub, where))
    return out


def replaced(built):
    """Paths of the children of ``built`` (a :func:`structure`) no longer in their place."""
    return [where for parent, name, sub, where in built if parent._children.get(name) is not sub]


def value_calls(tree, names, inputs):
    """How to compute the graph values ``names`` by calling children of the root: a list of
    (child name, its inputs, its outputs) in order, from the graph inputs ``inputs``; None when
    one of them is made by no child (a node of the root itself)."""
    producer = {o: sub for sub in tree.children.values() for o in sub.outputs}
    calls, have = [], set(inputs)

    def reach(value):
        if value in have:
            return True
        sub = producer.get(value)
        if sub is None or not all(reach(i) for i in sub.inputs):
            return False
        calls.append((sub.local, list(sub.inputs), list(sub.outputs)))
        have.update(sub.outputs)
        return True

    return calls if all(reach(n) for n in names) else None


def run_calls(net, calls, values):
    """Runs ``calls`` (from :func:`value_calls`) on ``net``'s children; ``values`` by name."""
    values = dict(values)
    for local, inputs, outputs in calls:
        out = child(net, local)(*[values[i] for i in inputs])
        if len(outputs) == 1:
            values[outputs[0]] = out
        else:
            values.update(zip(outputs, out))
    return values
