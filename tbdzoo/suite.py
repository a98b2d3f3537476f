"""The benchmark suite: every model on every ready backend, each run in its own worker.

A run that fails becomes a record with ``status: error`` and the suite goes on; records are
appended to the JSONL file as each run finishes, so an interrupted suite keeps what it had.
"""
import json
import os
import platform
import time
from collections import OrderedDict

from . import __version__
from .backends.registry import build, list_backends
from .models import get_model, list_models

# Batches that keep a full-size training step to seconds on a small CPU.
CPU_BATCH_SIZES = {"resnet50": 8, "transformer": 16}


def ready_backends():
    return [b["name"] for b in list_backends() if b["ready"]]


def run_one(model_name, backend, config="paper", batch_size=None, warmup=1, steps=3, repeats=3,
            seed=0, progress=None, status=None):
    """Build, time and close one model on one backend; always returns a record."""
    record = OrderedDict([("model", model_name), ("backend", backend), ("config", config),
                          ("batch_size", batch_size), ("seed", seed), ("status", "ok")])
    overrides = {"batch_size": batch_size} if batch_size else {}
    model = None
    try:
        if status:
            status("building")
        start = time.perf_counter()
        model = build(model_name, backend=backend, config=config, seed=seed, isolate=True,
                      **overrides)
        record["build_s"] = time.perf_counter() - start
        record["batch_size"] = model.hparams["batch_size"]
        record["parameters"] = model.spec.trainable_count()
        if status:
            status("training")
        timing = model.time_training(model.synthetic_batch(seed=seed), warmup, steps, repeats,
                                     progress=progress)
        record["throughput"] = OrderedDict([("value", timing["throughput"]), ("unit", timing["unit"])])
        record.update((k, timing[k]) for k in ("step_time", "first_step_s", "items_per_step",
                                               "protocol", "losses"))
        if not timing["finite"]:
            record["status"] = "error"
            record["error"] = "a loss was not finite: {}".format(timing["losses"])
    except Exception as e:  # a failed run is a result, not the end of the suite
        record["status"] = "error"
        record["error"] = "{}: {}".format(type(e).__name__, e)
    finally:
        if model is not None:
            model.close()
    record["env"] = OrderedDict([("tbdzoo", __version__), ("python_main", platform.python_version()),
                                 ("machine", platform.machine()), ("cpus", os.cpu_count())])
    return record


def append_record(path, record):
    """One JSON object per line, flushed and synced so a killed suite keeps finished runs."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def plan(models=None, backends=None):
    models = models or list_models()
    for m in models:
        get_model(m)  # unknown names fail before anything runs
    backends = backends or ready_backends()
    return [(m, b) for m in models for b in backends]
