"""The spec graph as a tree of ``torch.nn`` modules (tbdzoo/spec/tree.py).

Each block of the spec is a module of a class named by its kind (``Bottleneck``,
``InceptionA``, ``EncoderLayer``; ``nn.Sequential`` for chained children ``0 .. n-1``), each
layer is a torch.nn layer (tbdzoo/backends/torch/layers.py), and the modules sit at the paths
of the canonical names, so ``model.layer1[0].conv1`` is an ``nn.Conv2d`` and ``state_dict()``
keys are the canonical names with PyTorch's own parameter names (``bn1.weight``).

A block's forward runs its steps in order: its layers and child blocks, looked up by name when
called (so a replaced child takes part and its hooks fire), and its parameter-free nodes as
functions. Every value is dropped after its last use in the block, and a ReLU or sum whose
input dies there and was not kept for backward overwrites it, as torchvision's in-place ReLUs
do, so the forward pass holds no more than a hand-written module would.
"""
from collections import OrderedDict

from torch import nn

from ...errors import UnsupportedOptionError
from ...spec import tree as spec_tree
from . import layers, ops, recurrent

# Ops whose output autograd never keeps for their own backward pass: a consumer may overwrite
# it once nothing else reads it.
_UNSAVED_OUTPUTS = ("batchnorm", "add", "frozen_batchnorm")

_CLASSES = {}


def block_class(kind):
    """The module class of a block kind, made once per kind."""
    if kind not in _CLASSES:
        _CLASSES[kind] = type(kind, (Block,), {
            "__module__": __name__,
            "__doc__": "A ``{}`` block of a tbdzoo model (tbdzoo/backends/torch/native.py)."
                       .format(kind)})
    return _CLASSES[kind]


def _may_overwrite(graph, node, dead, own):
    """relu and add may write into their first input when it dies here, is not read twice by
    this node, was made in this block (not handed in by its caller, who may read it again) and
    comes from an op that does not keep its output for backward."""
    first = node.inputs[0]
    return (node.op in ("relu", "add") and first in dead and first in own
            and node.inputs.count(first) == 1 and first in graph.nodes
            and graph.nodes[first].op in _UNSAVED_OUTPUTS)


class Block(nn.Module):
    """A block of the spec tree: ``forward(*inputs)`` in the order of ``input_names``; returns
    its one output, or a tuple in the order of ``output_names``."""

    def _setup(self, graph, spec_block, steps, outputs):
        self.input_names = list(spec_block.inputs)
        self.output_names = list(outputs)
        self._graph = graph
        self._steps = steps
        self._plan = self._make_plan()

    def _make_plan(self):
        graph, steps = self._graph, self._steps
        last_use = {}
        for step in steps:
            for i in step.inputs:
                last_use[i] = step
        own, plan = set(), []
        for step in steps:
            done = [i for i in dict.fromkeys(step.inputs) if last_use[i] is step
                    and i not in self.output_names]
            node = graph.nodes[step.node] if step.node else None
            if step.kind == "op":
                fn = getattr(ops, node.op + "_inplace" if _may_overwrite(
                    graph, node, done, own) else node.op)
                plan.append(("op", fn, step.inputs, step.outputs, node.attrs, done))
            else:
                plan.append(("call", step.path, step.inputs, step.outputs, None, done))
            own.update(step.outputs)
        return plan

    def forward(self, *inputs):
        if len(inputs) != len(self.input_names):
            raise TypeError("{}.forward takes {} input(s), {}; got {}".format(
                type(self).__name__, len(self.input_names), ", ".join(self.input_names),
                len(inputs)))
        values = dict(zip(self.input_names, inputs))
        self._run(values)
        if len(self.output_names) == 1:
            return values[self.output_names[0]]
        return tuple(values[o] for o in self.output_names)

    def _run(self, values):
        for kind, what, input_names, output_names, attrs, done in self._plan:
            args = [values[i] for i in input_names]
            if kind == "op":
                out = what(args, {}, attrs, self.training)
            else:
                out = self.get_submodule(what)(*args)
            if len(output_names) == 1:
                values[output_names[0]] = out
            else:
                values.update(zip(output_names, out))
            for i in done:
                del values[i]
        return values


class _Override:
    """A layer's forward replaced by ``fn`` over the layer's own parameters."""

    def __init__(self, fn, layer, node, graph):
        self.fn, self.layer, self.node = fn, layer, node
        self.params = {s: layers.attribute(node.op, s) for s in graph.param_names(node)}

    def __call__(self, *inputs):
        p = {s: getattr(self.layer, a) for s, a in self.params.items()}
        return self.fn(list(inputs), p, self.node.attrs, self.layer.training)


def _module_for(graph, block, weights, made):
    """The module of ``block`` and, recursively, its children; ``made``: node -> layer."""
    if block.kind == spec_tree.SEQUENTIAL and block.name:
        module = nn.Sequential()
        for step in block.steps:
            child = block.children.get(step.path)
            module.add_module(step.path, _module_for(graph, child, weights, made)
                              if child is not None else made[step.node])
        _add_nested(module, block, made)
        return module
    module = block_class(block.kind)()
    _populate(module, graph, block, weights, made)
    steps = block.steps
    module._setup(graph, block, steps, block.outputs)
    return module


def _populate(module, graph, block, weights, made):
    """Children and layers registered in graph order (as ``print`` then shows them); a
    layer below a layer (Deep Speech 2's ``rnn.0.bn``) after the layer it sits in."""
    nested = []
    for step in block.all_steps or block.steps:
        if step.kind == "block":
            module.add_module(step.path, _module_for(graph, block.children[step.path], weights,
                                                     made))
        elif step.kind == "layer":
            if "." in step.path:
                nested.append(step)
            else:
                module.add_module(step.path, made[step.node])
    for step in sorted(nested, key=lambda s: s.path.count(".")):
        parent_path, _, leaf = step.path.rpartition(".")
        module.get_submodule(parent_path).add_module(leaf, made[step.node])


def _add_nested(module, block, made):
    """Layers below a layer (``0.bn`` below ``0``) in a Sequential."""
    for path, node in block.layers.items():
        parent_path, _, leaf = path.rpartition(".")
        if parent_path:
            module.get_submodule(parent_path).add_module(leaf, made[node])


class NativeModel(Block):
    """The root block, which is also what the backend trains: besides ``forward`` it computes
    any set of graph values (``values``: a training program's objectives, a targets step's
    reads), and maps canonical parameter names to its tensors (``leaf``, ``tensor``)."""

    def _setup_root(self, graph, root, apps):
        self.graph = graph
        self._root = root
        self._apps = apps
        self._plans = {}

    # -- parameters by canonical name ----------------------------------------------------
    def _locate(self, name):
        """(owning layer, attribute) of canonical parameter ``name``, read at call time."""
        spec = self.graph.params()[name]
        node = self.graph.nodes[spec.owner]
        return self.get_submodule(spec.owner), layers.attribute(node.op, name[len(spec.owner) + 1:])

    def leaf(self, name):
        """(the tensor that holds canonical ``name``, the rows of it that are ``name``, or None
        when it is the whole tensor): a recurrent layer's per-gate tensors are row blocks of
        PyTorch's weight_ih / weight_hh / bias_ih / bias_hh."""
        owner = self.graph.params()[name].owner
        if self.graph.nodes[owner].op in recurrent.LAYOUT:
            holder = self.get_submodule(owner)
            native, rows = holder.canonical_rows(name[len(owner) + 1:])
            return getattr(holder, native), rows
        module, attribute = self._locate(name)
        return getattr(module, attribute), None

    def tensor(self, name):
        """The canonical tensor ``name`` (a view of its leaf for recurrent layers)."""
        leaf, rows = self.leaf(name)
        return leaf if rows is None else leaf[rows]

    def canonical(self, name, like_leaf):
        """The part of ``like_leaf`` (shaped as ``name``'s leaf: its gradient) that is ``name``."""
        rows = self.leaf(name)[1]
        return like_leaf if rows is None else like_leaf[rows]

    def leaves(self, names):
        """The distinct tensors holding the canonical ``names``, in their order: what
        optimizers update and gradients accumulate into."""
        out = OrderedDict()
        for n in names:
            leaf = self.leaf(n)[0]
            out.setdefault(id(leaf), leaf)
        return list(out.values())

    def absent_elements(self):
        """{parameter: its elements that are cuDNN's zero biases, not the spec's}."""
        out = OrderedDict()
        for module in self.modules():
            if isinstance(module, recurrent.RecurrentWeights):
                out.update(module.absent_elements())
        return out

    # -- any graph values ----------------------------------------------------------------
    def values(self, inputs, outputs):
        """{name: tensor} for graph values ``outputs`` (and the ``inputs`` given, which may
        include node values computed earlier) from the named ``inputs``."""
        given = tuple(k for k in inputs if k in self.graph.nodes)
        key = (tuple(outputs), given)
        if key not in self._plans:
            self._plans[key] = self._values_plan(tuple(outputs), frozenset(given))
        values = dict(inputs)
        for unit in self._plans[key]:
            unit(self, values)
        return values

    def _values_plan(self, outputs, given):
        """Units at the root in graph order, each needed by ``outputs``: a root step (block
        call, layer, op), a call of a block for an application of it, or one node run alone
        (the nodes of an application whose inner values are read, and the derivative nodes
        that read them), with its parameters from the layer that owns them."""
        graph = self.graph
        units = []   # (first node index, inputs, outputs, runner)
        order = {n: k for k, n in enumerate(graph.nodes)}
        visible = set()
        for step in self._root.all_steps:
            if step.kind == "block":
                block = self._root.children[step.path]
                first = min(order[n] for n in _members(graph, block.name))
                units.append((first, step.inputs, step.outputs, _CallBlock(step.path)))
            else:
                units.append((order[step.node], step.inputs, step.outputs,
                              _RunNode(graph.nodes[step.node], self)))
            visible.update(step.outputs)
        for app in self._apps.values():
            if app.callable:
                units.append((order[app.nodes[0]], app.inputs, list(app.outputs.values()),
                              _CallBlock(app.block, list(app.outputs.values()))))
                visible.update(app.outputs.values())
        called = set(n for a in self._apps.values() if a.callable for n in a.nodes)
        for node in graph.nodes.values():
            if spec_tree.in_application(node.name) and node.name not in called:
                units.append((order[node.name], node.inputs, [node.name], _RunNode(node, self)))
                visible.add(node.name)
        wanted = set(outputs) | set(given)
        if not wanted <= visible | set(graph.inputs):
            return self._flat_plan(outputs, given)
        units.sort(key=lambda u: u[0])
        return _with_drops(_scheduled(units, outputs, given), outputs)

    def _flat_plan(self, outputs, given):
        """Every node alone (a value inside a block was asked for), layers called as the
        modules at their paths."""
        graph = self.graph
        needed = set(outputs)
        for node in reversed(list(graph.nodes.values())):
            if node.name in needed and node.name not in given:
                needed.update(node.inputs)
        units = [(0, n.inputs, [n.name], _RunNode(n, self)) for n in graph.nodes.values()
                 if n.name in needed and n.name not in given]
        return _with_drops(_scheduled(units, outputs, given), outputs)

    def plan(self, outputs, given=()):
        """The units computing ``outputs`` (kept for callers that plan ahead)."""
        key = (tuple(outputs), tuple(given))
        if key not in self._plans:
            self._plans[key] = self._values_plan(tuple(outputs), frozenset(given))
        return self._plans[key]

    def set_op_overrides(self, overrides):
        """{op: function(inputs, params, attrs, training)} run instead of every layer of that
        op (data-parallel training's synchronised BatchNorm): each such layer's ``forward``
        becomes the function over its own parameters, so the layer stays where it is, with
        its parameters and hooks."""
        self.op_overrides = dict(overrides)
        for node in self.graph.nodes.values():
            if node.op in overrides and spec_tree.is_layer(self.graph, node) \
                    and not spec_tree.in_application(node.name):
                layer = self.get_submodule(node.name)
                layer.forward = _Override(overrides[node.op], layer, node, self.graph)
        self._plans.clear()

    op_overrides = {}


def _members(graph, prefix):
    return [n for n in graph.nodes if n.startswith(prefix + ".")]


class _CallBlock:
    def __init__(self, path, outputs=None):
        self.path, self.outputs = path, outputs

    def __call__(self, root, values, args, outputs):
        out = root.get_submodule(self.path)(*[values[i] for i in args])
        if len(outputs) == 1:
            values[outputs[0]] = out
        else:
            values.update(zip(outputs, out))


class _RunNode:
    """One node: a layer of the tree called as its module, any other node as its op's
    function with its parameters read from the layers that own them."""

    def __init__(self, node, root):
        self.node = node
        graph = root.graph
        self.is_tree_layer = spec_tree.is_layer(graph, node) and not spec_tree.in_application(
            node.name)
        self.params = OrderedDict(graph.param_names(node))

    def __call__(self, root, values, args, outputs):
        node = self.node
        inputs = [values[i] for i in args]
        if self.is_tree_layer:
            values[node.name] = root.get_submodule(node.name)(*inputs)
            return
        if node.op in recurrent.LAYOUT:
            p = {"flat_weights": root.get_submodule(node.name).flat_weights}
        else:
            p = {suffix: root.tensor(full) for suffix, full in self.params.items()}
        fn = root.op_overrides.get(node.op) or getattr(ops, node.op)
        values[node.name] = fn(inputs, p, node.attrs, root.training)


def _scheduled(units, outputs, given):
    """The units ``outputs`` need, output by output, each output's (not yet scheduled) units
    in graph order: autograd's backward pass takes the most recently recorded work first, so
    the first output's graph is the last one it walks, when the others' saved tensors are
    already free (a program's objectives put their largest term first)."""
    order, done = [], set()
    for output in outputs:
        needed = {output}
        wanted = set()
        for k in range(len(units) - 1, -1, -1):
            _, args, outs, _ = units[k]
            if k not in done and any(o in needed and o not in given for o in outs):
                wanted.add(k)
                needed.update(args)
        for k in sorted(wanted):
            order.append(units[k])
            done.add(k)
    return order


def _with_drops(units, outputs):
    """Units as callables that drop each value after its last use (not the outputs)."""
    last = {}
    for k, (_, args, _, _) in enumerate(units):
        for i in args:
            last[i] = k
    plan = []
    for k, (_, args, outs, runner) in enumerate(units):
        done = [i for i in dict.fromkeys(args) if last[i] == k and i not in outputs]
        plan.append(_Unit(runner, args, outs, done))
    return plan


class _Unit:
    __slots__ = ("runner", "args", "outs", "done")

    def __init__(self, runner, args, outs, done):
        self.runner, self.args, self.outs, self.done = runner, args, outs, done

    def __call__(self, root, values):
        self.runner(root, values, self.args, self.outs)
        for i in self.done:
            values.pop(i, None)


def build(graph, weights):
    """The model of ``graph`` holding ``weights`` (canonical name -> array)."""
    root = spec_tree.build_tree(graph)
    apps = spec_tree.applications(graph, root)
    made = OrderedDict()
    for block in root.walk():
        for node_name in block.layers.values():
            node = graph.nodes[node_name]
            if node.op in recurrent.LAYOUT:
                shared = [full for s, full in graph.param_names(node).items()
                          if full != node.name + "." + s]
                if shared:
                    raise UnsupportedOptionError(
                        "recurrent node {!r} shares parameters {}: the PyTorch backend holds a "
                        "recurrent layer's weights in one flat buffer of its own; give the node "
                        "its own parameters".format(node.name, shared))
            made[node_name] = layers.make(graph, node, weights)
    model = _root_class(root.kind)()
    _populate(model, graph, root, weights, made)
    model._setup(graph, root, root.steps, root.outputs)
    model._setup_root(graph, root, apps)

    def locate(full):
        return model._locate(full)
    for node_name, layer in made.items():
        layers.tie(graph, graph.nodes[node_name], layer, locate)
    return model


_ROOTS = {}


def _root_class(kind):
    """The model's own class (``ResNet``, ``Transformer``), a NativeModel."""
    if kind not in _ROOTS:
        _ROOTS[kind] = type(kind, (NativeModel,), {
            "__module__": __name__,
            "__doc__": "A tbdzoo ``{}`` model (tbdzoo/backends/torch/native.py).".format(kind)})
    return _ROOTS[kind]
