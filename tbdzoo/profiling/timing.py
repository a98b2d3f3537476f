"""Step timing by the measuring protocol (docs/profiling.md).

Warm-up steps are excluded (compilation and autotuning happen there; the first one is reported
on its own), then ``repeats`` runs of ``steps`` timed steps. With ``min_repeat_s`` a repeat
lasts about that long: where the last warm-up step was shorter, synchronous untimed steps
follow the warm-up until ``min_repeat_s`` has passed, and as many as ran (at least ``steps``)
make every repeat. Fast steps are then timed over a window that the clock and the machine's
noise do not dominate, while a step of ``min_repeat_s`` or more runs ``steps`` times a repeat
and costs nothing beyond the warm-up. Within a repeat, steps are queued
without waiting where the backend allows; the last one is a synchronous step, and the model is
synchronised again before the clock is read, so a timed window never closes on work that is
still queued (the first step's time is read the same way).
Valid Python 3.6: it runs inside every backend's worker.
"""
import math
import time


def summarize(values):
    """median, min, max and coefficient of variation of a list of numbers."""
    ordered = sorted(values)
    n = len(ordered)
    median = ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])
    mean = sum(ordered) / n
    var = sum((v - mean) ** 2 for v in ordered) / (n - 1) if n > 1 else 0.0
    return {"median": median, "min": ordered[0], "max": ordered[-1],
            "cv": math.sqrt(var) / mean if mean else 0.0, "n": n}


def time_repeats(model, next_input, steps, repeats, losses, progress=None, done=0, total=None):
    """The timed region of the protocol, the one step timer of every measurement: ``repeats``
    runs of ``steps`` steps, each run starting and ending on a synchronised model, the last
    step of a run synchronous. ``next_input()`` returns (what ``model.train_step`` takes, the
    seconds spent waiting for it); a step's loss goes to ``losses``; ``progress(done, total)``
    after each step. Returns (seconds per step of each run, fraction of each run spent
    waiting, steps done)."""
    per_step, waits = [], []
    for _ in range(repeats):
        model.synchronize()
        start, wait = time.perf_counter(), 0.0
        for i in range(steps):
            batch, waited = next_input()
            wait += waited
            loss = model.train_step(batch, sync=(i == steps - 1))
            if loss is not None:
                losses.append(loss)
            done += 1
            if progress:
                progress(done, total)
        model.synchronize()
        elapsed = time.perf_counter() - start
        per_step.append(elapsed / steps)
        waits.append(wait / elapsed if elapsed else 0.0)
    return per_step, waits, done


def time_training(model, batch, warmup=1, steps=3, repeats=3, progress=None, meters=(),
                  min_repeat_s=0.0):
    """Time ``model.train_step`` on one prepared batch; returns a JSON-able dict.

    ``progress(done, total)`` is called after every step, warm-up included. Each of ``meters``
    (objects with start() and stop()) is started after the warm-up and stopped after the last
    timed step, so samplers see exactly the timed region; their stop() results are returned
    under "meters" in the same order. ``min_repeat_s``: each repeat runs at least ``steps``
    steps, and as many as ran in this many seconds after the warm-up where its last step was
    shorter; the protocol's "warmup" counts the untimed steps that ran, "steps" the steps of a
    repeat.
    """
    if warmup < 1 or steps < 1 or repeats < 1:
        raise ValueError("warmup, steps and repeats must each be at least 1")
    if min_repeat_s < 0:
        raise ValueError("min_repeat_s must be 0 or more, not {}".format(min_repeat_s))
    prepared = model.prepare_batch(batch)
    total, done = warmup + steps * repeats, 0
    model.synchronize()
    start = time.perf_counter()
    losses = [model.train_step(prepared)]
    model.synchronize()
    first_step = time.perf_counter() - start
    done += 1
    if progress:
        progress(done, total)
    last_step = first_step
    for _ in range(warmup - 1):
        start = time.perf_counter()
        losses.append(model.train_step(prepared))  # synchronous: the loss is read back
        last_step = time.perf_counter() - start
        done += 1
        if progress:
            progress(done, total)
    if min_repeat_s and (warmup == 1 or last_step < min_repeat_s):
        # untimed steps after the warm-up until min_repeat_s has passed: their count makes a repeat
        start, ran = time.perf_counter(), 0
        while ran < steps or time.perf_counter() - start < min_repeat_s:
            losses.append(model.train_step(prepared))
            ran += 1
            done += 1
            if progress:
                progress(done, max(total, done + 1 + ran * repeats))
        steps, warmup = ran, warmup + ran
        total = warmup + steps * repeats
    model.synchronize()  # samplers start on an idle device: no warm-up work inside their region
    for meter in meters:
        meter.start()
    per_step, _, done = time_repeats(model, lambda: (prepared, 0.0), steps, repeats, losses,
                                     progress, done, total)
    readings = [meter.stop() for meter in meters]
    step_time = summarize(per_step)
    items = prepared.items
    return {
        "protocol": {"warmup": warmup, "steps": steps, "repeats": repeats,
                     "min_repeat_s": min_repeat_s},
        "first_step_s": first_step,
        "step_time": step_time,
        "repeat_step_times": per_step,
        "items_per_step": items,
        "unit": model.model_def.unit,
        "throughput": items / step_time["median"],
        "losses": losses,
        "finite": all(math.isfinite(x) for loss in losses
                      for x in (loss.values() if isinstance(loss, dict) else [loss])),
        "meters": readings,
    }
