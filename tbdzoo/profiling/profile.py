"""``profile``: the measuring protocol plus every sampler and accounting, as one run record.

It runs where the model runs: in this process for a native model, inside the worker for one
that lives in a worker (the samplers then see only that worker, which keeps figures clean).
Valid Python 3.6: the CNTK worker runs it.
"""
import datetime
import sys
from collections import OrderedDict
from typing import Any, Callable, Dict, Mapping, Optional

from ..backends.programs import split_step_batch
from . import flops as flops_mod
from . import memory as memory_mod
from .cpu import CpuMeter
from .fingerprint import fingerprint
from .gpu import GpuSampler, device_info, framework_device_uuid, nvml_index
from .resident import PeakWindow, release_free_heap, resident_bytes
from .timing import time_training

SCHEMA = "tbdzoo.run/1"


def _growth(resident, before_build):
    """Resident bytes over the process's footprint just before the model was built (0 when
    memory held then, by an earlier model, has been freed since)."""
    if resident is None or before_build is None:
        return None
    return max(resident - before_build, 0)


def _batch_size(batch, spec=None):
    """Examples in a NumPy batch: the leading dimension its arrays share; for a training
    program's step, the examples of one update (tbdzoo/backends/programs.py)."""
    if spec is not None and spec.program is not None:
        return int(split_step_batch(spec, spec.program, batch)[1])
    return int(len(next(iter(batch.values()))))


def profile(model: Any, steps: int = 20, warmup: int = 5, repeats: int = 3,
            batch: Optional[Mapping[str, Any]] = None, samplers: bool = True,
            peak_flops: Optional[float] = None, progress: Optional[Callable[..., Any]] = None,
            command: Optional[str] = None, min_repeat_s: float = 0.0) -> Dict[str, Any]:
    """Time ``model`` by the protocol and return a run record (docs/records.md);
    ``min_repeat_s``: each repeat runs about this long or more (tbdzoo.profiling.timing)."""
    if hasattr(model, "profile_in_worker"):
        extra = {"min_repeat_s": min_repeat_s} if min_repeat_s else {}
        return model.profile_in_worker(steps=steps, warmup=warmup, repeats=repeats, batch=batch,
                                       samplers=samplers, peak_flops=peak_flops,
                                       progress=progress, command=command, **extra)
    batch = model.synthetic_batch() if batch is None else batch
    prepared = model.prepare_batch(batch)
    device = model.device
    cpu = CpuMeter() if samplers else None
    cuda = device.startswith("cuda")
    ordinal = int(device.split(":")[1]) if device.startswith("cuda:") else 0
    gpu_index = nvml_index(ordinal, framework_device_uuid(model.backend, ordinal)) if cuda else None
    gpu = GpuSampler(gpu_index) if samplers and cuda else None
    meters = [m for m in (cpu, gpu) if m is not None]
    window = PeakWindow().start()  # the peak is this profile's, not the process's so far
    timing = time_training(model, prepared, warmup, steps, repeats, progress, meters,
                           min_repeat_s)
    steps = timing["protocol"]["steps"]  # min_repeat_s may have asked for more
    readings = dict(zip([type(m).__name__ for m in meters], timing.pop("meters")))
    gpu_reading = readings.get("GpuSampler")
    if gpu_reading is not None and gpu_reading.get("energy_j") is not None:
        gpu_reading["energy_j_per_step"] = gpu_reading.pop("energy_j") / (steps * repeats)

    before_build = getattr(model, "rss_before_build", None) if device == "cpu" else None
    steady = None
    if before_build is not None and release_free_heap():  # else freed blocks would count as held
        steady = _growth(resident_bytes(), before_build)  # what stays resident between steps
    measured = dict(model.measure_memory(prepared) or {})
    peak = measured.pop("peak", None)  # at_peak, when present, stays for breakdown()
    measured_groups = measured.pop("by_group", None)
    scope = measured.pop("peak_scope", None)  # where the backend says what its peak covers
    peak_scope = (scope or "step") if peak is not None else None
    if peak is None and before_build is not None:
        peak, peak_scope = _growth(window.peak(), before_build), window.scope
    precision = model.hparams.get("precision", "fp32")
    batch_size = _batch_size(batch, model.spec)  # the batch that ran, which may not be the config's
    batch_bytes = sum(int(getattr(v, "nbytes", 0)) for v in batch.values())
    analytic = memory_mod.analytic(model.spec, model.hparams, batch_size, batch_bytes, precision)
    gpu_info = device_info(gpu_index) if cuda else None
    flops = flops_mod.summary(model.spec, batch_size, timing["step_time"]["median"],
                              (gpu_info or {}).get("name"), precision, peak_flops)
    if hasattr(model, "measure_flops"):  # the compiler's own count, beside the spec's
        flops["measured"] = model.measure_flops(prepared)

    record = run_record(model.name, model.backend, model.hparams["config"], "ok", None, batch_size, [
        ("precision", precision), ("device", device),
        ("throughput", OrderedDict([("value", timing["throughput"]), ("unit", timing["unit"]),
                                    ("items_per_step", timing["items_per_step"])])),
        ("step_time", timing["step_time"]), ("first_step_s", timing["first_step_s"]),
        ("build_s", getattr(model, "build_seconds", None)), ("protocol", timing["protocol"]),
        ("cpu", readings.get("CpuMeter")), ("gpu", gpu_reading),
        ("flops", flops),
        ("memory", memory_mod.breakdown(analytic, measured, peak, steady, peak_scope)),
        ("memory_by_network", memory_mod.merge_by_group(
            memory_mod.by_group(model.spec, batch_size, precision), measured_groups)),
        ("losses", timing["losses"]),
    ], command, fingerprint(model.framework, model.framework_version(), gpu_info))
    if not timing["finite"]:
        record["status"], record["error"] = "error", "a loss was not finite: {}".format(timing["losses"])
    return record


OOM_MARKERS = ("out of memory", "outofmemory", "resourceexhausted", "cudamalloc failed",
               "failed to allocate", "std::bad_alloc", "cannot allocate memory", "memory cap")


def classify(message):
    """'oom' for the ways frameworks say they ran out of memory, else 'error'."""
    text = message.lower().replace(" ", "")
    return "oom" if any(m.replace(" ", "") in text for m in OOM_MARKERS) else "error"


def run_record(model_name, backend, config, status, error, batch_size, fields=(), command=None,
               env=None):
    """A run record (docs/records.md), the one place every record of ``tbd run`` and ``tbd
    bench`` is built: what ran and how it ended, ``fields`` (the figures, (key, value) pairs in
    order), then the machine (``env``: this one's fingerprint by default), the command and the
    time."""
    record = OrderedDict([
        ("schema", SCHEMA), ("model", model_name), ("backend", backend), ("config", config),
        ("status", status), ("error", error), ("batch_size", batch_size)])
    record.update(fields)
    record["env"] = fingerprint() if env is None else env
    record["command"] = command or " ".join(sys.argv)
    record["timestamp"] = datetime.datetime.utcnow().replace(microsecond=0).isoformat() + "Z"
    return record


def failed_record(model_name, backend, config, batch_size, message, command=None, status=None):
    """The record of a run that did not finish: ``status`` 'oom' or 'error' (by the message)."""
    return run_record(model_name, backend, config, status or classify(message), message,
                      batch_size, command=command)
