"""Step timing by the measuring protocol (docs/profiling.md).

Warm-up steps are excluded (compilation and autotuning happen there; the first one is reported
on its own), then ``repeats`` runs of ``steps`` timed steps. With ``min_repeat_s`` a repeat
takes at least that long: the first repeat runs ``steps`` steps and then more until that much
time has passed, and every later repeat runs as many steps as it did, so fast steps are timed
over a window the clock and the machine's noise do not dominate while a slow step still runs
once per repeat. Within a repeat, steps are queued
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


def time_training(model, batch, warmup=1, steps=3, repeats=3, progress=None, meters=(),
                  min_repeat_s=0.0):
    """Time ``model.train_step`` on one prepared batch; returns a JSON-able dict.

    ``progress(done, total)`` is called after every step, warm-up included. Each of ``meters``
    (objects with start() and stop()) is started after the warm-up and stopped after the last
    timed step, so samplers see exactly the timed region; their stop() results are returned
    under "meters" in the same order. ``min_repeat_s``: the first repeat runs at least
    ``steps`` steps and at least this many seconds (read from the host's clock after each
    step), and fixes the steps of every repeat.
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
    for _ in range(warmup - 1):
        losses.append(model.train_step(prepared))
        done += 1
        if progress:
            progress(done, total)
    calibrating = bool(min_repeat_s)
    per_step = []
    model.synchronize()  # samplers start on an idle device: no warm-up work inside their region
    for meter in meters:
        meter.start()
    for _ in range(repeats):
        model.synchronize()
        start = time.perf_counter()
        ran = 0
        while True:
            last = not calibrating and ran == steps - 1
            loss = model.train_step(prepared, sync=last)
            if loss is not None:
                losses.append(loss)
            ran += 1
            done += 1
            if calibrating:  # every repeat runs at least as many steps as this one so far
                total = max(total, warmup + ran * repeats)
            if progress:
                progress(done, total)
            if last or (calibrating and ran >= steps and
                        time.perf_counter() - start >= min_repeat_s):
                break
        model.synchronize()
        if calibrating:  # the first repeat sets the steps of every repeat
            steps, calibrating = ran, False
            total = warmup + steps * repeats
        per_step.append((time.perf_counter() - start) / steps)
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
