"""The interface every backend's model offers, and the parts of it that are the same everywhere.

A backend subclasses :class:`BackendModel` and implements the underscored methods, all in
canonical NumPy at the boundary:

  _build(weights)                 create ``self.native`` holding ``weights`` (canonical dict)
  _prepare(batch)                 NumPy batch -> whatever the native step consumes
  _train_step(prepared, lr)       one optimizer step; returns the loss as a float
  _predict(prepared)              inference-mode output of the graph's output node, NumPy
  _loss_and_gradients(prepared)   training-mode loss and canonical gradients, no update
  _get_weights()                  canonical dict of every parameter and statistic
  _set_weights(weights)           assign a validated canonical dict

A backend that runs training programs (tbdzoo/spec/program.py) sets RUNS_PROGRAMS and adds:

  _update(phase_index, native, lr)   one update of the phase's group on its objective; returns
                                     the objective's value (a float or a device scalar)
  _program_gradients(prepared)       ({objective: value}, canonical gradients) without updates
  _values(prepared, names)           {node name: NumPy value} in inference mode, for a
                                     program's targets step (docs/programs.md)

The optimizers every backend implements are defined once (tbdzoo/backends/common/optimizers.py)
so that three steps on any backend give the same trajectory. :func:`check_buildable` is the one
construction check, run by in-process models, worker-backed ones (before the worker starts) and
the worker itself.
"""
import importlib
import os
import time
from collections import OrderedDict
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from .. import schedules
from .. import weights as weights_io
from ..errors import NonFiniteStepError, UnsupportedOptionError
from ..models.constraints import integer
from ..profiling.profile import resident_bytes
from ..spec import initial_weights
from ..spec.program import Program
from ..spec.targets import StepRandomState
from . import programs
from .common import batches, op_support, optimizers
from .info import backend_info

OPTIMIZERS = optimizers.NAMES  # their formulas: tbdzoo/backends/common/optimizers.py

# The public methods' annotations: a batch maps input names to arrays (NumPy, or what
# np.asarray takes); weights and gradients map canonical parameter names to NumPy arrays.
Batch = Mapping[str, Any]
Arrays = Dict[str, np.ndarray]
PathLike = Union[str, bytes, "os.PathLike"]  # weights.path_of's rule


def check_buildable(model_def, hparams, backend):
    """The spec of ``model_def`` under ``hparams``, once every check that needs no framework
    has passed: the optimizer and schedule exist, and ``backend`` implements every op."""
    spec = model_def.build_graph(hparams)
    if spec.program is None:
        optimizers.check(hparams)
        schedules.check(hparams)
    else:  # each group's optimizer was checked when the program was built; its schedule here
        programs.check_schedules(spec.program)
    op_support.check(spec, backend)
    return spec


def _checked_argument(name, value, low, model):
    """``value`` of synthetic_batch's argument ``name`` as an int >= ``low`` (the rule build
    applies to batch_size), or HyperparameterError naming it."""
    if isinstance(value, np.integer):
        value = int(value)
    return integer(low).check(name, value, model)


def _note_undone_updates(error):
    """Add to a NonFiniteStepError of a program's later update that the step's earlier
    updates were undone with it."""
    error.args = (error.args[0] + " The step's earlier updates were undone too.",)


class Prepared:
    """A batch already converted for one backend, so timed steps measure only the step."""

    __slots__ = ("backend", "native", "items")

    def __init__(self, backend, native, items):
        self.backend, self.native, self.items = backend, native, items


class PendingTargets:
    """What a Prepared holds for a program whose targets step must run: the written inputs
    change every step, so each update that reads them keeps its NumPy batch and is prepared
    per step, after the targets function; every other update is prepared once."""

    __slots__ = ("updates",)

    def __init__(self, updates):
        self.updates = updates  # [(phase index, prepared native or None, NumPy part or None)]


class BackendModel:
    backend = None
    RUNS_PROGRAMS = False
    # The values of the execution options (tbdzoo/models/registry.py) this backend honours.
    OPTIONS = {"precision": ("fp32",), "execution": ("default",),
               "memory_format": ("auto", "channels_first")}

    def __init__(self, model_def, hparams, seed=0, device=None):
        self.device = self._resolve_device(device)
        self.model_def = model_def
        self.name = model_def.name
        self.hparams = hparams
        self.seed = seed
        self.spec = check_buildable(model_def, hparams, self.backend)
        self._check_options(hparams)
        if self.spec.program is not None and not self.RUNS_PROGRAMS:
            raise UnsupportedOptionError(
                "{} is a training program of {} objective(s) and {} parameter group(s), which "
                "backend {} does not run".format(
                    self.name, len(self.spec.program.objectives), len(self.spec.program.groups),
                    self.backend))
        self.step_count = 0
        self.native = None
        self.rss_before_build = resident_bytes()
        start = time.perf_counter()
        self._build(initial_weights(self.spec, seed))
        self.build_seconds = time.perf_counter() - start

    def __repr__(self):
        return "<tbdzoo {} on {} ({} config, {:,} parameters)>".format(
            self.name, self.backend, self.hparams["config"], self.spec.trainable_count())

    # -- data -----------------------------------------------------------------------
    @property
    def program(self) -> Optional[Program]:
        """The graph's training program, or None for a graph with one loss (graph.loss)."""
        return self.spec.program

    def synthetic_batch(self, seed: int = 0, batch_size: Optional[int] = None) -> Arrays:
        """NumPy arrays keyed by the spec's input names, canonical layouts; for a program of
        several updates, every update's examples (tbdzoo/backends/programs.py). ``batch_size``
        None keeps the config's; a bad ``seed`` or ``batch_size`` raises HyperparameterError."""
        size = self.hparams["batch_size"] if batch_size is None else \
            _checked_argument("batch_size", batch_size, 1, self.name)
        seed = _checked_argument("seed", seed, 0, self.name)
        if self.program is not None and len(programs.updates(self.program)) > 1:
            return programs.stacked_synthetic(
                lambda n, s: self.model_def.synthetic_batch(self.hparams, n, s),
                self.spec, self.program, size, seed)
        return self.model_def.synthetic_batch(self.hparams, size, seed)

    def prepare_batch(self, batch: Union[Batch, "Prepared"]) -> "Prepared":
        if isinstance(batch, Prepared):
            if batch.backend != self.backend:
                raise ValueError("batch was prepared for {}, not {}".format(batch.backend,
                                                                           self.backend))
            return batch
        batch = self._check_batch(batch)  # its inputs as the NumPy arrays checked
        if self.program is not None:
            parts, _ = programs.split_step_batch(self.spec, self.program, batch)
            items = self.model_def.items(self.hparams, batch)
            if self.program.targets_step is not None and \
                    not programs.replays_targets(self.program, batch):
                pending = [(phase, None, part) if programs.reads_targets(
                    self.spec, self.program, self.program.phases[phase])
                    else (phase, self._prepare(part), None) for phase, part in parts]
                return Prepared(self.backend, PendingTargets(pending), items)
            native = [(phase, self._prepare(part)) for phase, part in parts]
            return Prepared(self.backend, native, items)
        return Prepared(self.backend, self._prepare(batch), self.model_def.items(self.hparams, batch))

    def _check_batch(self, batch, names=None):
        """The one check of a batch, before any framework sees it (common/batches.py): every
        input in ``names`` (default: every input a step reads, stacked as a program's updates
        read them) is present, one batch size of at least one example across them, each
        input's per-example shape and values as the spec declares (class and token ids in
        range, lengths within the padded size, CTC labels that fit, floats finite), and the
        model's own rules (ModelDef.check_batch). Raises BatchError naming the input, the
        first offending position and value, and what is allowed. Returns the batch with its
        inputs as the NumPy arrays checked."""
        uses = None
        if names is None and self.program is not None:
            if not hasattr(batch, "keys"):
                names = list(self.spec.inputs)  # batches.check refuses it by its type
            else:
                uses = programs.rows_per_input(
                    self.spec, self.program, programs.replays_targets(self.program, batch))
                names = [n for n, k in uses.items() if k]
        elif names is None:
            names = list(self.spec.inputs)
        facts = getattr(self, "_batch_facts", None)
        if facts is None:
            facts = self._batch_facts = batches.Facts(self.spec)
        return batches.check(self.spec, facts, batch, names, uses,
                             getattr(self.model_def, "check_batch", None), self.hparams)

    # -- training and inference ------------------------------------------------------
    def learning_rate(self) -> float:
        return schedules.learning_rate(self.hparams, self.step_count)

    def train_step(self, batch: Union[Batch, "Prepared"], sync: bool = True) -> Any:
        """One optimizer step with the scheduled learning rate; returns the loss (a float).

        ``sync=False`` lets a backend with an asynchronous device queue the step and return
        None without waiting (timed loops sync once per repeat; see :meth:`synchronize`).

        Atomic (docs/backends.md, "Atomic steps"): a step that fails leaves weights, optimizer
        state, running statistics and step counters as they were and re-raises; one whose
        loss or gradients come out non-finite is skipped and raises NonFiniteStepError (with
        ``sync=False``, at the next synchronisation).
        """
        if self.program is not None:
            return self._program_step(self.prepare_batch(batch), sync)
        prepared, lr = self.prepare_batch(batch), self.learning_rate()
        if not sync and hasattr(self, "_train_step_async"):
            self._train_step_async(prepared, lr)
            self.step_count += 1
            return None
        loss = self._train_step(prepared, lr)
        self.step_count += 1
        return float(loss)

    def _program_step(self, prepared, sync, around_update=None):
        """Every update of the program in order, each group at its own learning rate;
        ``around_update(index)``, if given, is a context each update runs in (measuring).

        Atomic (docs/backends.md, "Atomic steps"): each update leaves the state as it was when
        it fails or comes out non-finite, and a step of several updates keeps a copy of the
        state at its start (``_save_state``), which a failure or a non-finite update
        restores, so a step is applied whole or not at all."""
        losses = OrderedDict()
        prepared = self._with_targets(prepared)
        group_steps = OrderedDict(self.group_steps)
        saved = self._save_state() if self.guard_steps and len(prepared.native) > 1 else None
        self._step_flags = []  # (objective, device flag) of the updates that checked on the device
        index = 0
        try:
            for index, (phase_index, native) in enumerate(prepared.native):
                phase = self.program.phases[phase_index]
                group = phase["update"]
                lr = programs.learning_rate(self.program.groups[group], self.group_steps[group])
                if around_update is None:
                    losses[phase["objective"]] = self._update(phase_index, native, lr)
                else:
                    with around_update(index):
                        losses[phase["objective"]] = self._update(phase_index, native, lr)
                self.group_steps[group] += 1
        except BaseException as error:
            if saved is not None:
                self._restore_state(saved)
            self.group_steps.update(group_steps)
            if isinstance(error, NonFiniteStepError) and saved is not None and index > 0:
                _note_undone_updates(error)
            raise
        finally:
            flags, self._step_flags = self._step_flags, None
        if flags:  # on the device: the whole step is undone there if any update came out bad
            bad = self._any_flag([f for _, f in flags])
            if saved is not None:
                self._restore_state(saved, where=bad)
            if not sync:
                self.step_count += 1
                self._defer_nonfinite(self.step_count, bad, flags,
                                      [(g, self.group_steps[g] - group_steps[g])
                                       for g in group_steps])
                return None
            if bool(bad):
                self.group_steps.update(group_steps)
                first = next(i for i, (_, f) in enumerate(flags) if bool(f))
                error = self._nonfinite_error([flags[first][0]])
                if saved is not None and first > 0:
                    _note_undone_updates(error)
                raise error
        self.step_count += 1
        if not sync:
            return None
        return programs.step_result(self.program, OrderedDict(
            (k, float(v)) for k, v in losses.items()))

    # -- atomic steps ---------------------------------------------------------------------
    # Benchmarking switch: False turns the non-finite guard off so that its cost can be
    # measured (benchmarks/gpu_step_guard.py); a non-finite step is then applied as it comes.
    # Set it before the first step (a compiled step reads it when it is traced).
    guard_steps = True

    def _nonfinite_error(self, objectives, step=None):
        """The NonFiniteStepError of the step being taken (``step``: its number, default the
        next one), naming the first non-finite objective."""
        objective = objectives[0] if objectives else "loss"
        step = self.step_count + 1 if step is None else step
        return NonFiniteStepError(
            "training step {} of {} came out non-finite: its {!r} objective or its gradients "
            "are NaN or infinite. The update was skipped: weights, optimizer state, running "
            "statistics and step counters are as before the step. Lower the learning rate or "
            "check the data.".format(step, self.name, objective), objective=objective, step=step)

    def _defer_nonfinite(self, step, flag, objectives, groups=()):
        """Remember step number ``step``, queued with ``sync=False``, whose non-finite check is
        the device value ``flag`` (the step is counted in step_count; ``objectives``: its
        objective's name, or [(objective, flag)] of its updates; ``groups``: [(group, updates
        it counted)]); :meth:`_raise_deferred` reads it when the model synchronises."""
        pending = self.__dict__.setdefault("_deferred_flags", [])
        pending.append((step, list(objectives), flag, list(groups)))

    def _raise_deferred(self):
        """After a synchronisation: raise the NonFiniteStepError of the first queued step that
        came out non-finite (each was skipped on the device), taking the skipped steps off
        the step counters."""
        pending = self.__dict__.get("_deferred_flags")
        if not pending:
            return
        self._deferred_flags = []
        bad = self._flags_to_host([flag for _, _, flag, _ in pending])
        skipped = [entry for entry, b in zip(pending, bad) if b]
        if not skipped:
            return
        for _, _, _, groups in skipped:
            for group, count in groups:
                self.group_steps[group] -= count
        self.step_count -= len(skipped)
        step, objectives = skipped[0][0], skipped[0][1]
        if objectives and isinstance(objectives[0], tuple):  # the first bad update's objective
            bad = self._flags_to_host([f for _, f in objectives])
            objectives = [o for (o, _), b in zip(objectives, bad) if b][:1]
        error = self._nonfinite_error(objectives, step)
        if len(skipped) > 1:
            error.args = (error.args[0] + " {} of the steps queued since the last "
                          "synchronisation were skipped so.".format(len(skipped)),)
        raise error

    def _any_flag(self, flags):
        """Device flags combined: true where any is (backends that check on the device)."""
        raise NotImplementedError

    def _flags_to_host(self, flags):
        """[bool] of device flags, read in one transfer."""
        return [bool(f) for f in flags]

    def _save_state(self):
        """A copy of everything a step changes (weights, statistics, optimizer state), for a
        step of several updates; backends that run programs implement it."""
        raise NotImplementedError

    def _restore_state(self, saved, where=None):
        """Put ``saved`` back (where=None), or, on a device, where the flag ``where`` is set."""
        raise NotImplementedError

    def _with_targets(self, prepared):
        """``prepared`` with the targets step run for this step (model seed, step count),
        before any update; a prepared batch that replays its targets is returned as it is."""
        if not isinstance(prepared.native, PendingTargets):
            return prepared
        native = []
        for index, (phase_index, ready, part) in enumerate(prepared.native.updates):
            if ready is None:
                part = OrderedDict(part)
                part.update(self._run_targets(part, index))
                ready = self._prepare(part)
            native.append((phase_index, ready))
        return Prepared(self.backend, native, prepared.items)

    def step_targets(self, batch: Batch) -> Arrays:
        """The written inputs the targets step makes for ``batch`` at the current step, stacked
        as a step's batch holds them (docs/programs.md): ``dict(batch, **step_targets(batch))``
        replays them, so another backend, or another seed, sees exactly these targets. A
        phase with ``batch='shared'`` keeps its first repetition's."""
        if self.program is None or self.program.targets_step is None:
            raise ValueError("{} has no targets step".format(self.name))
        pending = self.prepare_batch(batch).native
        if not isinstance(pending, PendingTargets):
            raise ValueError("the batch already holds the written inputs {}".format(
                ", ".join(self.program.written_inputs())))
        kept, done = [], set()
        for index, (phase_index, ready, part) in enumerate(pending.updates):
            phase = self.program.phases[phase_index]
            if ready is None and (phase["batch"] == "own" or phase_index not in done):
                kept.append(self._run_targets(OrderedDict(part), index))
            done.add(phase_index)
        return OrderedDict((name, np.concatenate([k[name] for k in kept]))
                           for name in self.program.written_inputs())

    def _run_targets(self, part, index):
        """The written inputs for one update's NumPy batch ``part``: the values the step reads
        (one inference-mode forward), then the function with its seeded RandomState."""
        step = self.program.targets_step
        needed = programs.targets_inputs(self.spec, self.program)
        size = len(next(iter(part.values())))
        given = OrderedDict((n, np.asarray(part[n])) for n in needed)
        values = self._targets_values(Prepared(self.backend, self._prepare(given), size),
                                      step["reads"])
        return self._targets_of(part, index, values)

    def _targets_values(self, prepared, names):
        """The values ``names`` the targets step reads, of an inference pass on ``prepared``:
        NumPy by name, or a HostValues that copies each when the step first reads it."""
        return self._values(prepared, names)

    def _targets_of(self, part, index, values):
        """The targets function on the values it reads (NumPy by name, or a HostValues that
        fetches each when read) and ``part``'s inputs, with this step's seeded RandomState for
        update ``index``."""
        step = self.program.targets_step
        rng = StepRandomState(self.seed, self.step_count, "targets/" + step["name"], index)
        inputs = OrderedDict((n, np.asarray(part[n])) for n in step["inputs"])
        return programs.call_targets(self.spec, self.program, values, inputs, self.hparams, rng)

    @property
    def group_steps(self) -> Dict[str, int]:
        """Updates each parameter group has taken (its schedule's step counter)."""
        if getattr(self, "_group_steps", None) is None:
            self._group_steps = OrderedDict((g, 0) for g in self.program.groups)
        return self._group_steps

    def synchronize(self) -> None:
        """Wait until every queued step has finished (a no-op on synchronous backends); raises
        the NonFiniteStepError of the first queued step that came out non-finite."""
        self._raise_deferred()

    def train_steps(self, batch: Union[Batch, "Prepared"], steps: int) -> List[Any]:
        """``steps`` optimizer steps on one batch; returns their losses."""
        prepared = self.prepare_batch(batch)
        return [self.train_step(prepared) for _ in range(steps)]

    def predict(self, batch: Union[Batch, "Prepared"]) -> Any:
        """The graph's output in inference mode, NumPy (or what ModelDef.inference returns),
        from a batch holding the inputs inference reads (no labels needed); a Prepared batch
        as it is."""
        if getattr(self.model_def, "inference", None) is not None:  # ModelDef.inference
            return self.model_def.inference(self, batch)
        if isinstance(batch, Prepared):
            return np.asarray(self._predict(self.prepare_batch(batch)))
        names = self._predict_inputs(batch)
        written = self._written_by_targets()
        batch = self._check_batch(batch, names)
        part = OrderedDict((n, batch[n]) for n in names)  # one batch size: checked
        size = len(part[names[0]])
        if written and not all(n in part for n in written):
            part.update(self._run_targets(part, 0))
        return np.asarray(self._predict(Prepared(self.backend, self._prepare(part), size)))

    def values(self, batch: Batch, names: Sequence[str]) -> Arrays:
        """{node name: NumPy value} of graph nodes ``names`` in inference mode, from a NumPy
        ``batch`` holding the inputs they read (a model's inference hook reads these)."""
        needed = [n for n in self.spec.inputs if n in programs.values_read(self.spec, names)]
        batch = self._check_batch(batch, needed)
        part = OrderedDict((n, batch[n]) for n in needed)  # one batch size: checked
        size = len(part[needed[0]])
        out = self._values(Prepared(self.backend, self._prepare(part), size), list(names))
        return OrderedDict((n, np.asarray(out[n])) for n in names)

    def _predict_inputs(self, batch):
        """The inputs ``predict(batch)`` reads from ``batch``: those the output reads (no
        labels), with a targets step's own inputs in place of the inputs it writes unless the
        batch replays them; for a model with an inference hook, its ``inference_inputs``."""
        if getattr(self.model_def, "inference_inputs", None) is not None:
            return list(self.model_def.inference_inputs)
        names = self._output_inputs()
        if self.program is None:  # a graph of one loss is fed all its features when it predicts
            names = [n for n, inp in self.spec.inputs.items()
                     if n in names or inp.role == "feature"]
        written = self._written_by_targets()
        if written and hasattr(batch, "keys") and \
                not programs.replays_targets(self.program, batch):
            names = [n for n in names if n not in written]
            names += [n for n in programs.targets_inputs(self.spec, self.program)
                      if n not in names]
        return names

    def _written_by_targets(self):
        """The inputs the output reads that a program's targets step writes (none without)."""
        if self.program is None:
            return []
        read = self._output_inputs()
        return [n for n in self.program.written_inputs() if n in read]

    def _output_inputs(self):
        """The inputs the graph's output reads (a prediction needs no labels)."""
        return [n for n in self.spec.inputs
                if n in programs.values_read(self.spec, [self.spec.output])]

    def loss_and_gradients(self, batch: Union[Batch, "Prepared"]) -> Tuple[Any, Arrays]:
        """Training-mode loss and per-parameter gradients (canonical), without a step.

        For a program of several objectives: ({objective: value}, gradients), each parameter's
        gradient taken of the objective of the phase that updates its group, on that phase's
        first batch."""
        prepared = self.prepare_batch(batch)
        if self.program is not None:
            losses, grads = self._program_gradients(self._with_targets(prepared))
            result = programs.step_result(self.program, losses)
            return result, OrderedDict((k, np.asarray(grads[k])) for k in self.trainable_names())
        loss, grads = self._loss_and_gradients(prepared)
        return float(loss), OrderedDict((k, np.asarray(grads[k])) for k in self.trainable_names())

    def trainable_names(self) -> List[str]:
        return [n for n, p in self.spec.params().items() if p.trainable]

    # -- weights ------------------------------------------------------------------------
    def get_weights(self) -> Arrays:
        return self._get_weights()

    def set_weights(self, weights: Mapping[str, Any]) -> None:
        """Assign a dict of canonical name -> array (get_weights' form); anything else, or a
        dict that does not match, raises WeightsError and leaves the model as it was."""
        self._set_weights(weights_io.check(self.spec, weights))

    def save_weights(self, path: PathLike) -> None:
        weights_io.save(path, self.spec, self.get_weights())

    def load_weights(self, path: PathLike) -> None:
        self._set_weights(weights_io.load(path, self.spec))

    # -- measuring -------------------------------------------------------------------------
    @property
    def framework(self) -> str:
        return backend_info(self.backend).framework

    def framework_version(self) -> Optional[str]:
        return getattr(importlib.import_module(self.framework), "__version__", None)

    def measure_memory(self, prepared: "Prepared") -> Dict[str, int]:
        """Measured memory categories in bytes (docs/records.md), for the ones this framework
        can report; the profiler fills the rest from the spec. Default: none."""
        return {}

    def close(self) -> None:
        """Release what the model holds; a worker-backed model stops its process."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- for subclasses -------------------------------------------------------------------
    def _check_options(self, hparams):
        for option, allowed in sorted(self.OPTIONS.items()):
            if hparams[option] not in allowed:
                raise UnsupportedOptionError(
                    "{} {!r} is not available on backend {} (on {}); it supports: {}".format(
                        option, hparams[option], self.backend, self.device, ", ".join(allowed)))

    def _resolve_device(self, device):
        """The device string ('cpu', 'cuda:0'); backends with accelerators override this."""
        if device not in (None, "cpu"):
            raise UnsupportedOptionError("backend {} runs on the CPU only here; device {!r} "
                                         "is not available".format(self.backend, device))
        return "cpu"

    # Data-parallel training (docs/distributed.md): the World this replica belongs to, set by
    # the subclass that tbdzoo/backends/<backend>/distributed.py makes; None in one process.
    world = None

    def _reduce_gradients(self, grads):
        """Where data-parallel training reduces gradients across replicas: after they are
        computed, before clipping and the update. One process: nothing to reduce."""
        return grads

    def _build(self, weights):
        raise NotImplementedError

    def _prepare(self, batch):
        raise NotImplementedError

    def _train_step(self, prepared, lr):
        raise NotImplementedError

    def _predict(self, prepared):
        raise NotImplementedError

    def _loss_and_gradients(self, prepared):
        raise NotImplementedError

    def _values(self, prepared, names):
        raise NotImplementedError("backend {} cannot yet evaluate named graph values, which a "
                                  "program's targets step reads".format(self.backend))

    def _get_weights(self):
        raise NotImplementedError

    def _set_weights(self, weights):
        raise NotImplementedError
