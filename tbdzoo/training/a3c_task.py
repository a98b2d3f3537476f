"""A3C to a mean return: tbdzoo.rl.train_a2c (the synchronous mode) with its target. The
metric is the mean return of the last 100 finished training episodes, as train_a2c measures
it; there is no separate evaluation, so eval_seconds is 0 and a step is one update."""
from collections import OrderedDict

from ..rl.a2c import train_a2c

__all__ = ["run_a2c"]


def run_a2c(model, result, target, seed, max_minutes, eval_every, progress, mllog, max_steps):
    hp = model.hparams
    limit = None if max_minutes is None else max_minutes * 60.0
    result.details.update([("dataset", hp["env"]), ("pipeline", "tbdzoo.rl.train_a2c"),
                           ("examples", None)])
    if mllog:
        mllog.start(model.name, model.backend, seed, hp["batch_size"], target)

    def entry(updates, frames, seconds, mean):
        return OrderedDict([("step", updates), ("frames", frames), ("value", mean),
                            ("train_seconds", round(seconds, 3)), ("eval_seconds", 0.0)])

    def monitor(live):
        frames, seconds, mean = live.history[-1]
        point = entry(live.updates, frames, seconds, mean)
        result.history.append(point)
        if mllog:
            mllog.evaluation(live.updates, frames, mean)
        if progress:
            progress(dict(point, target=target.value, metric=target.metric.name,
                          wall_seconds=seconds, limit_seconds=limit, done=False))

    try:
        run = train_a2c(model, seed=seed, target_return=target.value, max_seconds=limit,
                        max_updates=max_steps, log_every=eval_every, progress=lambda line: None,
                        monitor=monitor)
    except BaseException:
        if mllog:
            mllog.stop(False, "interrupted")
        raise
    result.steps_run = run.updates
    result.train_seconds = result.wall_seconds = run.seconds
    result.details["frames_run"] = run.frames
    if run.solved_at is not None:
        frames, seconds, updates = run.solved_at
        result.reached, result.steps, result.seconds = True, updates, seconds
        result.eval_seconds_at_target = 0.0
        result.details["frames"] = frames
        result.stop_reason = "target reached"
        point = entry(updates, frames, seconds, run.mean_return())
        if not result.history or result.history[-1]["step"] != updates:
            result.history.append(point)
            if mllog:
                mllog.evaluation(updates, frames, point["value"])
    elif max_steps is not None and run.updates >= max_steps:
        result.stop_reason = "max_steps ({}) ran out".format(max_steps)
    else:
        result.stop_reason = "max_minutes ({:g}) ran out".format(max_minutes)
    if progress:
        progress(dict(result.history[-1] if result.history else entry(run.updates, run.frames,
                                                                      run.seconds, None),
                      target=target.value, metric=target.metric.name, wall_seconds=run.seconds,
                      limit_seconds=limit, done=True))
    if mllog:
        mllog.stop(result.reached, result.stop_reason)
