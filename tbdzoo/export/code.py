"""Small helpers every emitter writes Python with: literals, argument references, member
paths and the forward statements of a planned class (tbdzoo/export/plan.py)."""
from .plan import Arg, Lit


def pair(v):
    """An (h, w) pair as one number where both are equal, else as a tuple."""
    v = tuple(v)
    return v[0] if len(v) == 2 and v[0] == v[1] else v


def symmetric(pads):
    """((top, bottom), (left, right)) pads as (top, left) where each axis pads both sides
    alike, else None."""
    (t, b), (left, r) = pads
    return (t, left) if t == b and left == r else None


def layer_padding(pads):
    """What a convolution layer pads: pads alike on both sides of each axis as a pair (one
    number where equal), else 0 (the writer pads the input before the layer)."""
    sym = symmetric(pads)
    return pair(sym) if sym else 0


def literal(value):
    """``value`` as Python source: ints, floats (shortest repr that reads back equal), bools,
    None, strings and tuples of them."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return "float({!r})".format(repr(value))
        return repr(value)
    if isinstance(value, (tuple, list)):
        items = [literal(v) for v in value]
        return "({},)".format(items[0]) if len(items) == 1 else "({})".format(", ".join(items))
    return repr(value)


def value(v, forward=False):
    """A Lit or Arg as source: an argument reads as its name in ``__init__`` and as the
    attribute it is kept in (``self.name``) in ``forward``."""
    if isinstance(v, Arg):
        return "self." + v.name if forward else v.name
    if isinstance(v, Lit):
        return literal(v.value)
    return literal(v)


def is_lit(v):
    return isinstance(v, Lit)


def lit(v):
    return v.value


def member_ref(cls, path, owner="self"):
    """How a class's code reaches its member at ``path`` (``self.layer1[0].conv1``)."""
    parts = path.split(".")
    first = parts[0]
    out = "{}[{}]".format(owner, first) if cls is not None and cls.base == "list" else \
        "{}.{}".format(owner, first) if not first.isdigit() else "{}[{}]".format(owner, first)
    for part in parts[1:]:
        out += "[{}]".format(part) if part.isdigit() else "." + part
    return out


def members_in_order(cls):
    """The class's members, parents before the layers attached below them."""
    return sorted(cls.members.values(), key=lambda m: m.path.count("."))


class Lines:
    """Source lines with indentation."""

    def __init__(self):
        self.lines = []
        self.depth = 0

    def add(self, text=""):
        for line in text.split("\n"):
            self.lines.append(("    " * self.depth + line) if line else "")
        return self

    def indent(self):
        self.depth += 1
        return self

    def dedent(self):
        self.depth -= 1
        return self

    def text(self):
        return "\n".join(self.lines) + "\n"


def params_in_call_order(cls):
    """Constructor arguments: channel counts first (passed by position), then the rest."""
    first = [p for p in cls.params if p.family in ("channels", "vocab")]
    first.sort(key=lambda p: p.name != "in_channels")
    return first + [p for p in cls.params if p not in first]


def call_arguments(cls, values, forward=False):
    """The arguments of a call of ``cls``: channel counts by position, the rest by keyword."""
    parts = []
    for p in params_in_call_order(cls):
        v = value(values[p.name], forward)
        parts.append(v if p.family in ("channels", "vocab") else "{}={}".format(p.name, v))
    return ", ".join(parts)


def compress(items):
    """Consecutive equal item texts as (text, count)."""
    out = []
    for item in items:
        if out and out[-1][0] == item:
            out[-1][1] += 1
        else:
            out.append([item, 1])
    return out


def forward_statements(cls, lines, render_step):
    """The body of ``forward``: one statement per step (``render_step(step)`` gives the
    expression), optional members skipped when absent, then the return."""
    for step in cls.steps:
        expr = render_step(step)
        targets = ", ".join(step.outs) if step.outs else "_"
        if step.optional is not None:
            ref = member_ref(cls, step.path)
            if step.outs[0] != step.ins[0]:
                lines.add("{} = {}".format(step.outs[0], step.ins[0]))
            lines.add("if {} is not None:".format(ref))
            lines.indent().add("{} = {}".format(step.outs[0], expr)).dedent()
        else:
            lines.add("{} = {}".format(targets, expr))
    lines.add("return " + ", ".join(cls.outputs))


def member_expr(member, constructor, open_, close, repeat, depth=0):
    """The expression building ``member``: a layer by ``constructor(member)``, a block by its
    class, a sequence as ``open_ ... close`` around its items (runs of equal items written
    once with ``repeat``, a format of the item and the count), wrapped past 72 characters."""
    if member.kind == "layer":
        return constructor(member)
    if member.kind == "block":
        return "{}({})".format(member.cls.name, call_arguments(member.cls, member.values))
    items = compress([member_expr(i, constructor, open_, close, repeat, depth + 1)
                      for i in member.items])
    texts = [t if n == 1 else repeat.format(t, n) for t, n in items]
    inline = "{}{}{}".format(open_, ", ".join(texts), close)
    if len(inline) <= 72:
        return inline
    pad = "    " * (depth + 1)
    return "{}\n{}{},\n{}{}".format(open_, pad, (",\n" + pad).join(texts), "    " * depth, close)


def all_members(cls):
    """Every member of ``cls``, a sequence's items after the sequence, in order."""
    out = []

    def visit(m):
        out.append(m)
        for i in m.items:
            visit(i)
    for m in cls.members.values():
        visit(m)
    return out



def class_doc(cls, plan, root_doc):
    """A planned class's docstring: the root's is ``root_doc(cls, plan)`` (each framework says
    how its model is called); a block kind's names the kind, how many of it the model holds,
    and the planner's note."""
    if cls is plan.root:
        return root_doc(cls, plan)
    text = "{} ({} in this model).".format(cls.kind, cls.count) if cls.count > 1 else \
        "{}.".format(cls.kind)
    return text + ("\n\n" + cls.note + ".\n" if cls.note else "")


def root_doc(cls, plan, call, dtype_name=str):
    """The root class's docstring where the model is called as ``call`` (``forward``,
    ``__call__``) on arrays of the spec's layout: its inputs (``dtype_name`` names each one's
    dtype), its output, the targets step a program's parts leave to the caller, and the parts
    the call does not run."""
    g = plan.graph
    lines = ["{}, as tbdzoo's specification builds it.".format(cls.kind), "",
             "{}({}) takes:".format(call, ", ".join(cls.inputs))]
    written = set(g.program.written_inputs()) if g.program is not None else set()
    for name, node in zip(cls.inputs, cls.input_nodes):
        inp = g.inputs[node]
        note = " (from the training program's targets step)" if node in written else ""
        lines.append("  {}: {} of shape (N, {}){}".format(
            name, dtype_name(inp.dtype), ", ".join(str(d) for d in inp.shape),
            note).replace(", )", ")"))
    lines.append("and returns {} of shape (N, {}).".format(
        g.output, ", ".join(str(d) for d in g.shape_of(g.output))).replace(", )", ")"))
    if any(node in written for node in cls.input_nodes):
        lines.append("The targets step is a function you supply between the parts (tbdzoo's is "
                     "NumPy code in")
        lines.append("tbdzoo.models.{}); it reads the parts' outputs.".format(g.name))
    for path, block in getattr(plan, "parts", ()):
        lines.append("Also a part of the model, not called by {}: self.{}({}) -> {}.".format(
            call, path, ", ".join(block.inputs), ", ".join(block.outputs)))
    return "\n".join(lines) + "\n"


def arguments(items, positional, defaults):
    """A constructor's arguments from (name, value) ``items``: the first ``positional`` by
    position, the others as ``name=value``, left out where a literal equals (with its type)
    the name's value in ``defaults``."""
    parts = [value(v) for _, v in items[:positional]]
    for k, v in items[positional:]:
        if is_lit(v) and k in defaults and lit(v) == defaults[k] and \
                type(lit(v)) is type(defaults[k]):
            continue
        parts.append("{}={}".format(k, value(v)))
    return parts


def scaled_call(ref, x, scale):
    """``ref(x)`` times ``scale`` (an embedding's output scale), left out at a literal 1.0."""
    if is_lit(scale) and lit(scale) == 1.0:
        return "{}({})".format(ref, x)
    return "{}({}) * {}".format(ref, x, value(scale, True))


def used_names(plan, render_op):
    """(layer types the classes hold, names of the helpers their ops need): ``render_op(step,
    helpers)`` adds to ``helpers`` what an op step's code calls."""
    types, helpers = set(), set()
    for cls in plan.classes:
        for m in all_members(cls):
            if m.kind == "layer":
                types.add(m.type)
        for step in cls.steps:
            if step.kind == "op":
                render_op(step, helpers)
    return types, helpers


def add_texts(lines, texts, used):
    """Each text of ``texts`` (name -> source) whose name is in ``used``, two blank lines
    after each."""
    for name, text in texts.items():
        if name in used:
            lines.add(text.strip("\n")).add().add()


def add_members(cls, lines, expr_of, append):
    """``__init__``'s statements making the members of ``cls``: ``expr_of(member)`` builds one
    (None where an optional one's flag is false); a list class's own items are added with
    ``append``, a format of the expression."""
    for m in members_in_order(cls):
        expr = expr_of(m)
        if m.optional is not None:
            expr = "{} if {} else None".format(expr, m.optional.name)
        if cls.base == "list" and "." not in m.path:
            lines.add(append.format(expr))
        else:
            lines.add("{} = {}".format(member_ref(cls, m.path), expr))


def add_forward(cls, lines, render_op, layer_call, block_call="{}({})", ref=member_ref):
    """The body of ``cls``'s forward (:func:`forward_statements`): an op step's expression is
    ``render_op(step)``, a layer's ``layer_call(cls, member, inputs)``, a block's
    ``block_call`` of the member's reference (``ref(cls, path)``) and the inputs."""
    def render(step):
        if step.kind == "op":
            return render_op(step)
        if step.kind == "layer":
            return layer_call(cls, cls.members[step.path], step.ins)
        return block_call.format(ref(cls, step.path), ", ".join(step.ins))
    forward_statements(cls, lines, render)


def add_build(lines, root, load):
    """The file's ``load`` function's source, then ``build(weights=None)``: a new ``root``,
    holding tbdzoo's weights file if given."""
    lines.add(load.strip("\n")).add().add()
    lines.add("def build(weights=None):").indent()
    lines.add('"""A new {}, with the weights of tbdzoo\'s .npz file ``weights`` if given."""'.format(
        root.name))
    lines.add("model = {}()".format(root.name))
    lines.add("return load(model, weights) if weights is not None else model").dedent()


def add_title(lines, framework, model_name, version, config, root,
              built="{}() with tbdzoo's weights file loaded"):
    """The file docstring's first lines: what the file is, and how ``build`` makes the model
    (``built``, a format of the root class's name, says what it gives)."""
    lines.add('"""{} in {}, written by tbdzoo {} from its specification (config {!r}).'.format(
        model_name, framework, version, config))
    lines.add("")
    lines.add("    model = build(\"{}.npz\")   # {}".format(model_name, built.format(root.name)))
