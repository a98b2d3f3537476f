"""A model's tree of blocks (tbdzoo/spec/tree.py) as classes: one class per block kind.

The instances of a kind are unified into one class: a value that differs between instances
(a convolution's channels, a stride) becomes a constructor argument, named after what it
is; values equal in every instance stay literals in the class. A child block that some
instances have and others lack (ResNet's ``downsample``) becomes optional: the class takes a
flag, holds None without it, and where it would run its input passes on unchanged. Instances
that cannot be unified (another order of steps, other layers) become numbered variants of
the kind, each its own class.

What a framework needs of a layer (its constructor's arguments, and which of them its call
reads) comes from an emitter (``tbdzoo/backends/<fw>/source.py``), through three functions:
``layer_slots(graph, node)`` and ``op_slots(graph, node)`` give OrderedDicts of name ->
:class:`Slot`, and ``layer_type(graph, node)`` names the framework's layer (part of what must
match between instances). What a layer is made with is one table here (:func:`spec_slots`);
each emitter renames it (:func:`renamed_slots`). Nothing here imports a framework.
"""
import keyword
from collections import OrderedDict

from ..spec import tree as _tree

WILD = object()  # a slot value an instance does not have (an optional child it lacks)
RESERVED = {"self", "F", "nn", "np", "torch", "math", "tf", "keras", "layers", "mx", "nd",
            "gluon", "C", "cntk", "x", "out", "super", "len", "range", "int", "float"}


class Slot:
    """One value an instance gives a layer or an op: ``family`` says which slots may share one
    constructor argument ('channels', 'stride', ...); ``call`` is True when the layer's or op's
    forward code reads it (it is then kept on the instance)."""

    __slots__ = ("value", "family", "call")

    def __init__(self, value, family=None, call=False):
        self.value, self.family, self.call = value, family, call


def spec_slots(graph, node):
    """What the layer computing ``node`` is made with, in no framework's terms: name -> Slot
    in the spec's order, the attributes as the spec holds them and the input sizes read from
    the graph's shapes. Names are the spec's attributes ('filters', 'eps', 'units'), with
    'in_channels' and 'channels' (image axis 0), 'in_features' and 'channels' (the last axis),
    and, for the layers every written file defines itself (attention, LSTM, GRU), the names
    those take. An op that is no layer has none."""
    a, op, s = node.attrs, node.op, OrderedDict()
    shape = graph.shape_of(node.inputs[0]) if node.inputs else ()
    if op == "conv2d":
        s["in_channels"] = Slot(shape[0], "channels")
        s["filters"] = Slot(a["filters"], "channels")
        s["kernel"] = Slot(a["kernel"], "kernel_size")
        for k, family in (("stride", "stride"), ("padding", "padding"),
                          ("dilation", "dilation"), ("groups", "groups"), ("use_bias", "bias")):
            s[k] = Slot(a[k], family)
    elif op in ("batchnorm", "sequence_batchnorm", "frozen_batchnorm", "layernorm",
                "channel_layernorm"):
        image = op in ("batchnorm", "frozen_batchnorm", "channel_layernorm")
        s["channels"] = Slot(shape[0] if image else shape[-1], "channels")
        s["eps"] = Slot(a["eps"], "eps")
        if op in ("batchnorm", "sequence_batchnorm"):
            s["momentum"] = Slot(a["momentum"], "momentum")
            s["track_running_stats"] = Slot(a["track_running_stats"], "track_running_stats")
    elif op == "dense":
        s["in_features"] = Slot(shape[-1], "channels")
        s["units"] = Slot(a["units"], "channels")
        s["use_bias"] = Slot(a["use_bias"], "bias")
    elif op == "embedding":
        s["vocab"] = Slot(a["vocab"], "vocab")
        s["dim"] = Slot(a["dim"], "channels")
        s["scale"] = Slot(a["scale"], "scale", call=True)
    elif op == "multi_head_attention":
        s["d_model"] = Slot(shape[-1], "channels")
        for k in ("num_heads", "dropout", "causal", "pad_id"):
            s[k] = Slot(a[k], k)
    elif op in ("lstm", "gru"):
        s["input_size"] = Slot(shape[-1], "channels")
        s["hidden_size"] = Slot(a["units"], "channels")
        for k in ("num_layers", "bidirectional", "merge"):
            s[k] = Slot(a[k], k)
    elif op == "additive_attention":
        s["query_size"] = Slot(shape[-1], "channels")
        s["memory_size"] = Slot(graph.shape_of(node.inputs[1])[-1], "channels")
        s["units"] = Slot(a["units"], "channels")
    return s


def renamed_slots(graph, node, names, convert=None):
    """:func:`spec_slots` in a framework's terms. ``names`` maps an op to its constructor's
    arguments in order, a string of words ``name=spec_name`` (or ``name`` where both are the
    same): an op it lacks keeps the spec's names and order. ``convert`` maps a spec name to
    the function giving the framework's value (one int for an equal pair, say)."""
    spec = spec_slots(graph, node)
    if node.op not in names:
        pairs = [(k, k) for k in spec]
    else:
        pairs = [tuple(w.split("=")) if "=" in w else (w, w) for w in names[node.op].split()]
    out = OrderedDict()
    for name, spec_name in pairs:
        slot = spec[spec_name]
        change = (convert or {}).get(spec_name)
        out[name] = Slot(change(slot.value) if change else slot.value, slot.family, slot.call)
    return out


def attribute_slots(node):
    """An op's attributes as slots its code reads (each may differ between instances)."""
    return OrderedDict((k, Slot(v, k, call=True)) for k, v in sorted(node.attrs.items())
                       if k != "shared")


class Lit:
    """A literal value in the emitted code."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return isinstance(other, Lit) and _same(self.value, other.value)

    def __repr__(self):
        return "Lit({!r})".format(self.value)


class Arg:
    """A constructor argument of the class being written (``name``)."""

    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __eq__(self, other):
        return isinstance(other, Arg) and self.name == other.name

    def __repr__(self):
        return "Arg({})".format(self.name)


class Member:
    """A module a class holds, at local path ``path``: a framework layer (``kind`` 'layer':
    ``op``, ``node`` of the template, ``type`` the emitter's layer type, ``values`` name ->
    Lit/Arg), a class instance ('block': ``cls`` a ClassDef, ``values`` its arguments in
    order), or a container of members called in a chain ('seq': ``items``). ``optional`` is
    the Arg of its presence flag, or None."""

    def __init__(self, kind, path, op=None, node=None, type=None, values=None, cls=None,
                 items=None):
        self.kind, self.path, self.op, self.node, self.type = kind, path, op, node, type
        self.values = values if values is not None else OrderedDict()
        self.cls, self.items = cls, items or []
        self.optional = None


class Step:
    """One statement of ``forward``: ``kind`` 'layer' (call member ``path``), 'op' (the
    framework's function of ``op`` with ``values``) or 'block' (call member ``path``);
    ``ins``/``outs`` are variable names; ``optional`` the Arg of the member's presence flag
    (then its one output replaces its one input when the member is absent)."""

    def __init__(self, kind, path, op, node, values, ins, outs, optional=None):
        self.kind, self.path, self.op, self.node, self.values = kind, path, op, node, values
        self.ins, self.outs, self.optional = ins, outs, optional


class Param:
    """A constructor argument: ``name``, ``family`` and whether forward reads it (``call``)."""

    def __init__(self, name, family, call):
        self.name, self.family, self.call = name, family, call


class ClassDef:
    """One emitted class. ``base`` is 'module', or 'list' when its members are numbered 0..n-1
    (a list of modules). ``note`` explains a numbered variant."""

    def __init__(self, name, kind):
        self.name, self.kind = name, kind
        self.params = []
        self.members = OrderedDict()
        self.steps = []
        self.inputs, self.outputs = [], []
        self.input_nodes = []   # the template's input values (graph names)
        self.output_nodes = []
        self.count = 0
        self.note = None
        self.base = "module"
        self.ties = []          # (member path, parameter suffix, owner member path): root only


class Plan:
    """``classes`` in the order they must be written (children first); ``root`` the model's
    class; ``graph`` and ``tree`` the spec they come from; ``parts`` the root's members that
    its forward does not call (an auxiliary head, Faster R-CNN's RPN) with their inputs."""

    def __init__(self, graph, root_block, classes, root):
        self.graph, self.tree, self.classes, self.root = graph, root_block, classes, root


def _same(a, b):
    if a is WILD or b is WILD:
        return a is b
    if isinstance(a, float) or isinstance(b, float):
        return type(a) is type(b) and a == b
    return type(a) is type(b) and a == b


def identifier(text, taken=()):
    """``text`` as a Python identifier not in ``taken`` or RESERVED."""
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in text).strip("_") or "v"
    if name[0].isdigit():
        name = "_" + name
    if keyword.iskeyword(name) or name in RESERVED:
        name = name + "_"
    base, i = name, 2
    while name in taken:
        name = "{}{}".format(base, i)
        i += 1
    return name


# -- one instance, read locally ---------------------------------------------------------------
class _Local:
    """A block instance in local terms: its members (path -> description), steps with
    references ('in', i) / ('val', step, output), and its slots (key -> (Slot, ...))."""

    def __init__(self, block):
        self.block = block
        self.members = OrderedDict()   # path -> ('layer', type, op, node) | ('block', cls) | ('seq', [...])
        self.steps = []                # (kind, path, op, node, refs, n_outputs)
        self.outputs = []              # refs
        self.slots = OrderedDict()     # key -> Slot

    def signature(self, steps=None, members=None):
        steps = self.steps if steps is None else steps
        members = self.members if members is None else members
        return (len(self.block.inputs), tuple((k, p, o, tuple(r), n) for k, p, o, _, r, n in steps),
                tuple((p, _member_sig(m)) for p, m in members.items()), tuple(self.outputs))


def _member_sig(m):
    if m[0] == "layer":
        return ("layer", m[1], m[2])
    if m[0] == "block":
        return ("block", m[1].name)
    return ("seq", tuple(_member_sig(i) for i in m[1]))


class Planner:
    def __init__(self, graph, emitter):
        self.graph, self.emitter = graph, emitter
        self.tree = _tree.build_tree(graph)
        self.resolved = {}      # block name -> (ClassDef, [argument values])
        self.classes = []
        self.names = set()

    # -- members of a block ------------------------------------------------------------------
    def _layer_member(self, node_name, path, local):
        node = self.graph.nodes[node_name]
        slots = self.emitter.layer_slots(self.graph, node)
        for k, s in slots.items():
            local.slots[(path, k)] = s
        return ("layer", self.emitter.layer_type(self.graph, node), node.op, node_name)

    def _block_member(self, child, path, local):
        if child.kind == _tree.SEQUENTIAL:
            items = []
            for step in child.steps:
                sub = path + "." + step.path
                if step.kind == "layer":
                    items.append(self._layer_member(step.node, sub, local))
                else:
                    items.append(self._block_member(child.children[step.path], sub, local))
            return ("seq", items)
        cls, args = self.resolved[child.name]
        for param, value in zip(cls.params, args):
            local.slots[(path, param.name)] = Slot(value, param.family, False)
        return ("block", cls)

    def local(self, block, root=False):
        loc = _Local(block)
        made = OrderedDict()   # value name -> ref
        for i, name in enumerate(block.inputs):
            made[name] = ("in", i)
        for index, step in enumerate(block.steps):
            refs = []
            for value in step.inputs:
                if value not in made:
                    raise ValueError("{!r} of block {!r} reads {!r}, made outside it".format(
                        step.path, block.name, value))
                refs.append(made[value])
            if step.kind == "layer":
                loc.members[step.path] = self._layer_member(step.node, step.path, loc)
                op = self.graph.nodes[step.node].op
            elif step.kind == "op":
                node = self.graph.nodes[step.node]
                op = node.op
                for k, s in self.emitter.op_slots(self.graph, node).items():
                    loc.slots[(step.path, k)] = s
            else:
                child = block.children[step.path]
                loc.members[step.path] = self._block_member(child, step.path, loc)
                op = _member_sig(loc.members[step.path])
            loc.steps.append((step.kind, step.path, op, step.node, refs, len(step.outputs)))
            for j, out in enumerate(step.outputs):
                made[out] = ("val", index, j)
        loc.outputs = [made[o] for o in block.outputs]
        if root:  # members the forward does not call but which hold parameters
            for local_path, node_name in block.layers.items():
                if local_path not in loc.members:
                    loc.members[local_path] = self._layer_member(node_name, local_path, loc)
            for local_path, child in block.children.items():
                if local_path not in loc.members and self._owns_parameters(child):
                    loc.members[local_path] = self._block_member(child, local_path, loc)
        return loc

    def _owns_parameters(self, block):
        params = self.graph.params()
        for b in block.walk():
            for node_name in b.layers.values():
                if any(n in params for n in self.graph.param_names(self.graph.nodes[node_name]).values()):
                    return True
        return False

    # -- unification ---------------------------------------------------------------------------
    def plan(self):
        skipped = set()   # blocks the model holds no module of: a program's helpers
        for local, child in self.tree.children.items():
            if not any(s.path == local for s in self.tree.steps) and \
                    not self._owns_parameters(child):
                skipped.update(b.name for b in child.walk())
        by_kind = OrderedDict()
        for block in self.tree.walk():
            if block.name in skipped:
                continue
            if block.kind != _tree.SEQUENTIAL or not block.name:
                by_kind.setdefault(block.kind, []).append(block)
        depth = {}

        def height(b):
            if b.name not in depth:
                depth[b.name] = 1 + max([height(c) for c in b.children.values()] or [0])
            return depth[b.name]
        order = sorted(by_kind, key=lambda k: max(height(b) for b in by_kind[k]))
        for kind in order:
            blocks = by_kind[kind]
            is_root = any(not b.name for b in blocks)
            self._unify(kind, blocks, is_root)
        root_cls = self.resolved[""][0]
        used = set()

        def reach(cls):
            if cls.name in used:
                return
            used.add(cls.name)
            stack = list(cls.members.values())
            while stack:
                m = stack.pop()
                if m.kind == "block":
                    reach(m.cls)
                stack.extend(m.items)
        reach(root_cls)
        # blocks the model holds no module of (a program's parameter-free helpers) are left out
        classes = [c for c in self.classes if c.name in used]
        plan = Plan(self.graph, self.tree, classes, root_cls)
        plan.parts = [(p, self.tree.children[p]) for p, m in root_cls.members.items()
                      if m.kind == "block" and p in self.tree.children
                      and not any(s.path == p for s in root_cls.steps)]
        return plan

    def _unify(self, kind, blocks, is_root):
        locals_ = [self.local(b, root=not b.name) for b in blocks]
        groups = []   # [template local, [(local, dropped paths)]]
        for loc in sorted(locals_, key=lambda l: -len(l.steps)):
            for group in groups:
                dropped = self._matches(group[0], loc)
                if dropped is not None:
                    group[1].append((loc, dropped))
                    break
            else:
                groups.append([loc, [(loc, ())]])
        groups.sort(key=lambda g: min(locals_.index(m[0]) for m in g[1]))
        for number, (template, members) in enumerate(groups):
            name = identifier(kind if number == 0 else "{}{}".format(kind, number + 1), self.names)
            self.names.add(name)
            cls = self._make_class(name, kind, template, members)
            if len(groups) > 1:
                cls.note = ("{} is one of {} variants of the kind {}: its instances differ in "
                            "their layers or steps from the other variants'".format(
                                name, len(groups), kind))
            self.classes.append(cls)

    def _matches(self, template, loc):
        """The optional block steps of ``template`` that ``loc`` lacks, when ``loc`` is
        ``template`` without them; None when it is not."""
        if loc.signature() == template.signature():
            return ()
        mine = set(s[1] for s in loc.steps)
        missing = [s for s in template.steps if s[0] == "block" and s[1] not in mine]
        if not missing or any(len(s[4]) != 1 or s[5] != 1 for s in missing):
            return None
        steps, members, outputs = _drop(template, set(s[1] for s in missing))
        if (len(loc.block.inputs), tuple((k, p, o, tuple(r), n) for k, p, o, _, r, n in steps),
                tuple((p, _member_sig(m)) for p, m in members.items()), tuple(outputs)) != \
                loc.signature():
            return None
        return tuple(s[1] for s in missing)

    def _make_class(self, name, kind, template, members):
        cls = ClassDef(name, kind)
        cls.count = len(members)
        cls.input_nodes = list(template.block.inputs)
        cls.output_nodes = list(template.block.outputs)
        optional = sorted(set(p for _, dropped in members for p in dropped))
        # Slots: each key's value per instance (WILD where an instance lacks the member).
        keys = list(template.slots)
        vectors = OrderedDict()
        for key in keys:
            vectors[key] = [loc.slots[key].value if key in loc.slots else WILD
                            for loc, _ in members]
        for path in optional:
            vectors[(path, "__present__")] = [path not in dropped for _, dropped in members]
        slot_of = dict(template.slots)
        params, expr = self._params(vectors, slot_of, template, cls)
        expr = OrderedDict((k, expr[k]) for k in vectors)   # in the template's slot order
        cls.params = params
        # Members, in the template's order.
        for path, m in template.members.items():
            cls.members[path] = self._member(path, m, expr)
            if path in optional:
                cls.members[path].optional = expr[(path, "__present__")]
        if all(p.split(".")[0].isdigit() for p in cls.members) and cls.members and \
                [p for p in cls.members if "." not in p] == \
                [str(i) for i in range(len([p for p in cls.members if "." not in p]))]:
            cls.base = "list"
        self._steps(cls, template, expr, set(optional), members)
        for index, (loc, _dropped) in enumerate(members):
            self.resolved[loc.block.name] = (cls, [p.vector[index] for p in params])
        if not template.block.name:
            cls.ties = self._ties(template.block)
        return cls

    def _params(self, vectors, slot_of, template, cls):
        """Constructor arguments from the varying slots; returns (params, key -> Lit/Arg)."""
        expr, groups = OrderedDict(), []   # groups: [family, call, keys, merged vector]
        for key, vector in vectors.items():
            known = [v for v in vector if v is not WILD]
            if key[1] == "__present__":
                family, call = "presence", False
            else:
                family, call = slot_of[key].family, slot_of[key].call
            flag = key[1] == "__present__"
            if flag and all(known):
                expr[key] = None
                continue
            if known and all(_same(v, known[0]) for v in known) and not flag:
                expr[key] = Lit(known[0])
                continue
            for g in groups:
                if g[0] == family and not flag and _compatible(g[3], vector):
                    g[2].append(key)
                    g[3] = [a if a is not WILD else b for a, b in zip(g[3], vector)]
                    g[1] = g[1] or call
                    break
            else:
                groups.append([family, call, [key], list(vector)])
        params, taken = [], set()
        families = [g[0] for g in groups]
        for g in groups:
            family, call, keys, vector = g
            name = self._param_name(family, keys, families, template, taken)
            taken.add(name)
            p = Param(name, family, call)
            p.vector = [None if v is WILD else v for v in vector]
            params.append(p)
            for key in keys:
                expr[key] = Arg(name)
        return params, expr

    def _param_name(self, family, keys, families, template, taken):
        if family == "presence":
            return identifier(keys[0][0].replace(".", "_"), taken)
        base = family
        if base == "channels":
            for path, attr in keys:
                if attr in ("in_channels", "in_features", "input_size") and \
                        self._reads_input(template, path):
                    return identifier("in_channels", taken)
        if families.count(family) == 1:
            return identifier(base, taken)
        path, attr = keys[0]
        return identifier("{}_{}".format(path.replace(".", "_"), attr), taken)

    @staticmethod
    def _reads_input(template, path):
        """Whether the layer at ``path`` reads the block's first input (in a chain of layers,
        only its first does)."""
        first, _, rest = path.partition(".")
        if rest and rest.split(".")[0] != "0":
            return False
        for _kind, p, _op, _node, refs, _n in template.steps:
            if p in (first, path):
                return bool(refs) and refs[0] == ("in", 0)
        return False

    def _member(self, path, m, expr):
        if m[0] == "layer":
            node = self.graph.nodes[m[3]]
            keys = [k for k in expr if k[0] == path and k[1] != "__present__"]
            return Member("layer", path, op=node.op, node=node, type=m[1],
                          values=OrderedDict((k[1], expr[k]) for k in keys))
        if m[0] == "block":
            cls = m[1]
            return Member("block", path, cls=cls,
                          values=OrderedDict((p.name, expr[(path, p.name)]) for p in cls.params))
        return Member("seq", path, items=[self._member("{}.{}".format(path, i), item, expr)
                                          for i, item in enumerate(m[1])])

    def _steps(self, cls, template, expr, optional, instances):
        """Forward statements with variable names: an input that dies at a step gives its
        name to the step's one output; a fresh value of a layer or op is ``out`` when that name
        is free, else named after its path; a child block's outputs after their own names."""
        block, steps = template.block, template.steps
        last_use = {}
        for i, (_k, _p, _o, _n, refs, _c) in enumerate(steps):
            for r in refs:
                last_use[r] = i
        for r in template.outputs:
            last_use[r] = len(steps)
        names, live = {}, set()
        graph_inputs = self.graph.inputs
        for i, value in enumerate(block.inputs):
            if all(m.block.inputs[i] == value for m, _ in instances) and value in graph_inputs:
                name = identifier(value, live)
            else:
                parts = value.split(".")
                # the first input is x; another is named after where it comes from: a
                # value of a sibling block by that block (encoder), else by its own name
                hint = parts[-1] if len(parts) <= 2 else parts[0]
                name = "x" if not live else identifier(hint, live | {"x"})
            names[("in", i)] = name
            live.add(name)
        cls.inputs = [names[("in", i)] for i in range(len(block.inputs))]
        for i, (kind, path, op, node, refs, n_out) in enumerate(steps):
            ins = [names[r] for r in refs]
            for r in set(refs):
                if last_use.get(r) == i:
                    live.discard(names[r])
            outs = []
            for j in range(n_out):
                ref = ("val", i, j)
                several = len(template.outputs) > 1 and ref in template.outputs
                if ref not in last_use:
                    name = None
                elif several:   # one of the class's outputs: named after its path
                    name = identifier((path if kind != "block" or n_out == 1 else
                                       block.children[path].outputs[j][
                                           len(block.name) + len(path) + 2:]).replace(".", "_"),
                                      live)
                elif n_out == 1 and refs and last_use.get(refs[0]) == i and \
                        ((kind == "op" and len(refs) == 1) or ins[0] in ("x", "out")
                         or path in optional):
                    name = ins[0]
                elif kind != "block" and n_out == 1 and "out" not in live:
                    name = "out"
                else:
                    if kind == "block":
                        child = block.children[path]
                        local = child.outputs[j][len(child.name) + 1:] if n_out > 1 else path
                    else:
                        local = path
                    name = identifier(local.replace(".", "_"), live)
                if name is None:
                    name = "_"
                else:
                    live.add(name)
                names[ref] = name
                outs.append(name)
            values = OrderedDict((k[1], expr[k]) for k in expr
                                 if k[0] == path and kind == "op" and k[1] != "__present__")
            opt = cls.members[path].optional if path in optional and path in cls.members else None
            cls.steps.append(Step(kind, path, op if kind != "block" else None,
                                  self.graph.nodes[node] if node else None, values, ins, outs,
                                  opt))
        cls.outputs = [names[r] for r in template.outputs]

    def _ties(self, root):
        """(layer path, suffix, owner path) for each shared parameter: the layer at ``path``
        uses the parameter of the layer at ``owner``."""
        ties = []
        for node in self.graph.nodes.values():
            if _tree.in_application(node.name):
                continue
            for suffix, ref in node.attrs.get("shared", {}).items():
                owner, _, owner_suffix = ref.rpartition(".")
                ties.append((node.name, suffix, owner, owner_suffix))
        return ties


def _compatible(a, b):
    return all(x is WILD or y is WILD or _same(x, y) for x, y in zip(a, b))


def _drop(template, paths):
    """``template``'s steps and members without the block steps at ``paths``, each output
    reference replaced by the dropped step's input; (None, None) if that is not possible."""
    index_of = {s[1]: i for i, s in enumerate(template.steps)}
    replace = {("val", index_of[p], 0): template.steps[index_of[p]][4][0] for p in paths}
    kept, renumber = [], {}
    for i, s in enumerate(template.steps):
        if s[1] in paths:
            continue
        renumber[i] = len(kept)
        kept.append(s)

    def fix(r):
        while r in replace:
            r = replace[r]
        if r[0] == "val":
            return ("val", renumber[r[1]], r[2])
        return r
    steps = [(k, p, o, n, [fix(r) for r in refs], c) for k, p, o, n, refs, c in kept]
    members = OrderedDict((p, m) for p, m in template.members.items() if p not in paths)
    return steps, members, [fix(r) for r in template.outputs]


def make_plan(graph, emitter):
    """The :class:`Plan` of ``graph`` for ``emitter``."""
    return Planner(graph, emitter).plan()
