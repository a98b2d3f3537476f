"""A graph as a tree of blocks: what each backend builds its framework's own layers from.

Node names are paths (``layer1.0.conv1``), so the graph already says where each node lives.
The tree reads them this way:

- A **layer** is a node with parameters (a convolution, a BatchNorm, a dense layer, a
  recurrent layer). It becomes one of the framework's layers at the module path equal to its
  name, so ``layer1.0.conv1.weight`` is the parameter ``weight`` of layer ``layer1.0.conv1``.
  A layer may sit below another layer (Deep Speech 2's ``rnn.0.bn`` below ``rnn.0``): it is
  then a child of that layer's module.
- A **block** is a proper prefix of node names that is not itself a node (``layer1.0``,
  ``layer1``, ``encoder.0.ffn``); the root block is the whole model. A block's forward runs its
  **steps** in graph order: its direct layers, its parameter-free nodes as functions, and its
  child blocks, each called once with the values it reads from outside.
- A block's class name is its kind: what the model's builder declared with
  :meth:`Graph.block`, else the CamelCase of its last non-numeric name part. A block whose
  children are the blocks ``0 .. n-1``, each feeding the next, is ``Sequential``.
- An **application** is a second use of a block with the same parameters, named
  ``<block>@<tag>.<rest>`` (WGAN-GP's ``critic@fake``). It is no module of its own: a backend
  calls the block it applies when nothing outside reads its inner values, and otherwise runs
  its nodes one by one with the block's parameters.

Nothing here imports a framework; valid Python 3.6 (the CNTK worker imports the spec).
"""
from collections import OrderedDict

from . import ops as _ops

SEQUENTIAL = "Sequential"


class Step:
    """One step of a block's forward: ``kind`` is 'layer' (a parametrised node, called as
    the layer at module path ``path`` below the block), 'op' (a parameter-free node, run as a
    function) or 'block' (the child block ``path``, called with ``inputs``, giving
    ``outputs``)."""

    __slots__ = ("kind", "path", "node", "inputs", "outputs")

    def __init__(self, kind, path, node, inputs, outputs):
        self.kind, self.path, self.node = kind, path, node
        self.inputs, self.outputs = list(inputs), list(outputs)

    def __repr__(self):
        return "Step({} {}: {} -> {})".format(self.kind, self.path, self.inputs, self.outputs)


class Block:
    """A block of the tree. ``name`` is its full path ('' for the root), ``inputs`` the values
    it reads from outside in the order its forward takes them, ``outputs`` the values it gives
    (one, or a tuple in this order)."""

    def __init__(self, name, kind):
        self.name, self.kind = name, kind
        self.children = OrderedDict()   # local name -> Block
        self.layers = OrderedDict()     # module path below this block -> node name
        self.steps = []
        self.all_steps = None   # the root's: every step, also those its output does not need
        self.inputs, self.outputs = [], []

    @property
    def local(self):
        return self.name.rpartition(".")[2]

    def walk(self):
        """This block and every block below it, parents first."""
        yield self
        for child in self.children.values():
            yield from child.walk()

    def find(self, name):
        block = self
        for part in name.split(".") if name else ():
            block = block.children[part]
        return block

    def __repr__(self):
        return "Block({!r}: {}, {} steps, inputs {}, outputs {})".format(
            self.name, self.kind, len(self.steps), self.inputs, self.outputs)


class Application:
    """A second use of ``block`` (``critic@fake``): ``inputs[i]`` is given where the block
    reads ``block_inputs[i]``; ``outputs`` maps the block's output names to the application's.
    ``callable`` is False when something outside reads an inner value of the application
    (the gradient penalty reads the critic's activations), so its nodes must run one by one."""

    def __init__(self, prefix, block, nodes, inputs, block_inputs, outputs, callable_):
        self.prefix, self.block, self.nodes = prefix, block, nodes
        self.inputs, self.block_inputs, self.outputs = inputs, block_inputs, outputs
        self.callable = callable_


def is_layer(graph, node):
    """A node that owns or shares parameters: one of the framework's layers."""
    return bool(graph.param_names(node))


def in_application(name):
    return "@" in name


def read_outside(graph):
    """Values read by something that is not a node: the output, the loss, the program's
    losses and targets step."""
    names = [graph.output] if graph.output else []
    if graph.loss:
        names += [graph.loss["logits"], graph.loss["labels"]]
    program = graph.program
    if program is not None:
        for loss in program.losses.values():
            names += list(loss["inputs"].values())
        if program.targets_step is not None:
            names += list(program.targets_step["reads"])
    return OrderedDict.fromkeys(n for n in names if n)


def _kind_from_name(local):
    words = [w for w in local.replace("-", "_").split("_") if w]
    name = "".join(w[:1].upper() + w[1:] for w in words)
    return name if name and name[0].isalpha() else "Block"


def build_tree(graph):
    """The root :class:`Block` of ``graph``; raises ValueError naming a block whose nodes are
    interleaved with others', since such a block has no single place in its parent's forward."""
    nodes = [n for n in graph.nodes.values() if not in_application(n.name)]
    scopes = OrderedDict()   # every block path, parents before children
    for node in nodes:
        parts = node.name.split(".")
        for i in range(1, len(parts)):
            prefix = ".".join(parts[:i])
            if prefix in graph.nodes:
                break           # below a node: that node's layer holds what follows
            scopes.setdefault(prefix, None)
    for scope in graph.blocks:
        if scope and scope not in scopes:
            raise ValueError("block {!r} declared by {!r} is not a prefix of any node name"
                             .format(scope, graph.name))
    root = Block("", graph.blocks.get("", _kind_from_name(graph.name)))
    blocks = {"": root}
    for scope in scopes:
        parent, _, local = scope.rpartition(".")
        block = Block(scope, graph.blocks.get(scope) or _kind_from_name(
            next((p for p in reversed(scope.split(".")) if not p.isdigit()), "block")))
        blocks[parent].children[local] = block
        blocks[scope] = block

    def home(name):
        """The block that runs node ``name``: its longest prefix that is a block."""
        parts = name.split(".")
        for i in range(len(parts) - 1, 0, -1):
            prefix = ".".join(parts[:i])
            if prefix in scopes:
                return prefix
        return ""

    producer_block = {}
    for node in nodes:
        producer_block[node.name] = home(node.name)
        block = blocks[home(node.name)]
        if is_layer(graph, node):
            block.layers[node.name[len(block.name) + 1 if block.name else 0:]] = node.name

    # Consumers of every value: nodes (by their home block) and readers outside the graph.
    consumers = OrderedDict()
    for node in graph.nodes.values():
        where = None if in_application(node.name) else home(node.name)
        for i in node.inputs:
            consumers.setdefault(i, []).append(where)
    outside = read_outside(graph)

    def inside(block_name, where):
        return where is not None and (not block_name or where == block_name
                                      or where.startswith(block_name + "."))

    for block in blocks.values():
        if not block.name:
            continue
        members = [n for n in nodes if inside(block.name, producer_block[n.name])]
        made = set(n.name for n in members)
        for n in members:
            for i in n.inputs:
                if i not in made and i not in block.inputs:
                    block.inputs.append(i)
        for n in members:
            used_outside = n.name in outside or any(
                not inside(block.name, w) for w in consumers.get(n.name, ()))
            if used_outside:
                block.outputs.append(n.name)
    root.outputs = [graph.output]

    # Steps: each block runs its own nodes and calls each child once, where its first node is.
    for block in blocks.values():
        done = set()
        for node in nodes:
            where = producer_block[node.name]
            if not inside(block.name, where):
                continue
            if where == block.name:
                path = node.name[len(block.name) + 1 if block.name else 0:]
                kind = "layer" if is_layer(graph, node) else "op"
                block.steps.append(Step(kind, path, node.name, node.inputs, [node.name]))
                continue
            rest = where[len(block.name) + 1 if block.name else 0:]
            local = rest.split(".")[0]
            if local in done:
                if block.steps[-1].path != local:
                    raise ValueError(
                        "the nodes of block {!r} in {!r} are interleaved with other nodes of "
                        "{!r}: build a block's nodes one after another".format(
                            block.children[local].name, graph.name, block.name or graph.name))
                continue
            child = block.children[local]
            done.add(local)
            block.steps.append(Step("block", local, None, child.inputs, child.outputs))
    _prune_root(root, graph)
    for block in blocks.values():
        if _is_sequential(block):
            block.kind = SEQUENTIAL
    return root


def _prune_root(root, graph):
    """The root's forward computes the graph's output only (an auxiliary head stays a module,
    called by the training program's values, not by forward)."""
    root.all_steps = list(root.steps)
    needed = set(root.outputs)
    kept = []
    for step in reversed(root.steps):
        if any(o in needed for o in step.outputs):
            kept.append(step)
            needed.update(step.inputs)
    root.steps = list(reversed(kept))
    # Every input the output needs, in the graph's order: the feature inputs, and for a
    # program with a targets step, the inputs that step writes (Faster R-CNN's sampled RoIs).
    root.inputs = [i for i in graph.inputs if i in needed]


def _is_sequential(block):
    steps = block.steps
    if not steps or any(s.kind == "op" for s in steps):
        return False
    if [s.path for s in steps] != [str(i) for i in range(len(steps))]:
        return False
    if len(block.inputs) != 1 or len(block.outputs) != 1:
        return False
    value = block.inputs[0]
    for s in steps:
        if s.inputs != [value] or len(s.outputs) != 1:
            return False
        value = s.outputs[0]
    return value == block.outputs[0]


def applications(graph, root=None):
    """OrderedDict prefix -> :class:`Application` for every ``<block>@<tag>`` in ``graph``."""
    root = root or build_tree(graph)
    out = OrderedDict()
    by_prefix = OrderedDict()
    for node in graph.nodes.values():
        first = node.name.split(".")[0]
        if "@" in first and first.split("@")[0] and "@" not in node.name[len(first):]:
            by_prefix.setdefault(first, []).append(node)
    outside = read_outside(graph)
    for prefix, members in by_prefix.items():
        scope = prefix.split("@")[0]
        try:
            block = root.find(scope)
        except KeyError:
            raise ValueError("{!r} applies {!r}, which is not a block of {!r}".format(
                prefix, scope, graph.name)) from None
        made = set(n.name for n in members)
        mapping = OrderedDict()   # block input -> application input
        for n in members:
            original = graph.nodes.get(scope + n.name[len(prefix):])
            if original is None or original.op != n.op or len(original.inputs) != len(n.inputs):
                raise ValueError("{!r} in {!r} has no matching node in block {!r}".format(
                    n.name, graph.name, scope))
            for mine, theirs in zip(n.inputs, original.inputs):
                if mine not in made:
                    mapping.setdefault(theirs, mine)
        outputs = OrderedDict((o, prefix + o[len(scope):]) for o in block.outputs)
        read = set()
        for node in graph.nodes.values():
            if node.name not in made:
                read.update(i for i in node.inputs if i in made)
        read.update(o for o in outside if o in made)
        callable_ = (read <= set(outputs.values())
                     and [i for i in block.inputs if i in mapping] == block.inputs)
        out[prefix] = Application(prefix, scope, [n.name for n in members],
                                  [mapping.get(i) for i in block.inputs], list(block.inputs),
                                  outputs, callable_)
    return out


def layer_op(graph, node_name):
    """The op definition of a layer node (its parameters by suffix are ``graph.param_names``)."""
    return _ops.get(graph.nodes[node_name].op)
