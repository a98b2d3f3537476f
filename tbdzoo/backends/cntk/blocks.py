"""The spec's tree of blocks (tbdzoo/spec/tree.py) as CNTK block functions: the model as a
CNTK user builds one with ``cntk.layers``.

Every block of the tree (``layer1.0``, a ``Bottleneck``) is a block function
(``cntk.as_block``) whose op name is the block's kind and whose name is its path; every
parametrised node is one too, named by its node name, with the op name of the
``cntk.layers`` layer it stands for ('Convolution2D', 'BatchNormalization', 'Dense', ...),
as ``cntk.layers`` builds its layers. Parameter-free nodes are the functions they compute,
named by their node names. Parameters keep their canonical names (``layer1.0.bn1.gamma``)
and layouts, so ``find_by_name`` finds a block, a layer or a parameter by the name
``get_weights`` uses, ``cntk.logging.graph.plot`` draws the blocks, and ``save`` /
``cntk.Function.load`` keep them.

The layers are built from the CNTK primitives of ops.py, not from ``cntk.layers`` itself:
its layers name their parameters ``W`` and ``b``, store a dense weight as (in, out), add
LayerNormalization's epsilon to the standard deviation, order an LSTM's gates (i, c~, f, o)
with one bias, and create BatchNorm's sample count themselves, none of which is the spec's
layer (ops.py); the blocks are what CNTK's own layers are, with the spec's
numerics. CNTK inlines a block's graph when it compiles a function: a training step takes
the same time with blocks as with the same nodes unwrapped (ResNet-50 and the Transformer,
paired steps on the CPU).

A block's inside is built on placeholders (one per value it reads from outside, named by
that value and of its shape), so its activations are values of the block's own graph: a
top-level block's outputs are outputs of the model (``cntk.combine([block.outputs[0]])``),
and :func:`reach` lifts an inner block's or node's output out to the model's inputs.
Valid Python 3.6.
"""
from . import framework  # noqa: F401  (first: CNTK imported quietly)

# isort: split
from collections import OrderedDict

import cntk as C
from cntk.logging import graph as cntk_graph

from ...errors import UnknownNameError
from ...spec import tree as _tree

# The op names of cntk.layers' own block functions, for the spec's layers that have one;
# any other layer is named by the CamelCase of its op.
LAYER_KINDS = {
    "conv2d": "Convolution2D", "batchnorm": "BatchNormalization", "dense": "Dense",
    "embedding": "Embedding", "layernorm": "LayerNormalization", "lstm": "LSTM", "gru": "GRU",
    "multi_head_attention": "AttentionModel", "additive_attention": "AttentionModel",
}


def layer_kind(op):
    return LAYER_KINDS.get(op) or "".join(w[:1].upper() + w[1:] for w in op.split("_"))


class Builder:
    """Builds a graph's values as blocks. ``node(node, values)`` makes one node's CNTK value
    from the values it reads (the model's op dispatch); ``inputs`` are the graph's input
    variables."""

    def __init__(self, graph, node, inputs):
        self.graph, self.node, self.inputs = graph, node, inputs
        self.root = _tree.build_tree(graph)
        self.applications = _tree.applications(graph, self.root)

    # -- the root ------------------------------------------------------------------------
    def top_steps(self):
        """The root's steps over the whole graph, in graph order: ('block', child) where a
        top-level block's first node is, ('application', prefix) where a callable second
        use of a block begins, ('node', name) for a node of the root itself or of an
        application that must run node by node."""
        steps, seen = [], set()
        for node in self.graph.nodes.values():
            first = node.name.split(".")[0]
            if _tree.in_application(node.name):
                application = self.applications.get(first)
                if application is not None and application.callable:
                    if first not in seen:
                        seen.add(first)
                        steps.append(("application", first))
                    continue
                steps.append(("node", node.name))
            elif first != node.name and first in self.root.children:
                if first not in seen:
                    seen.add(first)
                    steps.append(("block", first))
            else:
                steps.append(("node", node.name))
        return steps

    def _reads_and_gives(self, step):
        kind, name = step
        if kind == "block":
            child = self.root.children[name]
            return child.inputs, child.outputs
        if kind == "application":
            application = self.applications[name]
            return application.inputs, list(application.outputs.values())
        return self.graph.nodes[name].inputs, [name]

    def values(self, wanted=None):
        """{name: CNTK variable} of the graph's inputs and of the root's steps that the values
        ``wanted`` read (every step when None), built as blocks."""
        steps = self.top_steps()
        if wanted is not None:
            needed, kept = set(wanted), []
            for step in reversed(steps):
                reads, gives = self._reads_and_gives(step)
                if any(g in needed for g in gives):
                    kept.append(step)
                    needed.update(reads)
            steps = list(reversed(kept))
        values = OrderedDict(self.inputs)
        for kind, name in steps:
            if kind == "block":
                values.update(self.block(self.root.children[name], values))
            elif kind == "application":
                application = self.applications[name]
                outer = dict(zip(application.block_inputs,
                                 (values[i] for i in application.inputs)))
                given = self.block(self.root.find(application.block), outer, name)
                values.update((application.outputs[o], v) for o, v in given.items())
            else:
                values[name] = self._step(self.graph.nodes[name], values)
        return values

    # -- blocks and layers ---------------------------------------------------------------
    def block(self, block, outer, name=None):
        """Block ``block`` as one block function reading ``outer[i]`` for each of its inputs;
        {output name: variable}. ``name`` names a second use of it (``critic@fake``)."""
        placeholders = _placeholders(block.inputs, outer)
        values = dict(placeholders)
        for step in block.steps:
            if step.kind == "block":
                values.update(self.block(block.children[step.path], values))
            else:
                values[step.node] = self._step(self.graph.nodes[step.node], values)
        return _wrap([values[o] for o in block.outputs], block.outputs, placeholders, outer,
                     block.kind, block.name if name is None else name)

    def _step(self, node, values):
        """A layer as a block function of its own; a parameter-free node as its function,
        named by the node."""
        if not self.graph.param_names(node):
            out = self.node(node, values)
            _name(out, node.name, [values[i] for i in node.inputs])
            return out
        placeholders = _placeholders(node.inputs, values)
        out = self.node(node, placeholders)
        return _wrap([out], [node.name], placeholders, values, layer_kind(node.op),
                     node.name)[node.name]


def _placeholders(names, outer):
    """One placeholder per distinct value read, of its shape and dynamic axes, named by it."""
    out = OrderedDict()
    for n in names:
        if n not in out:
            v = outer[n]
            out[n] = C.placeholder(shape=v.shape, dynamic_axes=v.dynamic_axes, name=n)
    return out


def _wrap(outputs, names, placeholders, outer, kind, instance):
    """The block function ``kind`` named ``instance`` over ``outputs`` (built on
    ``placeholders``), bound to the outer values; {name: its output}."""
    seen, inner = set(), []
    for v, n in zip(outputs, names):
        # a block's output must be made inside it, and combine takes a variable once
        if v.is_placeholder or v in seen:
            v = C.alias(v, name=n).output
        seen.add(v)
        inner.append(v)
    composite = C.combine(inner) if len(inner) > 1 else C.as_composite(inner[0].owner)
    bound = [(p, outer[n]) for n, p in placeholders.items()]
    function = C.as_block(composite, bound, kind, instance)
    return OrderedDict(zip(names, function.outputs))


def _name(value, name, inputs):
    """Name the function that made ``value`` after its node, unless it is one of the node's
    inputs (an identity returns its input) or already named."""
    if isinstance(value, C.Function):
        value = value.output
    if not value.is_output or any(value == i for i in inputs) or value.owner.name:
        return
    value.owner.name = name


# -- reading a built model -------------------------------------------------------------------
def blocks(function, depth=-1):
    """The block functions of ``function`` (layers included), outermost first."""
    return cntk_graph.depth_first_search(
        function, lambda f: isinstance(f, C.Function) and f.is_block, depth=depth)


def find_block(function, path):
    """The block function named ``path`` in ``function``, at any depth; KeyError if none."""
    for f in blocks(function):
        if f.name == path:
            return f
    raise UnknownNameError("block of " + (function.name or "this function"), path,
                           [f.name for f in blocks(function) if f.name])


def callable_block(function, path, names=None):
    """Block ``path`` of ``function`` as a function of its own, with the model's parameters:
    its arguments are new input variables, one per value the block reads, in the block's
    order and named by ``names`` (else by the values they stand for), so
    ``callable_block(m, 'layer1.0').eval({...})`` runs the block alone and
    ``callable_block(m, 'layer1.0')(x)`` applies it to ``x``."""
    block = find_block(function, path)
    mapping = list(block.block_arguments_mapping)
    if names is not None and len(names) != len(mapping):
        raise ValueError("block {!r} reads {} values, not {} ({})".format(
            path, len(mapping), len(names), ", ".join(names)))
    substitutions = {}
    for i, (placeholder, outer) in enumerate(mapping):
        substitutions[placeholder] = C.input_variable(
            placeholder.shape, placeholder.dtype, dynamic_axes=placeholder.dynamic_axes,
            name=names[i] if names is not None else outer.name or placeholder.name)
    return C.as_composite(block.block_root).clone(C.CloneMethod.share, substitutions)


def reach(function, path):
    """The outputs of the block, layer or node ``path`` of ``function`` as a function of
    ``function``'s own arguments (the model's inputs), however deep it sits; its
    parameters are the model's own. A top-level one needs no help
    (``cntk.combine(list(find_by_name(path).outputs))``); one inside a block lives in the
    block's graph, on its placeholders, and is lifted out block by block."""
    chain = _chain(function, path)
    if chain is None:
        raise UnknownNameError("block, layer or node of " + (function.name or "this function"),
                               path, [f.name for f in blocks(function) if f.name])
    lifted = C.combine(list(chain[-1].outputs))
    for block in reversed(chain[:-1]):
        lifted = lifted.clone(C.CloneMethod.share, dict(block.block_arguments_mapping))
    return lifted


def _chain(scope, path):
    """[the blocks that enclose ``path``, outermost first, then the function named ``path``]
    in the graph of ``scope``, or None."""
    here = list(blocks(scope, depth=0))
    for f in here:
        if f.name == path:
            return [f]
    named = scope.find_by_name(path, depth=0)
    if isinstance(named, C.Function):
        return [named]
    for f in here:
        if f.name and path.startswith(f.name + "."):
            inner = _chain(C.as_composite(f.block_root), path)
            if inner is not None:
                return [f] + inner
    return None
