"""Where tbdzoo's Faster R-CNN training step spends its time: the forward half the targets step
reads, the targets step on the host (anchor targets, proposals with their NMS, RoI sampling,
RoIAlign's gather points), the upload of what it writes, and the whole step; with
``--profile``, the GPU kernel time of a step on each side (tbdzoo and torchvision).

    python3 -m benchmarks.faster_rcnn_step_phases --out phases.json            # on a GPU
    .venv/bin/python -m benchmarks.faster_rcnn_step_phases --device cpu --tiny   # a check

The same model, image and calibrated frozen batch norm as benchmarks/gpu_faster_rcnn.py (tf32
or bf16, channels-last, learning rate 1e-12). Every phase is timed on its own, with the device
synchronised before and after it, so the phases do not overlap here as they do in a free-running
step (the anchor targets run while the device computes the forward half); the whole step is
timed without those synchronisations. Figures are medians over ``--steps`` steps, in ms.
"""
import argparse
import json
import os
import statistics
import time

HERE = os.path.dirname(os.path.abspath(__file__))

import torch

from benchmarks import gpu_faster_rcnn as bench
from benchmarks.gpu_recurrent import synchronize

# (module attribute, phase name): what each phase times
PHASES = (("models.faster_rcnn", "rpn_targets", "anchor targets"),
          ("models.faster_rcnn", "proposals", "proposals (decode, sort, NMS)"),
          ("models.faster_rcnn", "sample_rois", "RoI sampling"),
          ("models.faster_rcnn", "roi_align_points", "RoIAlign gather points"))


def timed(times, name, function, device):
    """``function`` with every call timed, synchronised before and after, into times[name]."""
    def wrapper(*args, **kwargs):
        synchronize(str(device))
        start = time.perf_counter()
        result = function(*args, **kwargs)
        synchronize(str(device))
        times.setdefault(name, []).append(time.perf_counter() - start)
        return result
    return wrapper


def build(device, precision, tiny):
    """tbdzoo's model as the benchmark builds it, its prepared batch, the hyperparameters, the
    batch and the calibrated weights."""
    import tbdzoo
    from tbdzoo.models import get_model
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    config = get_model(bench.MODEL).configs["tiny" if tiny else "paper"]
    cuda = device.startswith("cuda")
    model = tbdzoo.build(bench.MODEL, backend="torch", config="tiny" if tiny else "paper",
                         device=device, precision=precision if cuda else "fp32",
                         memory_format="channels_last", lr=bench.STILL_LR,
                         canvas=bench.padded_canvas(config))
    batch = bench.benchmark_batch(model.hparams, config["canvas"])
    weights, _ = bench.calibrate_frozen_batchnorm(model.hparams, model.get_weights(), batch,
                                                  device)
    model.set_weights(weights)
    return model, model.prepare_batch(batch), batch, weights


def step_times(step, device, warmup, steps):
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        synchronize(str(device))
        start = time.perf_counter()
        step()
        synchronize(str(device))
        times.append(time.perf_counter() - start)
    return times


def phase_times(model, prepared, device, warmup, steps):
    """Each phase's times over ``steps`` steps, the functions wrapped for the length of the call."""
    import importlib

    from tbdzoo.backends.torch import model as torch_model
    times, saved = {}, []
    targets = [(importlib.import_module("tbdzoo." + module), attr, name)
               for module, attr, name in PHASES]
    targets += [(torch_model.Model, "_targets_of", "targets step (host, all of it)"),
                (torch_model.Model, "_prepare", "upload of the written inputs"),
                (type(model.native), "values", "forward half")]
    for owner, attr, name in targets:
        saved.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, timed(times, name, getattr(owner, attr), device))
    try:
        step_times(lambda: model.train_step(prepared, sync=False), device, warmup, 0)
        times.clear()
        step_times(lambda: model.train_step(prepared, sync=False), device, 0, steps)
    finally:
        for owner, attr, function in saved:
            setattr(owner, attr, function)
    return times


def profiled(step, device, steps):
    """``steps`` steps under torch.profiler (host and device), the device drained before and
    after; the profiler."""
    from torch.profiler import ProfilerActivity, profile
    synchronize(str(device))
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        synchronize(str(device))
    return prof


def kernel_ms(step, device, steps=5):
    """GPU kernel time of one step (ms), summed over the profiler's device events (each
    kernel also counts in the host op that launched it: those are left out)."""
    from torch.autograd import DeviceType
    prof = profiled(step, device, steps)
    return sum(e.self_device_time_total for e in prof.key_averages()
               if e.device_type == DeviceType.CUDA) / steps / 1e3


def device_idle(trace_path):
    """From a chrome trace: the span from the first to the last device event, the time no
    kernel, copy or memset ran in it, and the longest such gap (ms)."""
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    spans = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in events
                   if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    busy, longest, end = 0.0, 0.0, spans[0][0]
    for start, stop in spans:
        if start > end:
            longest = max(longest, start - end)
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    span = end - spans[0][0]
    return {"span_ms": span / 1e3, "idle_ms": (span - busy) / 1e3, "longest_gap_ms": longest / 1e3}


def traced(step, device, path, steps=3):
    """``steps`` steps under torch.profiler, written as a chrome trace to ``path``; the
    device's idle time over them, a step's share."""
    profiled(step, device, steps).export_chrome_trace(path)
    idle = device_idle(path)
    return {"span_ms": idle["span_ms"] / steps, "idle_ms": idle["idle_ms"] / steps,
            "longest_gap_ms": idle["longest_gap_ms"], "trace": os.path.basename(path)}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--precision", default="tf32", choices=("tf32", "bf16"))
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="tiny config (a CPU check)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--profile", action="store_true",
                   help="also each side's GPU kernel time a step (torch.profiler)")
    p.add_argument("--trace", metavar="DIR",
                   help="also a chrome trace of three steps on each side in DIR, and the "
                        "device's idle time a step in the record")
    p.add_argument("--out", default=os.path.join(HERE, "results", "faster_rcnn_step_phases.json"))
    args = p.parse_args()
    model, prepared, batch, weights = build(args.device, args.precision, args.tiny)
    def ours():
        return model.train_step(prepared, sync=False)
    whole = step_times(ours, args.device, args.warmup, args.steps)
    phases = phase_times(model, prepared, args.device, args.warmup, args.steps)
    record = {"model": bench.MODEL, "config": "tiny" if args.tiny else "paper",
              "precision": args.precision, "device": args.device, "steps": args.steps,
              "step_ms": 1e3 * statistics.median(whole),
              "phases_ms": {k: 1e3 * statistics.median(v) for k, v in phases.items()},
              "phase_calls_per_step": {k: len(v) / args.steps for k, v in phases.items()}}
    if args.profile and args.device.startswith("cuda"):
        _, _, theirs, _, _ = bench.torchvision_step(model.hparams, weights, batch, args.device,
                                                    args.precision, False, False)
        their_times = step_times(theirs, args.device, args.warmup, args.steps)
        record["torchvision_step_ms"] = 1e3 * statistics.median(their_times)
        record["kernel_ms_per_step"] = {"tbdzoo": kernel_ms(ours, args.device),
                                        "torchvision": kernel_ms(theirs, args.device)}
    if args.trace and args.device.startswith("cuda"):
        os.makedirs(args.trace, exist_ok=True)
        record["device_idle"] = {"tbdzoo": traced(
            ours, args.device, os.path.join(args.trace, "tbdzoo_{}.json".format(args.precision)))}
        if "torchvision_step_ms" in record:
            record["device_idle"]["torchvision"] = traced(
                theirs, args.device,
                os.path.join(args.trace, "torchvision_{}.json".format(args.precision)))
    record["environment"] = bench.environment() if args.device.startswith("cuda") else None
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)
    print("step {:.2f} ms".format(record["step_ms"]))
    for name, ms in record["phases_ms"].items():
        print("  {:<32} {:7.2f} ms  ({:g} a step)".format(
            name, ms, record["phase_calls_per_step"][name]))
    for name, ms in record.get("kernel_ms_per_step", {}).items():
        print("  GPU kernels a step, {:<12} {:7.2f} ms".format(name, ms))
    for name, idle in record.get("device_idle", {}).items():
        print("  device idle a step, {:<12} {:7.2f} of {:.2f} ms (longest gap {:.2f})".format(
            name, idle["idle_ms"], idle["span_ms"], idle["longest_gap_ms"]))
    print("written to", args.out)


if __name__ == "__main__":
    main()
