"""Running a training program, the part every backend shares: which update reads which rows
of a step's batch, each group's learning rate, and what a step returns.

A step's batch holds, for each graph input, the examples of every update that reads it, in
program order: WGAN-GP's noise has (1 + n_critic) x batch rows (the generator update reads the
first batch of them), its real images n_critic x batch. A program of one update reads a plain
batch, so ResNet-50's batches are what they always were. Valid Python 3.6.
"""
from collections import OrderedDict

import numpy as np

from .. import schedules
from ..spec.graph import values_read
from ..spec.program import objective_values

__all__ = ["values_read", "objective_values", "inputs_of_phase", "updates", "rows_per_input",
           "split_step_batch", "learning_rate", "check_schedules", "step_result",
           "stacked_synthetic"]


def inputs_of_phase(graph, program, phase):
    """Graph inputs an update of ``phase`` reads, in graph order."""
    needed = values_read(graph, objective_values(program, phase["objective"]))
    return [name for name in graph.inputs if name in needed]


def updates(program):
    """[(phase index, repetition)] in the order a step runs them."""
    return [(i, r) for i, phase in enumerate(program.phases) for r in range(phase["repeat"])]


def rows_per_input(graph, program):
    """input -> how many batches of it one step reads."""
    rows = OrderedDict((name, 0) for name in graph.inputs)
    for index, phase in enumerate(program.phases):
        uses = phase["repeat"] if phase["batch"] == "own" else 1
        for name in inputs_of_phase(graph, program, phase):
            rows[name] += uses
    return rows


def split_step_batch(graph, program, batch):
    """The per-update batches of one step, as dicts of NumPy arrays (views, no copies).

    Raises ValueError naming the input whose row count does not divide into its updates."""
    rows = rows_per_input(graph, program)
    sizes = set()
    for name, uses in rows.items():
        if uses:
            n = len(batch[name])
            if n % uses:
                raise ValueError("batch[{!r}] has {} rows, which do not divide into the {} "
                                 "batches one step reads".format(name, n, uses))
            sizes.add(n // uses)
    if len(sizes) > 1:
        raise ValueError("the step's inputs give different batch sizes: {}".format(
            ", ".join("{}: {} rows for {} batches".format(k, len(batch[k]), u)
                      for k, u in rows.items() if u)))
    size = sizes.pop()
    offset = OrderedDict((name, 0) for name in rows)
    out = []
    for phase_index, phase in enumerate(program.phases):
        names = inputs_of_phase(graph, program, phase)
        for repeat in range(phase["repeat"]):
            out.append((phase_index, OrderedDict(
                (name, batch[name][offset[name]:offset[name] + size]) for name in names)))
            if phase["batch"] == "own" or repeat == phase["repeat"] - 1:
                for name in names:
                    offset[name] += size
    return out, size


def _schedule_hparams(group):
    hp = dict(group["schedule"])
    hp["lr_schedule"] = hp.pop("kind")
    hp["lr"] = group["optimizer"]["lr"]
    return hp


def learning_rate(group, step):
    """The group's scheduled learning rate before its update number ``step`` (from 0)."""
    return schedules.learning_rate(_schedule_hparams(group), step)


def check_schedules(program):
    """Every group's schedule evaluates at its first step (tbdzoo/schedules.py ``check``)."""
    for group in program.groups.values():
        schedules.check(_schedule_hparams(group))


def step_result(program, losses):
    """What ``train_step`` returns: the loss (a float) for a program of one objective, else
    {objective: its value at the objective's last update of the step}."""
    if len(program.objectives) == 1:
        return float(list(losses.values())[-1])
    return OrderedDict((name, float(losses[name])) for name in program.objectives)


def stacked_synthetic(make, graph, program, batch_size, seed):
    """A step's synthetic batch: ``make(batch_size, seed)`` drawn once per batch an input
    needs, stacked in program order."""
    rows = rows_per_input(graph, program)
    most = max(rows.values())
    draws = [make(batch_size, seed + k) for k in range(most)]
    return OrderedDict((name, np.concatenate([d[name] for d in draws[:uses]]))
                       for name, uses in rows.items() if uses)
