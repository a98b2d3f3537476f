"""Runs as a user asks for them: one run, a batch-size sweep, the whole suite.

Every run executes in its own worker process in the backend's environment, so one backend's
memory and threads never disturb another's figures, and a crash or an out-of-memory becomes a
record with ``status`` 'oom' or 'error' while the rest goes on. Each record is appended to the
JSONL file as soon as its run finishes, so an interrupted suite keeps every finished record.
"""
import json
import os
import threading
from collections import OrderedDict

from . import distributed
from .backends import environments
from .backends.info import backend_info, check_backend
from .backends.registry import build, list_backends
from .errors import TbdError
from .models import get_model, list_models
from .models.a3c import NAME as A3C
from .models.registry import EXECUTION_DEFAULTS
from .pipelines.measure import INPUT_BOUND_WAIT, data_fed
from .profiling.profile import failed_record, run_record
from .rl.async_learners import train_a3c


def ready_backends():
    return [b["name"] for b in list_backends() if b["ready"]]


class MemoryCap:
    """Stops a worker whose peak resident memory passes ``cap_bytes``, so a sweep on the CPU
    ends in a recorded 'oom' instead of the machine swapping or the kernel's OOM killer picking
    a victim. It reads the kernel's high-water mark (VmHWM), checked at once and then every
    ``interval`` seconds, so a spike between two looks is still caught, at the latest when
    the run ends."""

    def __init__(self, pid, cap_bytes, interval=0.2):
        self.pid, self.cap, self.interval = pid, cap_bytes, interval
        self.tripped = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._check()

    def peak_bytes(self):
        try:
            with open("/proc/{}/status".format(self.pid)) as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError):
            pass
        try:
            import psutil
        except ImportError:
            return None
        try:
            return psutil.Process(self.pid).memory_info().rss
        except psutil.Error:  # the process has ended, or is not ours to read
            return None

    def _check(self):
        if self.tripped is None:
            peak = self.peak_bytes()
            if peak is not None and peak > self.cap:
                self.tripped = peak
                try:
                    os.kill(self.pid, 9)
                except OSError:
                    pass
        return self.tripped

    def _watch(self):
        while not self._check() and not self._stop.wait(self.interval):
            pass


def bench_batch_size(model_name, backend, config="paper", device=None, cpu_batches=True):
    """The batch a suite run uses: None (the config's own) on a GPU, for configs other than
    the paper's and when ``cpu_batches`` is off; on a CPU, the model's card's
    ``benchmark.cpu_batch_size`` (a GPU runs the configs' own batch sizes)."""
    bench = get_model(model_name).benchmark
    if config != "paper" or not cpu_batches or bench is None or bench.cpu_batch_size is None:
        return None
    return None if environments.on_gpu(backend, device) else bench.cpu_batch_size


def bench_overrides(model_name, backend, config="paper", device=None, cpu_batches=True):
    """Hyperparameters a suite run sets on a CPU besides the batch (the model's card's
    ``benchmark.cpu_overrides``), under the same conditions as :func:`bench_batch_size`;
    empty on a GPU."""
    bench = get_model(model_name).benchmark
    if config != "paper" or not cpu_batches or bench is None or not bench.cpu_overrides:
        return {}
    return {} if environments.on_gpu(backend, device) else dict(bench.cpu_overrides)


def run_one(model_name, backend, config="paper", batch_size=None, overrides=None, **options):
    """Build in a worker, profile, close; always returns a record (docs/records.md), which
    also names the execution options and the hyperparameters set away from the config.
    ``options`` are those of :func:`_profile`."""
    overrides = dict(overrides or {})
    if batch_size:
        overrides["batch_size"] = batch_size
    record = _profile(model_name, backend, config, overrides, **options)
    return _with_options(record, model_name, config, overrides)


def run_distributed(model_name, backend, config="paper", batch_size=None, overrides=None,
                    world=None, baseline=False, **options):
    """A data-parallel run (docs/distributed.md); ``world`` holds the keyword arguments of
    :func:`tbdzoo.distributed.run` that place the processes (nproc, nnodes, node_rank, master,
    hosts, interface, global_batch, bn_mode, rank_timeout, step_timeout). With ``baseline``
    a one-process run of the same per-replica batch comes first and gives the speedup; the
    records are returned in the order they ran (None on a node without rank 0)."""
    overrides = dict(overrides or {})
    world = dict(world or {})
    keep = ("warmup", "steps", "repeats", "seed", "device", "samplers", "command", "data")
    kwargs = {k: v for k, v in options.items() if k in keep}
    records, base = [], None
    size = batch_size or overrides.get("batch_size")
    if baseline:
        one = dict(world, nproc=1, nnodes=1, node_rank=0, master=None, hosts=None)
        if world.get("global_batch"):
            one["global_batch"] = world["global_batch"]
        base = _distributed_record(distributed.run, model_name, backend, config, size, overrides,
                                   dict(kwargs, **one))
        records.append(base)
        if base["status"] != "ok":
            return records
    records.append(_distributed_record(distributed.run, model_name, backend, config, size,
                                       overrides, dict(kwargs, baseline=base, **world)))
    return [r for r in records if r is not None]


def _distributed_record(run, model_name, backend, config, size, overrides, kwargs):
    try:
        record = run(model_name, backend, config=config, batch_size=size, overrides=overrides,
                     **kwargs)
    except Exception as e:  # noqa: BLE001  (a failed run is a result, not the end of a sweep)
        message = str(e) if isinstance(e, TbdError) else "{}: {}".format(type(e).__name__, e)
        record = failed_record(model_name, backend, config, size, message, kwargs.get("command"))
        record["distributed"] = {k: kwargs.get(k) for k in ("nproc", "nnodes", "global_batch",
                                                             "bn_mode")}
    if record is None:
        return None
    with_size = dict(overrides, **({"batch_size": size} if size else {}))
    return _with_options(record, model_name, config, with_size)


def _with_options(record, model_name, config, overrides):
    try:
        base = get_model(model_name).configs.get(config, {})
    except TbdError:
        base = {}
    for option in EXECUTION_DEFAULTS:
        record.setdefault(option, overrides.get(option, base.get(option)))
    record["overrides"] = OrderedDict(sorted(overrides.items()))
    return record


def _profile(model_name, backend, config, overrides, warmup=5, steps=20, repeats=3, seed=0,
             device=None, samplers=True, peak_flops=None, memory_cap=None, progress=None,
             status=None, command=None, data=None, min_repeat_s=0.0):
    model, cap = None, None
    try:
        if status:
            status("building")
        model = build(model_name, backend=backend, config=config, seed=seed, isolate=True,
                      device=device, **overrides)
        if status:
            status("training")
        options = dict(steps=steps, warmup=warmup, repeats=repeats, samplers=samplers,
                       peak_flops=peak_flops, progress=progress, command=command)
        if min_repeat_s:
            options["min_repeat_s"] = min_repeat_s
        timing = dict(steps=steps, warmup=warmup, repeats=repeats, samplers=samplers,
                      progress=progress)
        if not memory_cap:
            return _with_data(model.profile_in_worker(**options), model, data, timing, status)
        with MemoryCap(model.pid, memory_cap) as cap:
            try:
                record = _with_data(model.profile_in_worker(**options), model, data, timing,
                                    status)
            except Exception:
                if cap.tripped is None:
                    raise
        if cap.tripped is None:
            return record
        raise MemoryError("over the cap")  # reported below with the figures
    except Exception as e:  # noqa: BLE001  (a failed run is a result, not the end of the suite)
        message = "{}: {}".format(type(e).__name__, e) if not isinstance(e, TbdError) else str(e)
        state = None
        if cap is not None and cap.tripped:
            message = "peak resident memory {:.2f} GiB passed the memory cap of {:.2f} GiB".format(
                cap.tripped / 2 ** 30, memory_cap / 2 ** 30)
            state = "oom"
        size = overrides.get("batch_size") or (model.hparams["batch_size"] if model else None)
        return failed_record(model_name, backend, config, size, message, command, state)
    finally:
        if model is not None:
            model.close()


def _with_data(record, model, data, timing, status=None):
    """The synthetic record, plus under "data" the same model trained from ``data`` (the
    options of tbdzoo.pipelines.measure.data_fed: dir, split, augment, workers, prefetch,
    deterministic, seed) after it; a failure there marks the whole record failed."""
    if not data or record.get("status") != "ok":
        return record
    if status:
        status("training on {}".format(data["dir"]))
    options = dict(data, **timing)
    options["data_dir"] = options.pop("dir")
    try:
        # A backend's own input pipeline runs beside the model in its worker, except where
        # its BackendInfo says its environment cannot decode images (feeds_from_here): then
        # the pipeline runs here and each batch goes to the worker as arrays (docs/pipelines.md).
        if backend_info(model.backend).feeds_from_here:
            fed = data_fed(model, **options)
        else:
            fed = model.data_fed_in_worker(**options)
    except Exception as e:  # noqa: BLE001  (the synthetic figures stay; the record says what failed)
        message = str(e) if isinstance(e, TbdError) else "{}: {}".format(type(e).__name__, e)
        record["status"], record["error"] = "error", "data-fed run: " + message
        record["data"] = OrderedDict([("dir", data["dir"]), ("error", message)])
        return record
    synthetic = record["throughput"]["value"]
    fed["vs_synthetic"] = fed["throughput"]["value"] / synthetic if synthetic else None
    fed["input_bound"] = fed["input_wait_fraction"] > INPUT_BOUND_WAIT
    record["data"] = fed
    return record


def append_record(path, record):
    """One JSON object per line, flushed and synced so a killed suite keeps finished runs."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def plan(models=None, backends=None):
    """(model, backend) pairs; unknown names fail here, before anything runs."""
    models = models or list_models()
    for m in models:
        get_model(m)
    for b in backends or []:
        check_backend(b)
    backends = backends or ready_backends()
    return [(m, b) for m in models for b in backends]


def sweep(model_name, backend, batch_sizes, run=run_one, on_record=None, **options):
    """Ascending batch sizes until one runs out of memory (or fails); returns the records."""
    records = []
    for size in sorted(batch_sizes):
        record = run(model_name, backend, batch_size=size, **options)
        records.append(record)
        if on_record:
            on_record(record)
        if record["status"] != "ok":
            break
    return records


def run_async(backend, learners, config="paper", frames=None, seconds=None, seed=0, device=None,
              overrides=None, command=None):
    """One asynchronous A3C run (docs/a3c.md) as a record: the throughput is frames/s (skipped
    frames counted) and ``asynchronous`` holds the learners, updates/s and each learner's CPU
    utilisation. It runs from this process, whose learners are the workers; a failure becomes
    a record, as for any run."""
    overrides = dict(overrides or {})
    try:
        result = train_a3c(backend, config, learners=learners, frames=frames, seconds=seconds,
                           seed=seed, device=device, **overrides)
    except Exception as e:  # noqa: BLE001  (a failed run is a result, not the end of a sweep)
        message = str(e) if isinstance(e, TbdError) else "{}: {}".format(type(e).__name__, e)
        record = failed_record(A3C, backend, config, None, message, command)
        record["asynchronous"] = OrderedDict([("learners", learners)])
        return _with_options(record, A3C, config, overrides)
    record = run_record(A3C, backend, config, "ok", None, None, [
        ("device", device or "cpu"),
        ("throughput", OrderedDict([("value", result.frames_per_second), ("unit", "frames/s")])),
        ("asynchronous", result.record())], command)
    return _with_options(record, A3C, config, overrides)


def sweep_learners(backend, learners, run=run_async, on_record=None, **options):
    """Asynchronous A3C at each number of learners, ascending; every point runs (a failure is a
    record). Returns the records."""
    records = []
    for n in sorted(learners):
        record = run(backend, n, **options)
        records.append(record)
        if on_record:
            on_record(record)
    return records


__all__ = ["run_one", "run_distributed", "sweep", "run_async", "sweep_learners", "plan", "append_record",
           "ready_backends", "MemoryCap", "bench_batch_size", "bench_overrides"]
