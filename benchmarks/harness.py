"""The measuring harness of the GPU comparisons (tbdzoo against hand-written PyTorch baselines).

A comparison script (``benchmarks/gpu_programs.py``, ``benchmarks/gpu_recurrent.py``) builds its
contenders in one process and hands them to this module, which

- times them in interleaved rounds (``interleaved_rounds``): every round runs ``steps`` steps of
  each contender between two device synchronisations, and the order rotates from round to round,
  so a drift of the machine (clocks, temperature, another tenant) falls on every contender alike;
- measures each contender's peak memory (``peak_memory``): the allocator's high-water mark over
  one step, less what the other contenders keep allocated meanwhile (their weights, gradients and
  optimizer state);
- profiles a few steps of each contender (``profile_summary``): kernels launched, device time
  and host time per step, the costliest kernels;
- runs the repeat protocol (``run_processes``): each cell is measured by at least two separate
  processes of at least five rounds each, one after the other, and ``summarize`` reports every
  contender's median step time with the spread of its rounds and of its processes, and every
  ratio with its spread. A ratio whose spread (every round of every process, paired round by
  round) reaches both sides of 1.0 is PARITY, not a lead; ``verdict`` says which.

``environment`` records the machine: GPU, driver, CUDA, cuDNN, torch, Python, host cores.
PyTorch is imported at its first use: a script of another framework
(``benchmarks/flax_handwritten.py``, run in .venv-jax) uses the parts that need none.

A script's own parts come from here too: ``comparison_parser`` (the options every script shares;
the script adds its own), ``run_cells`` (one process's model x execution x precision cells, the
record rewritten after each) and ``main`` (the process or the repeat protocol over processes).
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback


class _Torch:
    """PyTorch, imported at the first use of one of its names: a script of another framework
    (.venv-jax has no torch) uses the parts that need none, and never loads it."""

    def __getattr__(self, name):
        import torch as module
        globals()["torch"] = module
        return getattr(module, name)


torch = _Torch()

ROUNDS_AT_LEAST = 5
PROCESSES_AT_LEAST = 2


# -- the machine ----------------------------------------------------------------------------------
def environment(device="cuda:0"):
    """What the numbers were measured on (no paths of the machine)."""
    env = {"torch": torch.__version__, "python": platform.python_version(),
           "host_cpus": os.cpu_count(), "host_machine": platform.machine(), "device": device}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(device)
        env.update({"gpu": props.name, "gpu_memory_bytes": props.total_memory,
                    "multiprocessors": props.multi_processor_count,
                    "cuda_runtime": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
                    "driver": _driver_version()})
    return env


def _driver_version():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True, timeout=30)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def synchronize(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize(device)


# -- memory ---------------------------------------------------------------------------------------
def held_bytes(modules, optimizers):
    """Parameters, gradients and optimizer state a contender keeps between steps."""
    total = 0
    for m in modules:
        for p in m.parameters():
            total += p.nbytes + (p.grad.nbytes if p.grad is not None else 0)
    for opt in optimizers:
        total += sum(v.nbytes for s in opt.state.values() for v in s.values() if torch.is_tensor(v))
    return total


def peak_bytes(step, device):
    """The allocator's high-water mark over one step of ``step``."""
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    synchronize(device)
    return torch.cuda.max_memory_allocated(device)


def peak_memory(contenders, held, device):
    """Each contender's peak bytes over one step, less what the others hold meanwhile.

    ``contenders``: name -> step function; ``held``: name -> function giving the bytes that
    contender keeps between steps (``held_bytes`` of its modules and optimizers). None on a CPU."""
    if not str(device).startswith("cuda"):
        return {name: None for name in contenders}
    out = {}
    for name, step in contenders.items():
        others = sum(held[other]() for other in contenders if other != name)
        out[name] = peak_bytes(step, device) - others
    return out


# -- time -----------------------------------------------------------------------------------------
def interleaved_rounds(contenders, device, steps, rounds, wait=None):
    """Seconds per step of each contender, one figure per round; the order rotates each round.
    ``wait(name)`` returns once that contender's queued work is done (default: the CUDA device's
    synchronisation; a framework without one passes its own)."""
    wait = wait or (lambda name: synchronize(device))
    names = list(contenders)
    times = {name: [] for name in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            wait(name)
            t0 = time.perf_counter()
            for _ in range(steps):
                contenders[name]()
            wait(name)
            times[name].append((time.perf_counter() - t0) / steps)
    return times


def warm_and_time(contenders, device, warmup, steps, rounds):
    """``warmup`` untimed steps of each contender, then :func:`interleaved_rounds`."""
    for step in contenders.values():
        for _ in range(warmup):
            step()
    return interleaved_rounds(contenders, device, steps, rounds)


def cell_record(args, device, contenders, start, model, batch, model_name, precision, execution,
                times, peaks, first, checks, warmup=None, steps=None, batch_size=None,
                details=None):
    """One cell's record, as every comparison script writes it: what was run (config, batch
    size, unit and items per step from tbdzoo's ``model``; warm-up and steps, ``args``' unless
    given), its times, peaks, first losses and checks, the script's ``details``, each
    contender's profile with ``--profile``, and the seconds since ``start``."""
    hp = model.hparams
    cell = {"model": model_name, "precision": precision, "execution": execution,
            "config": "tiny" if args.tiny else "paper",
            "batch_size": hp["batch_size"] if batch_size is None else batch_size,
            "unit": model.model_def.unit, "items_per_step": model.model_def.items(hp, batch),
            "warmup": args.warmup if warmup is None else warmup,
            "steps": args.steps if steps is None else steps,
            "times": times, "peak_bytes": peaks, "first_loss": first, "checks": checks}
    if details is not None:
        cell["details"] = details
    if args.profile:
        cell["profile"] = {name: profile_summary(step, device) for name, step in contenders.items()}
    cell["cell_seconds"] = time.perf_counter() - start
    return cell


def profile_summary(step, device, steps=3, top=12):
    """``steps`` steps of ``step`` under torch.profiler: per step, the kernels launched, their
    summed device time, the host's wall time, and the ``top`` costliest kernels."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    cuda = str(device).startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    synchronize(device)
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        synchronize(device)
    wall = (time.perf_counter() - t0) / steps
    kernels = [e for e in prof.key_averages() if e.device_type == DeviceType.CUDA]
    kernels.sort(key=lambda e: e.self_device_time_total, reverse=True)
    return {"steps": steps, "wall_ms_per_step_profiled": 1e3 * wall,
            "kernels_per_step": sum(e.count for e in kernels) / steps,
            "device_ms_per_step": sum(e.self_device_time_total for e in kernels) / 1e3 / steps,
            "top_kernels": [{"name": e.key[:100], "per_step": e.count / steps,
                             "ms_per_step": e.self_device_time_total / 1e3 / steps}
                            for e in kernels[:top]]}


# -- the repeat protocol --------------------------------------------------------------------------
def run_processes(module, argv, processes, work_dir, on_process=None):
    """Run ``python -m module argv --process-out FILE`` ``processes`` times, one after the
    other, each a fresh interpreter; return each run's JSON (a list of cells). ``on_process``
    is called with the records so far after each run, so a run cut short keeps what it had."""
    os.makedirs(work_dir, exist_ok=True)
    records = []
    for i in range(processes):
        path = os.path.join(work_dir, "{}-process{}.json".format(module.rsplit(".", 1)[-1], i))
        if os.path.exists(path):
            os.remove(path)
        cmd = [sys.executable, "-m", module] + list(argv) + ["--process-out", path,
                                                             "--process-index", str(i)]
        print("process {} of {}: {}".format(i + 1, processes, " ".join(cmd[1:])), flush=True)
        rc = subprocess.call(cmd)
        if os.path.exists(path):
            with open(path) as f:
                records.append(json.load(f))
        if rc != 0:
            print("process {} exited with {}".format(i + 1, rc), file=sys.stderr, flush=True)
        if on_process is not None:
            on_process(records)
    return records


def merge_processes(records, key=("model", "precision", "execution")):
    """Group the cells of every process's record by ``key``: [(key values, [cell per process])]."""
    groups = {}
    for record in records:
        for cell in record["cells"]:
            groups.setdefault(tuple(cell.get(k) for k in key), []).append(cell)
    return list(groups.items())


def verdict(low, high):
    """'ahead' when the whole spread of the ratio is above 1.0, 'behind' when it is below,
    'parity' when it reaches 1.0 (a lead inside the run-to-run spread is no lead)."""
    if low > 1.0:
        return "ahead"
    if high < 1.0:
        return "behind"
    return "parity"


def summarize(cells, subject="tbdzoo", baselines=("handwritten",), items=None):
    """One cell's measurement from the processes that measured it.

    ``cells``: one dict per process, each holding ``times`` (contender -> seconds per step, one per
    round) and ``peak_bytes`` (contender -> bytes or None). Of ``baselines``, the one with the
    lowest median step time over all rounds is THE baseline; every baseline's ratio is reported.
    Speed ratio = baseline step time / subject step time (above 1: the subject is faster), paired
    round by round within each process, the median of those pairs (a process that runs both
    sides slower moves both alike); memory ratio = subject peak / baseline peak."""
    names = list(cells[0]["times"])
    out = {"processes": len(cells), "rounds_per_process": [len(c["times"][subject]) for c in cells],
           "contenders": {}}
    for name in names:
        pooled = [t for c in cells for t in c["times"][name]]
        medians = [statistics.median(c["times"][name]) for c in cells]
        peaks = [c["peak_bytes"].get(name) for c in cells]
        entry = {"step_s_median": statistics.median(pooled), "step_s_rounds": [min(pooled), max(pooled)],
                 "step_s_process_medians": medians,
                 "peak_bytes": statistics.median(peaks) if None not in peaks else None,
                 "peak_bytes_processes": peaks}
        if items is not None:
            entry["throughput"] = items / entry["step_s_median"]
        out["contenders"][name] = entry
    present = [b for b in baselines if b in names]
    best = min(present, key=lambda b: out["contenders"][b]["step_s_median"])
    out["baseline"] = best
    out["ratios"] = {}
    for b in present:
        rounds = [tb / ts for c in cells for tb, ts in zip(c["times"][b], c["times"][subject])]
        procs = [statistics.median(c["times"][b]) / statistics.median(c["times"][subject]) for c in cells]
        speed = statistics.median(rounds)
        low, high = min(rounds + procs), max(rounds + procs)
        ratio = {"speed": speed, "speed_rounds": [min(rounds), max(rounds)], "speed_processes": procs,
                 "speed_verdict": verdict(low, high)}
        mem = [c["peak_bytes"].get(subject) / c["peak_bytes"][b] for c in cells
               if c["peak_bytes"].get(subject) and c["peak_bytes"].get(b)]
        if mem:
            ratio.update({"memory": statistics.median(mem), "memory_processes": mem})
        out["ratios"][b] = ratio
    out["speed"] = out["ratios"][best]["speed"]
    out["speed_verdict"] = out["ratios"][best]["speed_verdict"]
    out["memory"] = out["ratios"][best].get("memory")
    return out


def check_protocol(rounds, processes):
    """The repeat protocol's floor, for a run meant to be reported (not a check that it runs)."""
    return rounds >= ROUNDS_AT_LEAST and processes >= PROCESSES_AT_LEAST


def format_row(key, summary):
    """One line of a cell's summary for the terminal."""
    best = summary["baseline"]
    r = summary["ratios"][best]
    sub = summary["contenders"]["tbdzoo"]
    base = summary["contenders"][best]
    mem = "" if r.get("memory") is None else " memory {:.3f}x".format(r["memory"])
    return ("{:<24} tbdzoo {:8.2f} ms  {} {:8.2f} ms  speed {:.3f}x [{:.3f}-{:.3f}] {}{}".format(
        " ".join(str(k) for k in key), 1e3 * sub["step_s_median"], best, 1e3 * base["step_s_median"],
        r["speed"], min(r["speed_rounds"] + r["speed_processes"]),
        max(r["speed_rounds"] + r["speed_processes"]), r["speed_verdict"].upper(), mem))


# -- a script's protocol ---------------------------------------------------------------------------------
KEY = ("model", "precision", "execution")
CELL_FIELDS = ("config", "batch_size", "unit", "items_per_step", "warmup", "steps")


def aggregate(records, command, protocol, key=KEY):
    """The cells of every process's record merged by ``key``, each summarised (``summarize``)."""
    env = records[0]["environment"] if records else None
    out = {"command": command, "environment": env, "protocol": protocol, "cells": []}
    for values, cells in merge_processes(records, key):
        ok = [c for c in cells if "error" not in c]
        entry = dict(zip(key, values))
        if not ok:
            entry["error"] = [c.get("error") for c in cells]
            out["cells"].append(entry)
            continue
        c0 = ok[0]
        entry.update({k: c0[k] for k in CELL_FIELDS if k in c0})
        entry.update(summarize(ok, "tbdzoo", [n for n in c0["times"] if n != "tbdzoo"],
                               items=c0["items_per_step"]))
        entry["meets_protocol"] = check_protocol(min(entry["rounds_per_process"]), entry["processes"])
        entry["first_loss"] = [c["first_loss"] for c in ok]
        entry["checks"] = [c["checks"] for c in ok if c["checks"]]
        entry["profile"] = next((c["profile"] for c in ok if "profile" in c), None)
        if any(c.get("details") for c in ok):
            entry["details"] = [c.get("details") for c in ok]
        entry["rounds"] = [{"times": c["times"], "peak_bytes": c["peak_bytes"]} for c in ok]
        entry["errors"] = [c["error"] for c in cells if "error" in c]
        out["cells"].append(entry)
    return out


def records_of(result, key=KEY):
    """The per-process records an aggregate was made from (to merge processes run apart)."""
    records = []
    for cell in result["cells"]:
        if "rounds" not in cell:
            continue
        for i, r in enumerate(cell["rounds"]):
            while len(records) <= i:
                records.append({"process_index": len(records), "environment": result["environment"],
                                "cells": []})
            c = {k: cell[k] for k in tuple(key) + CELL_FIELDS if k in cell}
            checks = cell.get("checks") or []
            c.update({"times": r["times"], "peak_bytes": r["peak_bytes"], "first_loss": cell["first_loss"][i],
                      "checks": checks[i] if i < len(checks) else {}})
            if cell.get("details"):
                c["details"] = cell["details"][i]
            if i == len(cell["rounds"]) - 1 and cell.get("profile"):
                c["profile"] = cell["profile"]
            records[i]["cells"].append(c)
    return records


def merge_files(paths, key=KEY):
    """One result from the results of several runs of one script (say its eager and its
    compiled cells, run apart): every cell recomputed from its processes' rounds. A cell two
    runs both measured gets the processes of both."""
    results = []
    for path in paths:
        with open(path) as f:
            results.append(json.load(f))
    records = [r for result in results for r in records_of(result, key)]
    protocols = [r["protocol"] for r in results]
    merged = aggregate(records, " && ".join(r["command"] for r in results),
                       protocols[0] if all(p == protocols[0] for p in protocols) else protocols, key)
    _keep_separate_memory(merged, results, key)
    return merged


def _keep_separate_memory(merged, results, key):
    """Peaks measured in processes of their own (not in the timing rounds, so not in the
    records) kept from the one file that measured the cell."""
    for cell in merged["cells"]:
        sources = [c for r in results for c in r["cells"]
                   if all(c.get(k) == cell.get(k) for k in key) and c.get("memory") is not None]
        if cell.get("memory") is not None or len(sources) != 1 or "contenders" not in cell:
            continue
        source = sources[0]
        for name, contender in cell["contenders"].items():
            for field in ("peak_bytes", "peak_bytes_processes"):
                contender[field] = source["contenders"][name].get(field)
        for baseline, ratios in cell.get("ratios", {}).items():
            for field in ("memory", "memory_processes"):
                if field in source["ratios"].get(baseline, {}):
                    ratios[field] = source["ratios"][baseline][field]
        cell["memory"] = source["memory"]


def check_choices(parser, args, models=None, precisions=("tf32", "bf16"), executions=("eager", "compiled")):
    """Refuse unknown models, precisions and executions, and counts the protocol cannot run,
    through ``parser.error`` (exit 2, naming the choices)."""
    for name, allowed in (("models", models), ("precisions", precisions), ("executions", executions)):
        given = getattr(args, name, None)
        if allowed is None or given is None:
            continue
        unknown = sorted(set(given.split(",")) - set(allowed))
        if unknown:
            parser.error("unknown {} {}: choose from {}".format(name, ", ".join(unknown), ", ".join(allowed)))
    for name, least in (("warmup", 0), ("steps", 1), ("rounds", 1), ("processes", 1)):
        value = getattr(args, name, None)
        if value is not None and value < least:
            parser.error("--{} {}: must be at least {}".format(name, value, least))


# -- a comparison script's parts ------------------------------------------------------------------
def comparison_parser(description, out, warmup, models=None, overrides=None):
    """An argument parser with the options every comparison script shares; the script adds its
    own (they follow these in ``--help``) and checks the result with ``check_choices``.

    ``out``: the default result file; ``warmup``: the default warm-up steps; ``models``: the
    script's models (the default of ``--models``; None: no ``--models``, the script has one);
    ``overrides``: option -> the argparse keywords this script gives it instead (its default,
    its help), or None to leave the option out."""
    options = [
        ("--models", {"default": ",".join(models)} if models is not None else None),
        ("--precisions", {"default": "tf32,bf16"}),
        ("--executions", {"default": "eager,compiled"}),
        ("--warmup", {"type": int, "default": warmup}),
        ("--steps", {"type": int, "default": 10, "help": "steps per timed round"}),
        ("--rounds", {"type": int, "default": ROUNDS_AT_LEAST, "help": "interleaved rounds per process"}),
        ("--processes", {"type": int, "default": PROCESSES_AT_LEAST,
                         "help": "separate processes per cell, one after the other"}),
        ("--profile", {"action": "store_true",
                       "help": "a torch.profiler summary of each contender in the last process"}),
        ("--device", {"default": "cuda", "help": "cuda, cuda:N, or cpu (a check that it runs)"}),
        ("--tiny", {"action": "store_true", "help": "tiny configs (a CPU check)"}),
        ("--batch-size", {"type": int, "help": "batch size of every side (default: SHAPES)"}),
    ]
    overrides = overrides or {}
    unknown = set(overrides) - {flag for flag, _ in options}
    if unknown:
        raise ValueError("comparison_parser: no shared option {}".format(", ".join(sorted(unknown))))
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, keywords in options:
        if flag in overrides:
            keywords = None if overrides[flag] is None else dict(keywords or {}, **overrides[flag])
        if keywords is not None:
            p.add_argument(flag, **keywords)
    return p


def add_process_options(p, out):
    """The options of the repeat protocol's bookkeeping: where the processes' records and the
    result go (``out``: the default result file), and the hidden ones of a worker process."""
    p.add_argument("--work-dir", help="where each process writes its record (default: a temporary folder)")
    p.add_argument("--out", default=out)
    p.add_argument("--process-out", help=argparse.SUPPRESS)
    p.add_argument("--process-index", type=int, default=0, help=argparse.SUPPRESS)
    return p


def record_cells(args, environment, cells, report=None):
    """One worker process's record: ``cells`` is a list of (key fields, function measuring the
    cell); ``report(cell)`` prints a measured cell. A cell that raises is recorded as its key
    fields and the error, and the others still run; the record is rewritten to
    ``args.process_out`` after every cell, so a process cut short keeps what it had."""
    record = {"process_index": args.process_index, "environment": environment, "cells": []}
    for key, measure in cells:
        try:
            cell = measure()
            if report is not None:
                report(cell)
        except Exception as e:  # noqa: BLE001  (a failed cell is recorded, the others still run)
            traceback.print_exc()
            cell = dict(key, error="{}: {}".format(type(e).__name__, e))
        record["cells"].append(cell)
        with open(args.process_out, "w") as f:
            json.dump(record, f)
    return 0


def run_cells(args, device, run_cell, describe=None, models=None):
    """A comparison script's worker: ``run_cell(model, precision, compiled, device, args)`` for
    every model (``models``, else ``--models``), execution and precision of ``args``, in that
    order (``record_cells``). Each measured cell's median milliseconds per contender are
    printed, then ``describe(cell)``'s text (say the first losses), then the cell's seconds."""
    def report(cell):
        med = {k: 1e3 * statistics.median(v) for k, v in cell["times"].items()}
        print("  {} {} {}: ".format(cell["model"], cell["precision"], cell["execution"]) + "  ".join(
            "{} {:.2f} ms".format(k, v) for k, v in med.items()) +
            (describe(cell) if describe is not None else "") +
            " ({:.0f}s)".format(cell["cell_seconds"]), flush=True)

    def measure(model, precision, execution):
        def cell():
            record = run_cell(model, precision, execution == "compiled", device, args)
            # the cell's model and contenders are gone with its frame: return their cached
            # blocks, so the next cell starts from an empty allocator
            if str(device).startswith("cuda"):
                torch.cuda.empty_cache()
            return record
        return cell

    cells = [({"model": model, "precision": precision, "execution": execution},
              measure(model, precision, execution))
             for model in (models if models is not None else args.models.split(","))
             for execution in args.executions.split(",")
             for precision in args.precisions.split(",")]
    return record_cells(args, environment(device), cells, report)


def first_losses(cell):
    """``run_cells``' ``describe`` printing every contender's first loss."""
    return " first loss " + " ".join("{:.5g}".format(v) for v in cell["first_loss"].values())


def command_of(module, argv, out):
    """The command a result file records: the script's arguments, its result under
    benchmarks/results/, no work folder."""
    return " ".join(["python3 -m " + module] + _drop(argv, ("--out", "--work-dir")) +
                    ["--out", "benchmarks/results/" + os.path.basename(out)])


def write_result(path, result):
    """``result`` as indented JSON at ``path`` (its folder made); returns ``result``."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    return result


def device_of(args, check="--device cpu --tiny"):
    """The device ``--device`` names (``cuda`` is ``cuda:0``), or None, said on stderr with the
    options (``check``) that check the script without one, where it names CUDA and there is none."""
    device = "cuda:0" if args.device == "cuda" else args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: run with {} to check the script".format(check), file=sys.stderr)
        return None
    return device


def main(module, parse, worker_fn, argv=None):
    """A comparison script's main: with ``--process-out`` one process's cells (``worker_fn``),
    else the repeat protocol over fresh processes, per execution mode, and the aggregate."""
    _p, args = parse(argv)
    device = device_of(args)
    if device is None:
        return 2
    if args.process_out:
        if device.startswith("cuda"):
            torch.cuda.set_device(device)
        return worker_fn(args, device)
    argv = list(sys.argv[1:] if argv is None else argv)
    command = command_of(module, argv, args.out)
    protocol = {"processes": args.processes, "rounds_per_process": args.rounds, "steps_per_round": args.steps,
                "warmup_steps": args.warmup,
                "speed_ratio": "baseline step time / tbdzoo step time (above 1: tbdzoo faster)",
                "memory_ratio": "tbdzoo peak / baseline peak",
                "verdict": "ahead or behind only when every round's and every process's ratio is on one side of 1.0"}
    base = [a for a in argv if a != "--profile"]
    work = args.work_dir or tempfile.mkdtemp(prefix="tbdzoo-bench-")
    records = []

    def save(done):
        return write_result(args.out, aggregate(records + done, command, protocol))

    for execution in args.executions.split(","):
        group = _replace(base, "--executions", execution)
        last = args.processes - 1
        done = []
        for i in range(args.processes):
            extra = ["--profile"] if args.profile and i == last else []
            done += run_processes(module, group + extra, 1, os.path.join(work, "{}-{}".format(execution, i)))
            save(done)
        records += done
    result = save([])
    for cell in result["cells"]:
        if "error" in cell and "contenders" not in cell:
            print(cell["model"], cell["precision"], cell["execution"], "FAILED", cell["error"])
        else:
            print(format_row((cell["model"], cell["precision"], cell["execution"]), cell))
    return 0


def _drop(argv, flags):
    """``argv`` without ``flags`` and their values."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in flags:
            skip = True
        elif not any(a.startswith(f + "=") for f in flags):
            out.append(a)
    return out


def _replace(argv, flag, value):
    return _drop(argv, (flag,)) + [flag, value]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="merge result files of one comparison script: "
                                     "python3 -m benchmarks.harness --out ALL.json A.json B.json")
    parser.add_argument("inputs", nargs="+", help="result files (each a script's --out)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--key", default=",".join(KEY),
                        help="the fields cells merge by (default model,precision,execution; "
                             "gpu_a3c.py: model,device,learners)")
    args = parser.parse_args()
    result = merge_files(args.inputs, tuple(args.key.split(",")))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    for cell in result["cells"]:
        print(" ".join(str(cell.get(k)) for k in args.key.split(",")), cell.get("speed_verdict", cell.get("error")))
