"""The spec graph as a tree of Flax NNX modules (tbdzoo/spec/tree.py).

Each block of the spec is an ``nnx.Module`` of a class named by its kind (``Bottleneck``,
``EncoderLayer``; ``Sequential`` for chained children ``0 .. n-1``), each layer a Flax layer
(tbdzoo/backends/jax/layers.py), at the paths of the canonical names: ``model.layer1`` is a
block, ``getattr(model.layer1, "0").conv1`` an ``nnx.Conv`` and ``nnx.state(model)`` holds
``layer1/0/conv1/kernel``. ``print(model)`` shows the tree; Flax's own serialisation
(``nnx.state``, ``nnx.update``, Orbax) saves and restores it.

A block's ``__call__`` runs its steps in order: its layers and child blocks, looked up by name
when called (so a replaced child takes part), and its parameter-free nodes as the functions of
ops.py, in the pass's context (``ops.running``: training or inference, dropout keys); called
outside one, a block infers. The root computes any set of graph values (``values``): the
objectives of a training program, the reads of a targets step.
"""
from . import framework  # noqa: F401  (first: JAX imported quietly, full float32 precision)

# isort: split
import contextlib
from collections import OrderedDict

import jax
import numpy as np
from flax import nnx

from ...spec import tree as spec_tree
from . import layers, ops


class _Static:
    """What a block knows of the spec (kept as a static attribute: NNX copies it as it is,
    into the module's graph definition, and never looks inside)."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


def lookup(module, path):
    """The module at dotted ``path`` below ``module``."""
    for part in path.split(".") if path else ():
        module = getattr(module, part)
    return module


def _run_node(module, graph, node, inputs, ctx, path, owner=None):
    """One node: its op's function, with its layer (at ``path`` below ``module``; None for a
    node with no layer of its own, such as WGAN-GP's derivative nodes) and the canonical values
    of the parameters it reads from other layers (from the root of the pass, ``ctx.root``).
    ``owner``: the full name of the layer at ``path`` (default ``path``)."""
    layer = None
    ctx.shared = {}
    if spec_tree.is_layer(graph, node):
        if path is not None:
            layer = lookup(module, path)
        shared = layers.shared_params(graph, node, path if owner is None else owner)
        if shared:
            if ctx.root is None:
                raise ValueError("node {!r} reads parameters of other layers ({}): call the "
                                 "whole model, or its values(), not this block alone".format(
                                     node.name, ", ".join(shared.values())))
            ctx.shared = {s: ctx.root.canonical(full) for s, full in shared.items()}
    ctx.node = node.name
    return getattr(ops, node.op)(list(inputs), layer, node.attrs, ctx)


class Block(nnx.Module):
    """A block of the spec tree: ``__call__(*inputs)`` in the order of ``input_names``;
    returns its one output, or a tuple in the order of ``output_names``."""

    def _setup(self, graph, spec_block):
        self._spec = _Static(graph=graph, name=spec_block.name, inputs=list(spec_block.inputs),
                             outputs=list(spec_block.outputs), steps=list(spec_block.steps))

    @property
    def input_names(self):
        return list(self._spec.inputs)

    @property
    def output_names(self):
        return list(self._spec.outputs)

    def __call__(self, *inputs):
        spec = self._spec
        if len(inputs) != len(spec.inputs):
            raise TypeError("{} takes {} input(s), {}; got {}".format(
                type(self).__name__, len(spec.inputs), ", ".join(spec.inputs), len(inputs)))
        values = dict(zip(spec.inputs, inputs))
        ctx = ops.current()
        for step in spec.steps:
            args = [values[i] for i in step.inputs]
            if step.kind == "block":
                out = getattr(self, step.path)(*args)
            else:
                node = spec.graph.nodes[step.node]
                out = _run_node(self, spec.graph, node, args, ctx, step.path, node.name)
            if len(step.outputs) == 1:
                values[step.outputs[0]] = out
            else:
                values.update(zip(step.outputs, out))
        if len(spec.outputs) == 1:
            return values[spec.outputs[0]]
        return tuple(values[o] for o in spec.outputs)


_CLASSES = {}


def block_class(kind, base=None):
    """The module class of a block kind, made once per kind."""
    base = base or Block
    key = (kind, base)
    if key not in _CLASSES:
        # ``__call__`` in the class's own dict: ``nnx.capture(..., method_outputs=...)``
        # records the outputs of the methods a class defines itself, not inherited ones.
        _CLASSES[key] = type(kind, (base,), {
            "__module__": __name__,
            "__doc__": "A ``{}`` block of a tbdzoo model (tbdzoo/backends/jax/native.py)."
                       .format(kind),
            "__call__": base.__call__})
    return _CLASSES[key]


class NativeModel(Block):
    """The root block, which is also what the backend trains: besides ``__call__`` (the
    graph's output from its feature inputs) it computes any set of graph values (``values``)
    and maps canonical parameter names to its variables (``variable``, ``canonical``)."""

    def __call__(self, *inputs):
        with _rooted(self):
            return Block.__call__(self, *inputs)

    # -- parameters by canonical name ---------------------------------------------------------
    def variable(self, name):
        """(the nnx.Variable holding canonical ``name``, to_native, to_canonical)."""
        owner, attr, to_native, to_canonical = layers.location(self._spec.graph, name)
        return lookup(self, owner + "." + attr), to_native, to_canonical

    def canonical(self, name):
        """The canonical value of parameter ``name`` (traceable)."""
        var, _, to_canonical = self.variable(name)
        return to_canonical(var.value)

    def state_path(self, name):
        """The path of canonical ``name``'s variable in ``nnx.state(model)``."""
        owner, attr, _, _ = layers.location(self._spec.graph, name)
        return tuple(owner.split(".")) + tuple(attr.split("."))

    # -- any graph values ---------------------------------------------------------------------
    def values(self, inputs, outputs):
        """{name: value} for graph values ``outputs`` from the named ``inputs`` (graph inputs,
        and node values computed before), in the context of the current pass."""
        with _rooted(self) as ctx:
            return self._values(ctx, inputs, outputs)

    def _values(self, ctx, inputs, outputs):
        graph = self._spec.graph
        given = frozenset(k for k in inputs if k in graph.nodes)
        key = (tuple(outputs), given)
        plans = self._spec.plans
        if key not in plans:
            plans[key] = self._plan(tuple(outputs), given)
        values = dict(inputs)
        for kind, what, args, outs in plans[key]:
            xs = [values[i] for i in args]
            if kind == "block":
                out = lookup(self, what)(*xs)
            else:
                node, path = what
                out = _run_node(self, graph, node, xs, ctx, path)
            if len(outs) == 1:
                values[outs[0]] = out
            else:
                values.update(zip(outs, out))
        return OrderedDict((o, values[o]) for o in outputs)

    def _plan(self, outputs, given):
        """Units in graph order, each needed by ``outputs``: a root step (block call, layer,
        op), a call of a block for an application of it, or one node alone (the nodes of an
        application whose inner values are read), its layer that of the block it applies;
        every node alone when a value inside a block is asked for."""
        graph, root, apps = self._spec.graph, self._spec.tree, self._spec.apps
        order = {n: k for k, n in enumerate(graph.nodes)}
        units, visible = [], set()
        for step in root.all_steps:
            if step.kind == "block":
                block = root.children[step.path]
                first = min(order[n] for n in graph.nodes if n.startswith(block.name + "."))
                units.append((first, ("block", step.path, step.inputs, step.outputs)))
            else:
                node = graph.nodes[step.node]
                units.append((order[node.name], ("node", (node, step.path), step.inputs,
                                                 step.outputs)))
            visible.update(step.outputs)
        called = set()
        for app in apps.values():
            if app.callable:
                outs = list(app.outputs.values())
                units.append((order[app.nodes[0]], ("block", app.block, app.inputs, outs)))
                visible.update(outs)
                called.update(app.nodes)
        for node in graph.nodes.values():
            if spec_tree.in_application(node.name) and node.name not in called:
                units.append((order[node.name], ("node", (node, _layer_path(graph, node.name)),
                                                 node.inputs, [node.name])))
                visible.add(node.name)
        if not set(outputs) | set(given) <= visible | set(graph.inputs):
            units = [(order[n.name], ("node", (n, _layer_path(graph, n.name)), n.inputs,
                                      [n.name])) for n in graph.nodes.values()]
        units.sort(key=lambda u: u[0])
        needed, kept = set(outputs), []
        for _, unit in reversed(units):
            _, _, args, outs = unit
            if any(o in needed and o not in given for o in outs):
                kept.append(unit)
                needed.update(args)
        return list(reversed(kept))


@contextlib.contextmanager
def _rooted(model):
    """The pass's context with ``model`` as its root (an inference pass when none is open)."""
    ctx = ops.opened()
    if ctx is None:
        with ops.running(ops.Context()) as ctx:
            ctx.root = model
            yield ctx
        return
    if ctx.root is None:
        ctx.root = model
    yield ctx


def _layer_path(graph, name):
    """The path of a node's layer: its name; for an application's node (``critic@fake.conv1``)
    the layer of the block it applies (``critic.conv1``); None for a node inside an
    application that is no node of the block (a derivative node), which has no layer."""
    if not spec_tree.in_application(name):
        return name
    first, dot, rest = name.partition(".")
    if "@" in first:
        applied = first.split("@")[0] + dot + rest
        if applied in graph.nodes:
            return applied
    return None


def _module_for(graph, block, made):
    """The module of ``block`` and, recursively, its children; ``made``: node -> layer."""
    module = block_class(block.kind)()
    _populate(module, graph, block, made)
    module._setup(graph, block)
    return module


def _populate(module, graph, block, made):
    """Children and layers set in graph order; a layer below a layer (Deep Speech 2's
    ``rnn.0.bn``) after the layer it sits in."""
    nested = []
    for step in block.all_steps or block.steps:
        if step.kind == "block":
            setattr(module, step.path, _module_for(graph, block.children[step.path], made))
        elif step.kind == "layer":
            if "." in step.path:
                nested.append(step)
            else:
                setattr(module, step.path, made[step.node])
    for step in sorted(nested, key=lambda s: s.path.count(".")):
        parent_path, _, leaf = step.path.rpartition(".")
        setattr(lookup(module, parent_path), leaf, made[step.node])


def build(graph, weights, seed=0, device=None):
    """The model of ``graph`` holding ``weights`` (canonical name -> array)."""
    root = spec_tree.build_tree(graph)
    apps = spec_tree.applications(graph, root)
    made = OrderedDict()
    for block in root.walk():
        for node_name in block.layers.values():
            # abstract variables (shapes only): Flax's initialisers would compile a program
            # per shape, and the canonical weights replace every value below
            made[node_name] = nnx.eval_shape(lambda n=node_name: layers.make(
                graph, graph.nodes[n], nnx.Rngs(seed)))
    model = block_class(root.kind, NativeModel)()
    _populate(model, graph, root, made)
    model._setup(graph, root)
    model._spec.tree, model._spec.apps, model._spec.plans = root, apps, {}
    set_canonical(model, weights, device)
    return model


def set_canonical(model, weights, device=None):
    """Assign canonical arrays to the variables holding them (on ``device``: default JAX's)."""
    for name, value in weights.items():
        var, to_native, _ = model.variable(name)
        var.value = jax.device_put(to_native(np.asarray(value, np.float32)), device)
