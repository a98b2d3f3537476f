"""The neutral model graph: typed nodes with static attributes, serialisable and hashable.

A graph has named inputs (shapes exclude the batch axis), nodes in topological order, one
output node and a loss.  Shapes are inferred when a node is added, so a builder that wires a
node wrongly fails at once, naming the node, instead of inside some backend.
"""
import hashlib
import json
from collections import OrderedDict

from . import ops as _ops
from .program import Program

SPEC_VERSION = 1


class Input:
    """A graph input; ``role`` is 'feature' (fed to nodes) or 'target' (fed to the loss)."""

    __slots__ = ("name", "shape", "dtype", "role")

    def __init__(self, name, shape, dtype="float32", role="feature"):
        self.name, self.shape, self.dtype, self.role = name, tuple(shape), dtype, role

    def to_json(self):
        return OrderedDict([("name", self.name), ("shape", list(self.shape)),
                            ("dtype", self.dtype), ("role", self.role)])


class Node:
    """One operation. ``shape`` is the inferred output shape without the batch axis."""

    __slots__ = ("name", "op", "inputs", "attrs", "shape", "dtype")

    def __init__(self, name, op, inputs, attrs, shape, dtype):
        self.name, self.op, self.inputs = name, op, list(inputs)
        self.attrs, self.shape, self.dtype = attrs, tuple(shape), dtype

    def to_json(self):
        return OrderedDict([("name", self.name), ("op", self.op), ("inputs", self.inputs),
                            ("attrs", _jsonable(self.attrs)), ("shape", list(self.shape)),
                            ("dtype", self.dtype)])

    def __repr__(self):
        return "Node({}: {}({}) -> {})".format(self.name, self.op, ", ".join(self.inputs),
                                               self.shape)


class ParamSpec:
    """A parameter in canonical layout; ``trainable`` is False for running statistics."""

    __slots__ = ("name", "shape", "init", "trainable", "owner")

    def __init__(self, name, shape, init, trainable=True, owner=None):
        self.name, self.shape, self.init = name, tuple(shape), tuple(init)
        self.trainable, self.owner = trainable, owner

    @property
    def size(self):
        n = 1
        for d in self.shape:
            n *= d
        return n


class Graph:
    """Build with :meth:`input` and :meth:`add`; finish with :meth:`set_output` and :meth:`set_loss`."""

    def __init__(self, name):
        self.name = name
        self.inputs = OrderedDict()
        self.nodes = OrderedDict()
        self.output = None
        self.loss = None
        self.program = None
        self.blocks = OrderedDict()  # scope -> class name of its native block (spec/tree.py)
        self._params = None
        self._rows = {}  # node -> its rows per example of the input batch (to_batch folds)

    # -- building -----------------------------------------------------------------
    def input(self, name, shape, dtype="float32", role="feature"):
        self._check_new_name(name)
        self.inputs[name] = Input(name, shape, dtype, role)
        return name

    def add(self, name, op, inputs, **attrs):
        """Add a node and infer its shape; returns the node name for wiring."""
        self._check_new_name(name)
        if isinstance(inputs, str):
            inputs = [inputs]
        for i in inputs:
            if i not in self.nodes and i not in self.inputs:
                raise ValueError("node {!r}: input {!r} is not defined yet".format(name, i))
        definition = _ops.get(op)
        in_shapes = [self.shape_of(i) for i in inputs]
        in_dtypes = [self.dtype_of(i) for i in inputs]
        try:
            attrs = definition.normalize(attrs)
            shape = definition.infer_shape(in_shapes, attrs)
            dtype = definition.out_dtype(in_dtypes, attrs)
            rows = self._rows_of_inputs(inputs) * _ops.rows_per_example(in_shapes, op)
        except (ValueError, AssertionError, IndexError) as e:
            raise ValueError("node {!r} ({}): {}".format(name, op, e)) from e
        self.nodes[name] = Node(name, op, inputs, attrs, shape, dtype)
        self._rows[name] = rows
        self._params = None
        return name

    def _rows_of_inputs(self, inputs):
        rows = set(self.rows_per_example(i) for i in inputs)
        if len(rows) > 1:
            raise ValueError("inputs {} come from batches of different sizes ({} rows per "
                             "example after to_batch): fold each of them with to_batch, or "
                             "none".format(inputs, sorted(rows)))
        return rows.pop() if rows else 1

    def rows_per_example(self, name):
        """Rows of value ``name``'s batch per example of the input batch: 1, or the product of
        the axes folded into the batch by the ``to_batch`` nodes it comes through."""
        return self._rows.get(name, 1)

    def set_output(self, name):
        self.output = name

    def set_loss(self, kind, logits, labels, **attrs):
        if kind not in _ops.LOSSES:
            raise ValueError("unknown loss {!r}; known: {}".format(kind, sorted(_ops.LOSSES)))
        self.loss = OrderedDict([("kind", kind), ("logits", logits), ("labels", labels)])
        self.loss.update(sorted(attrs.items()))

    def block(self, scope, kind):
        """Name the class of a scope's native block: ``block('layer1.0', 'Bottleneck')``;
        ``block('', 'ResNet')`` names the whole model. Scopes of one kind become instances of
        one class where the backends build classes (tbdzoo/spec/tree.py)."""
        if not isinstance(kind, str) or not kind.isidentifier() or not kind[0].isupper():
            raise ValueError("block kind {!r} of scope {!r} must be a class name such as "
                             "'Bottleneck'".format(kind, scope))
        if scope in self.nodes or scope in self.inputs:
            raise ValueError("scope {!r} is a node or input of {!r}; a block is a prefix of "
                             "node names".format(scope, self.name))
        self.blocks[scope] = kind
        return scope

    def set_program(self, program):
        """Attach the training program (tbdzoo/spec/program.py), checked against this graph."""
        self.program = program.check(self)

    def _check_new_name(self, name):
        if name in self.nodes or name in self.inputs:
            raise ValueError("name {!r} is used twice in graph {!r}".format(name, self.name))

    # -- queries ------------------------------------------------------------------
    def shape_of(self, name):
        return self.nodes[name].shape if name in self.nodes else self.inputs[name].shape

    def dtype_of(self, name):
        return self.nodes[name].dtype if name in self.nodes else self.inputs[name].dtype

    def feature_inputs(self):
        return [i for i in self.inputs.values() if i.role == "feature"]

    def target_inputs(self):
        return [i for i in self.inputs.values() if i.role == "target"]

    def params(self):
        """OrderedDict canonical name -> ParamSpec, owned parameters only (shared ones appear once)."""
        if self._params is None:
            table = OrderedDict()
            for node in self.nodes.values():
                in_shapes = [self.shape_of(i) for i in node.inputs]
                for suffix, (shape, init, trainable) in _ops.get(node.op).params(
                        in_shapes, node.attrs).items():
                    if suffix in node.attrs.get("shared", {}):
                        continue
                    full = "{}.{}".format(node.name, suffix)
                    table[full] = ParamSpec(full, shape, init, trainable, node.name)
            for node in self.nodes.values():
                for ref in node.attrs.get("shared", {}).values():
                    if ref not in table:
                        raise ValueError("node {!r} shares {!r}, which no earlier node owns".format(
                            node.name, ref))
            self._params = table
        return self._params

    def param_names(self, node):
        """suffix -> canonical parameter name for one node, resolving shared parameters."""
        in_shapes = [self.shape_of(i) for i in node.inputs]
        shared = node.attrs.get("shared", {})
        return OrderedDict((s, shared.get(s, "{}.{}".format(node.name, s)))
                           for s in _ops.get(node.op).params(in_shapes, node.attrs))

    def trainable_count(self):
        return sum(p.size for p in self.params().values() if p.trainable)

    def flops(self):
        """Forward FLOPs per example of the input batch, per node (multiply-add counts as 2);
        a node after ``to_batch`` counts once per row its example makes."""
        out = OrderedDict()
        for node in self.nodes.values():
            in_shapes = [self.shape_of(i) for i in node.inputs]
            out[node.name] = _ops.get(node.op).flops(in_shapes, node.shape, node.attrs) * \
                self.rows_per_example(node.inputs[0] if node.inputs else node.name)
        return out

    # -- serialisation --------------------------------------------------------------
    def to_json(self):
        return OrderedDict([
            ("spec_version", SPEC_VERSION), ("name", self.name),
            ("inputs", [i.to_json() for i in self.inputs.values()]),
            ("nodes", [n.to_json() for n in self.nodes.values()]),
            ("output", self.output), ("loss", _jsonable(self.loss)),
        ] + ([("blocks", OrderedDict(self.blocks))] if self.blocks else [])
          + ([("program", _jsonable(self.program.to_json()))] if self.program else []))

    def dumps(self, **kw):
        return json.dumps(self.to_json(), **kw)

    @classmethod
    def from_json(cls, data):
        """Rebuild by replaying the nodes, so shapes are re-inferred and checked."""
        if isinstance(data, str):
            data = json.loads(data)
        if data.get("spec_version") != SPEC_VERSION:
            raise ValueError("spec_version {!r} is not {}".format(data.get("spec_version"),
                                                                  SPEC_VERSION))
        g = cls(data["name"])
        for i in data["inputs"]:
            g.input(i["name"], i["shape"], i["dtype"], i["role"])
        for n in data["nodes"]:
            g.add(n["name"], n["op"], n["inputs"], **_tupled(n["attrs"]))
            if list(g.nodes[n["name"]].shape) != list(n["shape"]):
                raise ValueError("node {!r}: stored shape {} but inferred {}".format(
                    n["name"], n["shape"], list(g.nodes[n["name"]].shape)))
        g.set_output(data["output"])
        if data["loss"]:
            loss = dict(data["loss"])
            g.set_loss(loss.pop("kind"), loss.pop("logits"), loss.pop("labels"), **loss)
        for scope, kind in data.get("blocks", {}).items():
            g.block(scope, kind)
        if data.get("program"):
            g.set_program(Program.from_json(data["program"]))
        return g

    def hash(self):
        """A stable SHA-256 of the canonical JSON: equal graphs hash equal in every interpreter."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def summary(self):
        lines = ["{} ({} nodes, {:,} trainable parameters)".format(
            self.name, len(self.nodes), self.trainable_count())]
        for n in self.nodes.values():
            lines.append("  {:<40} {:<22} {}".format(n.name, n.op, n.shape))
        return "\n".join(lines)


def _jsonable(x):
    if isinstance(x, dict):
        return OrderedDict((k, _jsonable(v)) for k, v in sorted(x.items()))
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def _tupled(x):
    """JSON turns tuples into lists; attributes are tuples, so turn them back."""
    if isinstance(x, dict):
        return {k: _tupled(v) for k, v in x.items()}
    if isinstance(x, list):
        return tuple(_tupled(v) for v in x)
    return x
