"""``train_to_target``: a model trained until its held-out metric reaches a target, in one
process (the loop of loop.py; A3C's in a3c_task.py) or data-parallel (distributed.py).
Valid Python 3.6."""
import os
import time
from collections import OrderedDict

from .distributed import train_distributed
from .errors import TrainingError
from .loop import TrainResult, _run_supervised, build_proxy, task_check
from .proxies import training_of
from .targets import Target, parse_target

__all__ = ["train_to_target"]


def train_to_target(model, backend=None, data_dir=None, target=None, seed=0, max_minutes=10.0,
                    eval_every=None, progress=None, mllog=None, max_steps=None, overrides=None,
                    workers=0, nproc=1, **world):
    """Train ``model`` (a name, built here from its proxy config plus ``overrides``, or a
    model already built) on ``backend`` until ``target`` ("top1=0.8", ("top1", 0.8) or a
    Target) is met on the held-out split of ``data_dir``. ``progress(event)`` receives a dict
    after each evaluation; ``mllog`` (a TrainingMllog) gets MLPerf-style lines. Returns a
    TrainResult. ``nproc`` above 1 (or any of ``world``: nnodes, node_rank, master, hosts,
    interface, global_batch, bn_mode, rank_timeout, step_timeout, command, device) trains
    data-parallel on the backend's engine (docs/distributed.md, "Training to a target")."""
    name = model if isinstance(model, str) else model.name
    training = training_of(name)
    target = target if isinstance(target, Target) else parse_target(
        name, target if target is not None else training.target)
    eval_every = eval_every or training.eval_every
    if eval_every < 1:
        raise TrainingError("eval_every must be at least 1 step, not {}".format(eval_every))
    if max_minutes is not None and max_minutes <= 0:
        raise TrainingError("max_minutes must be positive, not {}".format(max_minutes))
    if nproc > 1 or world:
        if not isinstance(model, str):
            raise TrainingError("a data-parallel run builds its model in every process: give "
                                "the model's name, not a built model")
        return train_distributed(name, backend, data_dir, target, seed, max_minutes, eval_every,
                                 progress, mllog, max_steps, overrides, workers, nproc, **world)
    owned = isinstance(model, str)
    if owned:
        if backend is None:
            raise TrainingError("give the backend to build {} on".format(name))
        task_check(name, data_dir)
        model = build_proxy(name, backend, seed, overrides)
    elif backend is not None and backend != model.backend:
        raise TrainingError("the model runs on {}, not {}".format(model.backend, backend))
    result = TrainResult(name, model.backend, seed, target, eval_every)
    result.details["config"] = ("proxy of " + str(model.hparams.get("config"))) if owned \
        else model.hparams.get("config")
    result.details["overrides"] = OrderedDict(sorted((overrides or {}).items()))
    result.details["batch_size"] = model.hparams.get("batch_size")
    try:
        if training.runner is not None:   # trains without a data folder (A3C: a3c_task.py)
            training.run()(model, result, target, seed, max_minutes, eval_every, progress,
                           mllog, max_steps)
        else:
            _run_supervised(model, result, data_dir, target, seed, max_minutes, eval_every,
                            progress, mllog, max_steps, workers)
    finally:
        if owned:
            model.close()
    result.details["hparams"] = OrderedDict(sorted(
        (k, list(v) if isinstance(v, tuple) else v) for k, v in model.hparams.items()))
    result.details["load_average"] = [round(x, 2) for x in os.getloadavg()]
    result.details["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return result
