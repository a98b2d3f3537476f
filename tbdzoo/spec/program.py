"""Training programs: what one training step of a model does, written as data.

A graph says how values are computed; a program says how the model learns from them:

  losses      named loss terms, each a registered kind over named graph values
              (``softmax_cross_entropy(logits=fc, labels=labels)``, ``mean(x=critic.out)``)
  objectives  named weighted sums of loss terms (``total = main + 0.4 aux``)
  groups      named parameter groups, each with its own optimizer, schedule, gradient
              clipping and step counter; a parameter belongs to exactly one group
  phases      the step, in order: which objective updates which group, how many times,
              each repetition on a batch of its own or on the same one, and the hooks that
              run after each update (weight clipping)
  targets     optional, before the phases: a registered NumPy function (spec/targets.py)
              that reads graph values and writes graph inputs (sampled boxes and labels)

Everything is plain JSON, validated against the graph when the program is attached, and part
of the graph's hash. A backend compiles it once: one gradient function per (objective, group)
pair, one optimizer per group. A phase differentiates its objective with respect to its group
only, which is the stop-gradient that alternating training needs (the critic's update does
not touch the generator).

Valid Python 3.6: the CNTK worker imports it.
"""
from collections import OrderedDict

from . import losses as _losses
from . import targets as _targets
from .optimizers import OPTIMIZERS
from .reads import values_read

# name -> the fields of a group's optimizer entry: its learning rate, then the table's
# hyperparameters (tbdzoo/spec/optimizers.py)
OPTIMIZER_FIELDS = OrderedDict((name, ("lr",) + o.hyperparameters)
                               for name, o in OPTIMIZERS.items())
CLIP_KINDS = ("global_norm", "value")
HOOK_KINDS = ("clip_weights",)
BATCH_MODES = ("own", "shared")


class ProgramError(ValueError):
    """A program that does not fit its graph; the message names the part at fault."""


class Program:
    """Build with :meth:`loss`, :meth:`objective`, :meth:`group` and :meth:`phase`."""

    def __init__(self):
        self.losses = OrderedDict()
        self.objectives = OrderedDict()
        self.groups = OrderedDict()
        self.phases = []
        self.targets_step = None

    # -- building -----------------------------------------------------------------------
    def loss(self, name, kind, **inputs_and_attrs):
        """A loss term: ``kind``'s input roles name graph values, the rest are attributes."""
        self._new(name, self.losses, "loss")
        definition = _losses.get(kind)
        inputs = OrderedDict((role, inputs_and_attrs.pop(role)) for role in definition.inputs
                             if role in inputs_and_attrs)
        missing = [r for r in definition.inputs if r not in inputs and r not in definition.optional]
        if missing:
            raise ProgramError("loss {!r} ({}) needs input(s) {}".format(name, kind, ", ".join(missing)))
        attrs = definition.normalize(inputs_and_attrs, name)
        self.losses[name] = OrderedDict([("kind", kind), ("inputs", inputs), ("attrs", attrs)])
        return name

    def objective(self, name, terms):
        """``terms``: {loss name: weight} or [(loss name, weight)]; weights are plain floats."""
        self._new(name, self.objectives, "objective")
        items = list(terms.items()) if isinstance(terms, dict) else [tuple(t) for t in terms]
        if not items:
            raise ProgramError("objective {!r} has no terms".format(name))
        for loss, weight in items:
            if loss not in self.losses:
                raise ProgramError("objective {!r}: unknown loss {!r}; known: {}".format(
                    name, loss, ", ".join(self.losses)))
            if not isinstance(weight, (int, float)) or isinstance(weight, bool):
                raise ProgramError("objective {!r}: weight of {!r} must be a number, not {!r}"
                                   .format(name, loss, weight))
        self.objectives[name] = [[loss, float(weight)] for loss, weight in items]
        return name

    def group(self, name, include, optimizer, schedule=None, clip=None):
        """Parameters whose node name equals or starts with ``prefix.`` for a prefix in
        ``include`` ('*' takes every trainable parameter no other group took)."""
        self._new(name, self.groups, "group")
        include = [include] if isinstance(include, str) else list(include)
        optimizer = OrderedDict(sorted(dict(optimizer).items()))
        kind = optimizer.get("kind")
        if kind not in OPTIMIZER_FIELDS:
            raise ProgramError("group {!r}: optimizer kind {!r}; known: {}".format(
                name, kind, ", ".join(OPTIMIZER_FIELDS)))
        missing = [f for f in OPTIMIZER_FIELDS[kind] if f not in optimizer]
        extra = sorted(set(optimizer) - set(OPTIMIZER_FIELDS[kind]) - {"kind"})
        if missing or extra:
            raise ProgramError("group {!r}: {} takes exactly {}; missing {}, unknown {}".format(
                name, kind, ", ".join(OPTIMIZER_FIELDS[kind]), missing or "none", extra or "none"))
        if clip is not None:
            clip = OrderedDict(sorted(dict(clip).items()))
            if set(clip) != {"kind", "value"} or clip["kind"] not in CLIP_KINDS or \
                    not clip["value"] > 0:
                raise ProgramError("group {!r}: clip must be {{'kind': one of {}, 'value': > 0}}, "
                                   "not {!r}".format(name, CLIP_KINDS, dict(clip)))
        schedule = OrderedDict(sorted(dict(schedule or {"kind": "constant"}).items()))
        self.groups[name] = OrderedDict([("include", include), ("optimizer", optimizer),
                                         ("schedule", schedule), ("clip", clip)])
        return name

    def phase(self, name, objective, update, repeat=1, batch="own", hooks=()):
        """``repeat`` updates of group ``update`` on ``objective``; with ``batch='own'`` each
        repetition reads a batch of its own, with 'shared' all read the phase's one batch."""
        if any(p["name"] == name for p in self.phases):
            raise ProgramError("phase {!r} is defined twice".format(name))
        if objective not in self.objectives:
            raise ProgramError("phase {!r}: unknown objective {!r}; known: {}".format(
                name, objective, ", ".join(self.objectives)))
        if update not in self.groups:
            raise ProgramError("phase {!r}: unknown group {!r}; known: {}".format(
                name, update, ", ".join(self.groups)))
        if not isinstance(repeat, int) or isinstance(repeat, bool) or repeat < 1:
            raise ProgramError("phase {!r}: repeat must be an integer >= 1, not {!r}".format(
                name, repeat))
        if batch not in BATCH_MODES:
            raise ProgramError("phase {!r}: batch must be one of {}, not {!r}".format(
                name, BATCH_MODES, batch))
        checked = []
        for hook in hooks:
            hook = OrderedDict(sorted(dict(hook).items()))
            if hook.get("kind") not in HOOK_KINDS:
                raise ProgramError("phase {!r}: hook kind {!r}; known: {}".format(
                    name, hook.get("kind"), ", ".join(HOOK_KINDS)))
            if hook.get("group") not in self.groups or not hook.get("value", 0) > 0 or \
                    set(hook) != {"kind", "group", "value"}:
                raise ProgramError("phase {!r}: clip_weights needs a known 'group' and a "
                                   "'value' > 0, not {!r}".format(name, dict(hook)))
            checked.append(hook)
        self.phases.append(OrderedDict([("name", name), ("objective", objective),
                                        ("update", update), ("repeat", repeat),
                                        ("batch", batch), ("hooks", checked)]))
        return name

    def targets(self, name, function, reads, writes, inputs=()):
        """The step before the phases: registered ``function`` reads graph nodes ``reads``
        (and batch inputs ``inputs``) and writes graph inputs ``writes``, which the user's
        batch then need not hold."""
        if self.targets_step is not None:
            raise ProgramError("the program already has targets step {!r}; a program has one"
                               .format(self.targets_step["name"]))
        self._new(name, {}, "targets step")
        try:
            _targets.get(function)
        except KeyError as e:
            raise ProgramError("targets step {!r}: {}".format(name, e.args[0])) from e
        lists = OrderedDict()
        for field, value in (("reads", reads), ("writes", writes), ("inputs", inputs)):
            value = [value] if isinstance(value, str) else list(value)
            if not all(isinstance(v, str) and v for v in value) or len(set(value)) != len(value):
                raise ProgramError("targets step {!r}: {} must be distinct names, not {!r}"
                                   .format(name, field, value))
            lists[field] = value
        if not lists["reads"] or not lists["writes"]:
            raise ProgramError("targets step {!r} needs at least one read and one write"
                               .format(name))
        self.targets_step = OrderedDict([("name", name), ("function", function)])
        self.targets_step.update(lists)
        return name

    def _new(self, name, table, what):
        if not isinstance(name, str) or not name or "/" in name:
            raise ProgramError("{} name {!r} must be a non-empty string without '/'".format(what, name))
        if name in table:
            raise ProgramError("{} {!r} is defined twice".format(what, name))

    # -- checking against a graph -------------------------------------------------------
    def check(self, graph):
        """Every name resolves, every trainable parameter has one group, every group and
        objective is used; raises ProgramError naming the first fault."""
        if not self.phases:
            raise ProgramError("program of {!r} has no phases".format(graph.name))
        values = set(graph.nodes) | set(graph.inputs)
        for name, loss in self.losses.items():
            for role, value in loss["inputs"].items():
                if value not in values:
                    raise ProgramError("loss {!r}: {} {!r} is not a node or input of {!r}".format(
                        name, role, value, graph.name))
            _losses.get(loss["kind"]).check(graph, loss["inputs"], loss["attrs"], name)
        self.assignment(graph)
        if self.targets_step is not None:
            self._check_targets(graph)
        used = set(p["update"] for p in self.phases) | set(
            h["group"] for p in self.phases for h in p["hooks"])
        unused = [g for g in self.groups if g not in used]
        if unused:
            raise ProgramError("group(s) {} are never updated by a phase".format(", ".join(unused)))
        idle = [o for o in self.objectives if o not in set(p["objective"] for p in self.phases)]
        if idle:
            raise ProgramError("objective(s) {} are never used by a phase".format(", ".join(idle)))
        return self

    def _check_targets(self, graph):
        """Reads are nodes, inputs and writes are graph inputs, nothing read depends on what
        is written (no cycle), and some phase reads a written input."""
        step = self.targets_step
        where = "targets step {!r}".format(step["name"])
        for read in step["reads"]:
            if read not in graph.nodes:
                raise ProgramError("{}: read {!r} is not a node of {!r}".format(
                    where, read, graph.name))
        for field in ("writes", "inputs"):
            for name in step[field]:
                if name not in graph.inputs:
                    raise ProgramError("{}: {} {!r} is not an input of {!r}; a targets step {} "
                                       "graph inputs only".format(
                                           where, field[:-1], name, graph.name,
                                           "writes" if field == "writes" else "reads batch"))
        both = [n for n in step["inputs"] if n in step["writes"]]
        if both:
            raise ProgramError("{}: {} both read from the batch and written".format(
                where, ", ".join(both)))
        for read in step["reads"]:
            cycle = [w for w in step["writes"] if w in values_read(graph, [read])]
            if cycle:
                raise ProgramError("{}: read {!r} depends on written input(s) {}: the values "
                                   "read must be computable before the step writes them".format(
                                       where, read, ", ".join(cycle)))
        read_by_phases = values_read(graph, [v for p in self.phases
                                             for v in objective_values(self, p["objective"])])
        if not any(w in read_by_phases for w in step["writes"]):
            raise ProgramError("{}: no phase's objective reads its written input(s) {}".format(
                where, ", ".join(step["writes"])))

    def written_inputs(self):
        """The graph inputs the targets step writes (none without one)."""
        return list(self.targets_step["writes"]) if self.targets_step is not None else []

    def assignment(self, graph):
        """OrderedDict trainable parameter name -> group name (prefixes first, then '*')."""
        trainable = [n for n, p in graph.params().items() if p.trainable]
        owner = OrderedDict()
        for group, spec in self.groups.items():
            prefixes = [p for p in spec["include"] if p != "*"]
            for prefix in prefixes:
                matched = [n for n in trainable if graph.params()[n].owner == prefix
                           or graph.params()[n].owner.startswith(prefix + ".")]
                if not matched:
                    raise ProgramError("group {!r}: prefix {!r} matches no trainable parameter"
                                       .format(group, prefix))
                for n in matched:
                    if n in owner and owner[n] != group:
                        raise ProgramError("parameter {!r} is in groups {!r} and {!r}".format(
                            n, owner[n], group))
                    owner[n] = group
        wildcard = [g for g, s in self.groups.items() if "*" in s["include"]]
        if len(wildcard) > 1:
            raise ProgramError("only one group may include '*'; {} do".format(", ".join(wildcard)))
        for n in trainable:
            if n not in owner:
                if not wildcard:
                    raise ProgramError("parameter {!r} belongs to no group".format(n))
                owner[n] = wildcard[0]
        return OrderedDict((n, owner[n]) for n in trainable)

    def updates_per_step(self):
        return sum(p["repeat"] for p in self.phases)

    # -- serialisation ------------------------------------------------------------------
    def to_json(self):
        out = OrderedDict([("losses", self.losses), ("objectives", self.objectives),
                           ("groups", self.groups), ("phases", self.phases)])
        if self.targets_step is not None:  # absent otherwise: older programs keep their hash
            out["targets"] = self.targets_step
        return out

    @classmethod
    def from_json(cls, data):
        p = cls()
        for name, loss in data["losses"].items():
            kw = dict(loss["inputs"])
            kw.update(loss["attrs"])
            p.loss(name, loss["kind"], **kw)
        for name, terms in data["objectives"].items():
            p.objective(name, terms)
        for name, g in data["groups"].items():
            p.group(name, g["include"], g["optimizer"], g["schedule"], g["clip"])
        for phase in data["phases"]:
            p.phase(phase["name"], phase["objective"], phase["update"], phase["repeat"],
                    phase["batch"], phase["hooks"])
        step = data.get("targets")
        if step is not None:
            p.targets(step["name"], step["function"], step["reads"], step["writes"],
                      step["inputs"])
        return p


def objective_values(program, objective):
    """The graph values an objective's losses read."""
    out = []
    for loss, _ in program.objectives[objective]:
        out.extend(program.losses[loss]["inputs"].values())
    return out


def optimizer_of(hp):
    """The optimizer entry of a group from a model's flat hyperparameters."""
    kind = hp["optimizer"]
    if kind not in OPTIMIZER_FIELDS:
        raise ProgramError("optimizer {!r}; known: {}".format(kind, ", ".join(OPTIMIZER_FIELDS)))
    out = OrderedDict([("kind", kind)])
    for field in OPTIMIZER_FIELDS[kind]:
        out[field] = hp[field]
    return out


def schedule_of(hp):
    """The schedule entry of a group: the schedule's kind and the hyperparameters it reads."""
    kind = hp["lr_schedule"]
    reads = {"constant": (), "step": ("lr_decay", "lr_milestones", "steps_per_epoch"),
             "inverse_sqrt": ("d_model", "warmup_steps"),
             "exponential": ("lr_decay", "decay_epochs", "steps_per_epoch"),
             "linear": ("anneal_steps",)}
    if kind not in reads:
        raise ProgramError("lr_schedule {!r}; known: {}".format(kind, ", ".join(sorted(reads))))
    out = OrderedDict([("kind", kind)])
    for field in reads[kind]:
        value = hp[field]
        out[field] = list(value) if isinstance(value, tuple) else value
    return out


def clip_of(hp):
    """The gradient clipping of a group from a model's flat hyperparameters: ``grad_clip_norm``
    (the global norm) or ``grad_clip_value`` (element-wise), whichever the model has and sets
    above 0; None for neither."""
    if hp.get("grad_clip_norm") and hp.get("grad_clip_value"):
        raise ProgramError("grad_clip_norm {} and grad_clip_value {} are both set, but a group "
                           "clips one way; set the other to 0".format(hp["grad_clip_norm"],
                                                                     hp["grad_clip_value"]))
    if hp.get("grad_clip_norm"):
        return OrderedDict([("kind", "global_norm"), ("value", hp["grad_clip_norm"])])
    if hp.get("grad_clip_value"):
        return OrderedDict([("kind", "value"), ("value", hp["grad_clip_value"])])
    return None


def single_objective(graph, hp, loss_kind, clip=None, name="loss", **loss_inputs):
    """The program of a model with one loss, one group of every parameter and one update per
    step: loss and objective ``name`` of kind ``loss_kind`` reading ``loss_inputs`` (values
    and attributes, as Program.loss takes them), group "all" under the optimizer and schedule
    of ``hp`` and ``clip`` (clip_of(hp) reads it from the hyperparameters), phase "train"."""
    p = Program()
    p.loss(name, loss_kind, **loss_inputs)
    p.objective(name, {name: 1.0})
    p.group("all", "*", optimizer_of(hp), schedule_of(hp), clip)
    p.phase("train", name, "all")
    return p.check(graph)
