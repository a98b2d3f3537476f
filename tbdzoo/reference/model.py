"""A model run by the reference alone: its spec, initial weights and synthetic batches (the same
as every backend's for a seed), inference, the training objectives, the targets step and one
optimizer per parameter group, all in float64 NumPy. It computes no gradients: ``tbd
consistency`` checks a backend's gradients against central differences of :meth:`objective`
and steps the reference optimizers with them (tbdzoo/consistency.py)."""
from collections import OrderedDict

import numpy as np

from .. import schedules
from ..backends import programs
from ..models import get_model
from ..spec import initial_weights
from ..spec.program import objective_values
from ..spec.targets import StepRandomState
from . import graph as reference_graph
from .optimizers import Group


class Model:
    """``name`` at ``config`` (with ``overrides``), weights initialised from ``seed``."""

    def __init__(self, name, config="tiny", seed=0, **overrides):
        self.model_def = get_model(name)
        self.name = self.model_def.name
        self.hparams = self.model_def.hparams(config, **overrides)
        self.spec = self.model_def.build_graph(self.hparams)
        self.seed = seed
        self.weights = OrderedDict((k, np.asarray(v, np.float64))
                                   for k, v in initial_weights(self.spec, seed).items())

    @property
    def program(self):
        return self.spec.program

    def synthetic_batch(self, seed=0):
        """The batch every backend's ``synthetic_batch(seed)`` gives (tbdzoo/backends/base.py)."""
        size = self.hparams["batch_size"]
        if self.program is not None and len(programs.updates(self.program)) > 1:
            return programs.stacked_synthetic(
                lambda n, s: self.model_def.synthetic_batch(self.hparams, n, s),
                self.spec, self.program, size, seed)
        return self.model_def.synthetic_batch(self.hparams, size, seed)

    # -- inference ---------------------------------------------------------------------------
    def _check_batch(self, batch, names):
        """The batch as NumPy arrays (a model's inference hook calls this; the reference trusts
        batches its backends have checked)."""
        return OrderedDict((n, np.asarray(batch[n])) for n in names)

    def values(self, batch, names, weights=None):
        """{node name: float64 value} in inference mode."""
        out = reference_graph.forward(self.spec, self.weights if weights is None else weights,
                                      batch, training=False, names=list(names))
        return OrderedDict((n, out[n]) for n in names)

    def predict(self, batch):
        """The graph's output in inference mode, or what the model's inference hook returns."""
        if getattr(self.model_def, "inference", None) is not None:
            return self.model_def.inference(self, batch)
        return self.values(batch, [self.spec.output])[self.spec.output]

    # -- training ----------------------------------------------------------------------------
    def updates(self, batch):
        """[(phase index, the update's batch)] of one step, in order; [(None, batch)] for a
        graph of one loss."""
        if self.program is None:
            return [(None, batch)]
        return programs.split_step_batch(self.spec, self.program, batch)[0]

    def objective_name(self, phase_index):
        return "loss" if phase_index is None else self.program.phases[phase_index]["objective"]

    def _objective_nodes(self, phase_index):
        if phase_index is None:
            return [self.spec.loss["logits"]]
        return [v for v in objective_values(self.program, self.objective_name(phase_index))
                if v in self.spec.nodes]

    def stopped(self, phase_index, batch, weights=None):
        """{stop_gradient node: its training-mode value} for the objective of phase
        ``phase_index`` on ``batch``: what :meth:`objective` holds fixed (``held``) so that its
        derivative is the one a backend's gradient is."""
        weights = self.weights if weights is None else weights
        outputs = reference_graph.forward(self.spec, weights, batch, training=True,
                                          names=self._objective_nodes(phase_index))
        return OrderedDict((n, v) for n, v in outputs.items()
                           if self.spec.nodes[n].op == "stop_gradient")

    def objective(self, phase_index, batch, weights=None, held=None):
        """The training-mode value of the objective phase ``phase_index`` (None: the graph's
        loss) minimises, on ``batch`` (one update's); ``held``: node values held fixed."""
        weights = self.weights if weights is None else weights
        outputs = reference_graph.forward(self.spec, weights, batch, training=True,
                                          names=self._objective_nodes(phase_index), held=held)
        if phase_index is None:
            return reference_graph.loss(self.spec, outputs, batch)
        return reference_graph.objective(self.spec, self.objective_name(phase_index), outputs,
                                         batch)

    def losses(self, batch, weights=None):
        """What a backend's ``loss_and_gradients`` returns as its loss: a float, or {objective:
        value on its phase's first batch} for a program of several objectives."""
        firsts = OrderedDict()
        for phase_index, part in self.updates(batch):
            firsts.setdefault(self.objective_name(phase_index),
                              self.objective(phase_index, part, weights))
        if self.program is None:
            return firsts["loss"]
        return programs.step_result(self.program, firsts)

    def groups(self):
        """{group: (trainable names, phase indices updating it)} in the program's order; one
        group "all" of every trainable parameter for a graph of one loss."""
        trainable = [n for n, p in self.spec.params().items() if p.trainable]
        if self.program is None:
            return OrderedDict([("all", (trainable, [None]))])
        owner = self.program.assignment(self.spec)
        return OrderedDict(
            (g, ([n for n in trainable if owner[n] == g],
                 [i for i, p in enumerate(self.program.phases) if p["update"] == g]))
            for g in self.program.groups)

    def optimizer_groups(self):
        """{group: optimizers.Group} at step 0: each group's optimizer, clipping and schedule."""
        out = OrderedDict()
        for name, (names, _) in self.groups().items():
            if self.program is None:
                hp = self.hparams
                out[name] = Group(names, hp, None,
                                  lambda step, hp=hp: schedules.learning_rate(hp, step))
            else:
                group = self.program.groups[name]
                out[name] = Group(names, group["optimizer"], group["clip"],
                                  lambda step, group=group: programs.learning_rate(group, step))
        return out

    def hooks(self, phase_index):
        return [] if phase_index is None else self.program.phases[phase_index]["hooks"]

    # -- the targets step --------------------------------------------------------------------
    def step_targets(self, batch, step=0):
        """The written inputs of the program's targets step for ``batch`` at step ``step``,
        stacked as a step's batch holds them (as a backend's ``step_targets``)."""
        program = self.program
        if program is None or program.targets_step is None:
            raise ValueError("{} has no targets step".format(self.name))
        target_step = program.targets_step
        needed = programs.targets_inputs(self.spec, program)
        kept, done = [], set()
        for index, (phase_index, part) in enumerate(self.updates(batch)):
            phase = program.phases[phase_index]
            if not programs.reads_targets(self.spec, program, phase) or \
                    (phase["batch"] != "own" and phase_index in done):
                done.add(phase_index)
                continue
            done.add(phase_index)
            values = self.values(OrderedDict((n, part[n]) for n in needed), target_step["reads"])
            rng = StepRandomState(self.seed, step, "targets/" + target_step["name"], index)
            inputs = OrderedDict((n, np.asarray(part[n])) for n in target_step["inputs"])
            kept.append(programs.call_targets(self.spec, program, values, inputs, self.hparams,
                                              rng))
        return OrderedDict((name, np.concatenate([np.asarray(k[name]) for k in kept]))
                           for name in program.written_inputs())


def step_batch(model, parts):
    """A step's batch holding ``parts`` ([(phase index, update batch)], as ``updates`` gives
    them, possibly reordered within a phase) in the layout a step reads: each input's rows in
    update order, a phase with a shared batch counted once."""
    if model.program is None:
        return parts[0][1]
    rows, seen = OrderedDict(), set()
    for phase_index, part in parts:
        if model.program.phases[phase_index]["batch"] != "own" and phase_index in seen:
            continue
        seen.add(phase_index)
        for name, value in part.items():
            rows.setdefault(name, []).append(np.asarray(value))
    return OrderedDict((name, np.concatenate(rows[name])) for name in model.spec.inputs
                       if name in rows)
