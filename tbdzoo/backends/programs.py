"""Running a training program, the part every backend shares: which update reads which rows
of a step's batch, each group's learning rate, and what a step returns.

A step's batch holds, for each graph input, the examples of every update that reads it, in
program order: WGAN-GP's noise has (1 + n_critic) x batch rows (the generator update reads the
first batch of them), its real images n_critic x batch. A program of one update reads a plain
batch, so ResNet-50's batches are what they always were.

A program with a ``targets`` step (docs/programs.md) writes some graph inputs itself: a step's
batch then leaves them out, and an update that reads them reads instead the inputs its targets
function needs. A batch that holds every written input replays them: the function is skipped.
Valid Python 3.6.
"""
from collections import OrderedDict

import numpy as np

from .. import schedules
from ..spec import targets as _targets
from ..spec.program import objective_values
from ..spec.reads import values_read

__all__ = ["values_read", "objective_values", "inputs_of_phase", "updates", "rows_per_input",
           "split_step_batch", "learning_rate", "check_schedules", "step_result",
           "stacked_synthetic", "replays_targets", "reads_targets", "targets_inputs", "call_targets"]


def replays_targets(program, batch):
    """True when ``batch`` holds every input the targets step writes (it is then skipped);
    False when it holds none of them or the program has no targets step."""
    written = program.written_inputs() if program is not None else []
    given = [name for name in written if name in batch]
    if given and len(given) != len(written):
        raise ValueError("the batch holds written input(s) {} but not {}: give all of the "
                         "targets step's inputs (to replay them) or none".format(
                             ", ".join(given), ", ".join(n for n in written if n not in given)))
    return bool(written) and len(given) == len(written)


def reads_targets(graph, program, phase):
    """True when an update of ``phase`` reads an input the targets step writes."""
    needed = values_read(graph, objective_values(program, phase["objective"]))
    return any(name in needed for name in program.written_inputs())


def targets_inputs(graph, program):
    """Graph inputs the targets step needs: those its reads depend on and its batch inputs."""
    step = program.targets_step
    needed = values_read(graph, step["reads"]) | set(step["inputs"])
    return [name for name in graph.inputs if name in needed]


def inputs_of_phase(graph, program, phase, replay=False):
    """Graph inputs an update of ``phase`` reads from the step's batch, in graph order: without
    ``replay``, the written inputs are left out and the targets step's own inputs come in."""
    needed = values_read(graph, objective_values(program, phase["objective"]))
    if program.targets_step is not None and not replay and reads_targets(graph, program, phase):
        needed = (needed | set(targets_inputs(graph, program))) - set(program.written_inputs())
    return [name for name in graph.inputs if name in needed]


def updates(program):
    """[(phase index, repetition)] in the order a step runs them."""
    return [(i, r) for i, phase in enumerate(program.phases) for r in range(phase["repeat"])]


def rows_per_input(graph, program, replay=False):
    """input -> how many batches of it one step reads (``replay``: the batch holds the targets
    step's written inputs)."""
    rows = OrderedDict((name, 0) for name in graph.inputs)
    for phase in program.phases:
        uses = phase["repeat"] if phase["batch"] == "own" else 1
        for name in inputs_of_phase(graph, program, phase, replay):
            rows[name] += uses
    return rows


def split_step_batch(graph, program, batch):
    """The per-update batches of one step, as dicts of NumPy arrays (views, no copies).

    Raises ValueError naming the input whose row count does not divide into its updates."""
    replay = replays_targets(program, batch)
    rows = rows_per_input(graph, program, replay)
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
        names = inputs_of_phase(graph, program, phase, replay)
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


def call_targets(graph, program, values, inputs, hparams, rng):
    """The targets step's function on one update's batch (``values``: the read values by name,
    or a HostValues): {written input: NumPy array, or a DeviceArray a lent kernel left on its
    device} in the inputs' dtypes, checked against the spec's per-example shapes and the batch
    size."""
    step = program.targets_step
    if not isinstance(values, _targets.HostValues):
        values = _targets.HostValues.of_arrays(OrderedDict((n, values[n]) for n in step["reads"]))
    rows = values.shape(step["reads"][0])[0]
    out = _targets.get(step["function"])(values, inputs, hparams, rng)
    where = "targets function {!r} (step {!r})".format(step["function"], step["name"])
    if not isinstance(out, dict) or set(out) != set(step["writes"]):
        raise ValueError("{} must return {{{}}}, got {}".format(
            where, ", ".join(step["writes"]),
            sorted(out) if isinstance(out, dict) else type(out).__name__))
    written = OrderedDict()
    for name in step["writes"]:
        inp = graph.inputs[name]
        dtype = np.dtype(np.int32 if inp.dtype == "int32" else np.float32)
        array = out[name]  # a DeviceArray of the input's dtype stays on its device
        if not (isinstance(array, _targets.DeviceArray) and array.dtype == dtype):
            array = np.asarray(array).astype(dtype, copy=False)
        if array.shape != (rows,) + tuple(inp.shape):
            raise ValueError("{} wrote {!r} of shape {}, expected {}".format(
                where, name, array.shape, (rows,) + tuple(inp.shape)))
        written[name] = array
    return written
