"""The loop that trains a model until its held-out metric reaches a target.

It trains with the model's own optimizer and schedule (``model.train_step``), evaluates every
``eval_every`` steps, and stops at the first evaluation that meets the target, or when
``max_minutes`` (training and evaluation together) or ``max_steps`` run out. Both are checked
at evaluations, so a run may pass its minutes by up to one interval, and steps-to-target is a
multiple of ``eval_every``. Training and evaluation time are timed apart: the
seconds to target count training steps only (batches included), eval_seconds the evaluations.
"""
import os
import time
from collections import OrderedDict

from ..backends.registry import build
from .errors import TrainingError
from .proxies import proxy_overrides, training_of
from .targets import parse_target

__all__ = ["TrainResult", "build_proxy", "task_check"]


class TrainResult:
    """What a run to a target measured (see :meth:`record` for the fields)."""

    def __init__(self, model, backend, seed, target, eval_every):
        self.model, self.backend, self.seed = model, backend, seed
        self.target, self.eval_every = target, eval_every
        self.reached = False
        self.steps = None            # steps when the target was first met
        self.seconds = None          # training seconds then
        self.eval_seconds_at_target = None
        self.steps_run = 0
        self.train_seconds = self.eval_seconds = self.wall_seconds = 0.0
        self.history = []            # one OrderedDict per evaluation
        self.stop_reason = None
        self.details = OrderedDict()  # dataset, pipeline, examples, ... (the task's facts)
        self.losses = []             # the training loss of every step (this process's batch)

    @property
    def last_value(self):
        return self.history[-1]["value"] if self.history else None

    def record(self):
        out = OrderedDict([
            ("kind", "time_to_accuracy"), ("model", self.model), ("backend", self.backend),
            ("seed", self.seed), ("metric", self.target.metric.name),
            ("target", self.target.value), ("reached", self.reached),
            ("steps", self.steps), ("seconds", _round(self.seconds)),
            ("eval_seconds", _round(self.eval_seconds_at_target)),
            ("steps_run", self.steps_run), ("train_seconds", _round(self.train_seconds)),
            ("eval_seconds_total", _round(self.eval_seconds)),
            ("wall_seconds", _round(self.wall_seconds)), ("eval_every", self.eval_every),
            ("final", self.last_value), ("stop_reason", self.stop_reason)])
        out.update(self.details)
        out["history"] = list(self.history)
        out["losses"] = list(self.losses)
        return out

    @classmethod
    def from_record(cls, record):
        """The result a record describes (a data-parallel run's, written by its rank 0)."""
        target = parse_target(record["model"], (record["metric"], record["target"]))
        result = cls(record["model"], record["backend"], record["seed"], target,
                     record["eval_every"])
        result.reached, result.steps, result.seconds = (record["reached"], record["steps"],
                                                        record["seconds"])
        result.eval_seconds_at_target = record["eval_seconds"]
        result.steps_run, result.train_seconds = record["steps_run"], record["train_seconds"]
        result.eval_seconds = record["eval_seconds_total"]
        result.wall_seconds, result.stop_reason = record["wall_seconds"], record["stop_reason"]
        result.history, result.losses = list(record["history"]), list(record.get("losses", []))
        skip = set(result.record()) - set(["config", "overrides", "batch_size"])
        result.details = OrderedDict((k, v) for k, v in record.items() if k not in skip)
        return result


def _round(x):
    return None if x is None else round(x, 3)


def build_proxy(model_name, backend, seed=0, overrides=None):
    """The model's proxy config (its card's ``training.proxy``) with ``overrides`` on top."""
    config, proxy = proxy_overrides(model_name)
    proxy.update(overrides or {})
    return build(model_name, backend=backend, config=config, seed=seed, **proxy)


def task_class(name):
    """The task that feeds and evaluates the model (its card's ``training.task``); None for a
    model that trains without a data folder."""
    return training_of(name).task_class()


def task_check(name, data_dir):
    """Open the data folder before a model is built, so a wrong layout fails at once."""
    task = task_class(name)
    if task is None:
        return
    if data_dir is None:
        raise TrainingError("{} trains from a data folder (--data DIR) in {}; make one with: "
                            "{}".format(name, task.layout, task.data_command))
    task.check_data(data_dir)


# What stopped a run, as one number: data-parallel ranks agree on it (rank 0 decides).
CONTINUE, TARGET_REACHED, MINUTES_RAN_OUT, STEPS_RAN_OUT = 0, 1, 2, 3


def _stop_reason(code, max_minutes, max_steps):
    return {CONTINUE: None, TARGET_REACHED: "target reached",
            MINUTES_RAN_OUT: "max_minutes ({:g}) ran out".format(max_minutes or 0),
            STEPS_RAN_OUT: "max_steps ({}) ran out".format(max_steps)}[code]


def _run_supervised(model, result, data_dir, target, seed, max_minutes, eval_every, progress,
                    mllog, max_steps, workers, world=None, agree=None, on_step=None):
    """The loop. With ``world`` (a data-parallel rank) the task reads the rank's share, only
    rank 0 evaluates, and ``agree(code)`` hands rank 0's stop decision to every rank (an
    engine's broadcast); without ``agree`` the ranks stop at ``max_steps``, the step budget
    agreed in advance, and rank 0 records the first evaluation that met the target."""
    if data_dir is None:
        task_check(model.name, None)
    Task = task_class(model.name)
    shared = world is not None and world.size > 1
    options = {"rank": world.rank, "world_size": world.size} if shared else {}
    task = Task(model, data_dir, seed=seed, workers=workers, **options)
    result.details.update([("dataset", task.dataset), ("data_dir", os.path.abspath(data_dir)),
                           ("pipeline", task.pipeline), ("examples", task.examples)])
    evaluates = world is None or world.rank == 0
    size = world.size if shared else 1
    batch_size = model.hparams["batch_size"] * size   # the global batch
    if mllog:
        mllog.start(model.name, model.backend, seed, batch_size, target)
    limit = None if max_minutes is None or (shared and agree is None) else max_minutes * 60.0
    start = time.perf_counter()
    batches = task.batches()
    weights = result.details.setdefault("gradient_weights", []) if shared else None
    try:
        while True:
            t = time.perf_counter()
            for _ in range(eval_every):
                result.losses.append(model.train_step(next(batches)))
                if weights is not None:
                    weights.append(world.gradient_weight)
                result.steps_run += 1
                if on_step:
                    on_step(result.steps_run)
            result.train_seconds += time.perf_counter() - t
            code, entry = CONTINUE, None
            if evaluates:
                t = time.perf_counter()
                value = task.evaluate((target.metric.name,))[target.metric.name]
                result.eval_seconds += time.perf_counter() - t
                result.wall_seconds = time.perf_counter() - start
                entry = OrderedDict([("step", result.steps_run), ("value", value),
                                     ("train_seconds", round(result.train_seconds, 3)),
                                     ("eval_seconds", round(result.eval_seconds, 3))])
                result.history.append(entry)
                if mllog:
                    mllog.evaluation(result.steps_run, result.steps_run * batch_size, value)
                if target.met(value) and not result.reached:
                    result.reached = True
                    result.steps, result.seconds = result.steps_run, result.train_seconds
                    result.eval_seconds_at_target = result.eval_seconds
                if result.reached:
                    code = TARGET_REACHED
                elif limit is not None and result.wall_seconds >= limit:
                    code = MINUTES_RAN_OUT
                elif max_steps is not None and result.steps_run >= max_steps:
                    code = STEPS_RAN_OUT
            if shared:
                if agree is not None:
                    code = int(agree(code))
                else:
                    code = STEPS_RAN_OUT if result.steps_run >= max_steps else CONTINUE
            result.wall_seconds = time.perf_counter() - start
            result.stop_reason = _stop_reason(code, max_minutes, max_steps)
            if code == STEPS_RAN_OUT and shared and agree is None and result.reached:
                result.stop_reason = "the step budget ({}) agreed in advance ran out; target " \
                                     "reached at step {}".format(max_steps, result.steps)
            if progress and entry is not None:
                progress(dict(entry, target=target.value, metric=target.metric.name,
                              wall_seconds=result.wall_seconds, limit_seconds=limit,
                              done=result.stop_reason is not None))
            if result.stop_reason:
                break
    finally:
        task.close()
        batches.close()
        if mllog:
            mllog.stop(result.reached, result.stop_reason or "interrupted")
