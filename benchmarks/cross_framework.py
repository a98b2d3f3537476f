"""Every model on several backends of one GPU, side by side: the cross-framework table.

    python3 -m benchmarks.cross_framework --out benchmarks/results/h100_cross_framework.jsonl
    python3 -m benchmarks.cross_framework --sweep --out benchmarks/results/h100_cross_framework_sweep.jsonl
    python3 -m benchmarks.cross_framework --summary benchmarks/results/h100_cross_framework.jsonl
    python3 -m tbdzoo.cli report benchmarks/results/h100_cross_framework*.jsonl -o DIR   # figures

Each run is one `tbd run` (``tbdzoo.suite.run_one``): the model's paper config at its paper batch,
built in a worker process of its own, profiled with every sampler (throughput, NVML and GPM
counters, model FLOP/s, memory by category, CPU). The grid is ``--processes`` passes over
models x precisions x backends; within a cell the backends' order rotates from pass to pass, so
a drift of the machine falls on both sides alike. A pass's run is a separate process, so the
passes give the between-process spread; each run's repeats give the within-process one.

``--summary`` prints the Markdown tables of the report: per model and precision, each backend's
median throughput over its runs, the range of its repeats (every repeat of every pass), and the
ratio of the second backend to the first with its range (the extreme repeats paired: the
slowest of one against the fastest of the other). A ratio whose range reaches both sides of 1.0
is parity. ``--sweep`` runs throughput against batch size (``tbd sweep``) for the models whose
batch matters most, to where memory ends.

Every finished run is appended at once to ``--out`` (JSON lines), so an interrupted grid keeps
what it had; ``--again`` is not needed to resume: a (pass, model, precision, backend) already in
the file is skipped.
"""
import argparse
import functools
import json
import os
import statistics
import sys

from benchmarks import harness
from tbdzoo import suite
from tbdzoo.profiling.plots import dig

MODELS = ("resnet50", "inception_v3", "transformer", "seq2seq", "deepspeech2", "wgan",
          "faster_rcnn", "a3c")
# batch sizes in each config's unit (images, sentence pairs, utterances), around the paper's
SWEEP = {"resnet50": (16, 32, 64, 128, 256), "transformer": (16, 32, 64, 128, 256),
         "deepspeech2": (4, 8, 16, 32, 64)}
CATEGORIES = ("weights", "gradients", "optimizer_state", "feature_maps", "workspace")


def key_of(record):
    return (record.get("pass"), record["model"], record["precision"], record["backend"],
            record.get("batch_size") if record.get("sweep") else None)


def done_keys(path):
    if not os.path.exists(path):
        return set()
    with open(path) as f:
        return {key_of(json.loads(line)) for line in f if line.strip()}


def grid(args):
    done = done_keys(args.out)
    backends = args.backends.split(",")
    total = args.processes * len(args.models) * len(args.precisions) * len(backends)
    count = 0
    for p in range(1, args.processes + 1):
        for model in args.models:
            for precision in args.precisions:
                order = backends[p - 1:] + backends[:p - 1]      # rotate from pass to pass
                for backend in order:
                    count += 1
                    if (p, model, precision, backend, None) in done:
                        continue
                    print("[{}/{}] pass {} {} {} {}".format(count, total, p, model, precision,
                                                            backend), flush=True)
                    record(args, {"pass": p}, run_one(args, model, backend, precision))


def sweep(args):
    """``suite.sweep`` over the batch sizes not yet in the file, to the first that fails."""
    done = done_keys(args.out)
    for model in args.models:
        for precision in args.precisions:
            for backend in args.backends.split(","):
                sizes = [s for s in SWEEP[model] if (1, model, precision, backend, s) not in done]
                if not sizes:
                    continue
                print("sweep {} {} {} batch {}".format(model, precision, backend, sizes),
                      flush=True)
                suite.sweep(model, backend, sizes,
                            run=functools.partial(run_one, args, precision=precision),
                            on_record=functools.partial(record, args, {"pass": 1, "sweep": True}))


def run_one(args, model, backend, precision, batch_size=None):
    return suite.run_one(model, backend, config=args.config, batch_size=batch_size,
                         device=args.device, overrides={"precision": precision},
                         warmup=args.warmup, steps=args.steps, repeats=args.repeats,
                         min_repeat_s=args.min_repeat_seconds,
                         command=harness.command_of("benchmarks.cross_framework", sys.argv[1:],
                                                    args.out))


def record(args, tags, result):
    """``result`` tagged, shown in a line and appended to ``--out`` at once."""
    result.update(tags)
    report_line(result)
    suite.append_record(args.out, result)


def report_line(record):
    if record.get("status") != "ok":
        print("  {}: {}".format(record.get("status"), (record.get("error") or "")[:300]),
              flush=True)
        return
    t = record["step_time"]
    print("  {:.1f} {}  step {:.2f} ms (cv {:.3f})  peak {:.2f} GiB".format(
        record["throughput"]["value"], record["throughput"]["unit"], t["median"] * 1e3, t["cv"],
        (dig(record, "memory", "peak", "bytes") or 0) / 2 ** 30), flush=True)


# -- the tables --------------------------------------------------------------------------------
def read(paths):
    records = []
    for path in paths:
        with open(path) as f:
            records.extend(json.loads(line) for line in f if line.strip())
    return [r for r in records if not r.get("sweep")]


def cell(runs):
    """A backend's runs of one model and precision: throughput median and the range of repeats."""
    ok = [r for r in runs if r.get("status") == "ok"]
    if not ok:
        return None
    items = ok[0]["throughput"]["items_per_step"]
    medians = [r["step_time"]["median"] for r in ok]
    return {"runs": len(ok), "unit": ok[0]["throughput"]["unit"], "items": items,
            "time": statistics.median(medians),
            "fastest": min(r["step_time"]["min"] for r in ok),
            "slowest": max(r["step_time"]["max"] for r in ok),
            "process_spread": (max(medians) - min(medians)) / statistics.median(medians),
            "first": ok[0]}


def ratio(a, b):
    """b's throughput over a's (b faster > 1), with the paired extremes as its range."""
    middle = a["time"] / b["time"]
    low, high = a["fastest"] / b["slowest"], a["slowest"] / b["fastest"]
    verdict = "parity" if low <= 1.0 <= high else ("ahead" if low > 1.0 else "behind")
    return middle, low, high, verdict


def median_of(runs, *keys):
    values = [dig(r, *keys) for r in runs if r.get("status") == "ok"]
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def pct(value):
    return "-" if value is None else "{:.0f}%".format(100 * value)


def gib(value):
    return "-" if value is None else "{:.2f}".format(value / 2 ** 30)


def summary(paths, backends):
    records = read(paths)
    first, second = backends
    groups = {}
    for r in records:
        groups.setdefault((r["model"], r["precision"]), {}).setdefault(r["backend"], []).append(r)
    order = [m for m in MODELS if any(k[0] == m for k in groups)]
    lines = ["| model | precision | batch | {a} (median, range) | {b} (median, range) | "
             "{b}/{a} (range) | runs |".format(a=first, b=second),
             "|---|---|---|---|---|---|---|"]
    util = ["| model | precision | GPU busy (NVML) {a} / {b} | SM activity | tensor activity | "
            "model FLOP/s of peak | CPU cores busy |".format(a=first, b=second),
            "|---|---|---|---|---|---|---|"]
    memory = ["| model | precision | backend | " + " | ".join(c.replace("_", " ") for c in CATEGORIES)
              + " | peak (GiB) |", "|---|---|---|" + "---|" * (len(CATEGORIES) + 1)]
    for model in order:
        for precision in ("tf32", "bf16", "fp32"):
            sides = groups.get((model, precision))
            if not sides:
                continue
            a, b = cell(sides.get(first, [])), cell(sides.get(second, []))
            text = []
            for c in (a, b):
                if c is None:
                    text.append("failed")
                    continue
                rate = c["items"] / c["time"]
                text.append("{:,.0f} ({:,.0f}-{:,.0f})".format(
                    rate, c["items"] / c["slowest"], c["items"] / c["fastest"]))
            if a and b:
                middle, low, high, verdict = ratio(a, b)
                text.append("**{:.3f}x** ({:.3f}-{:.3f}), {}".format(middle, low, high, verdict))
                batch = a["first"]["batch_size"]
            else:
                text.append("-")
                batch = (a or b or {"first": {"batch_size": "-"}})["first"]["batch_size"]
            runs = "{} / {}".format(len(sides.get(first, [])), len(sides.get(second, [])))
            lines.append("| {} | {} | {} | {} | {} | {} | {} |".format(
                model, precision, batch, *text, runs))
            both = [sides.get(first, []), sides.get(second, [])]
            util.append("| {} | {} | {} | {} | {} | {} | {} |".format(
                model, precision,
                *(" / ".join(pct(median_of(s, *k)) for s in both) for k in (
                    ("gpu", "utilization", "median"), ("gpu", "gpm", "sm_activity"),
                    ("gpu", "gpm", "tensor_activity"), ("flops", "utilization"))),
                " / ".join("-" if median_of(s, "cpu", "process_cores_busy") is None else
                           "{:.2f}".format(median_of(s, "cpu", "process_cores_busy"))
                           for s in both)))
            for name, s in zip(backends, both):
                memory.append("| {} | {} | {} | {} | {} |".format(
                    model, precision, name,
                    " | ".join(gib(median_of(s, "memory", c, "bytes")) for c in CATEGORIES),
                    gib(median_of(s, "memory", "peak", "bytes"))))
    return "\n".join(lines + [""] + util + [""] + memory)


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", help="JSON-lines file the runs are appended to")
    p.add_argument("--backends", default="torch,jax")
    p.add_argument("--models", default=None, help="comma list (default: every model with a "
                   "step; with --sweep: " + ",".join(SWEEP) + ")")
    p.add_argument("--precisions", default="tf32,bf16")
    p.add_argument("--processes", type=int, default=2, help="passes over the grid (default 2)")
    p.add_argument("--config", default="paper")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--min-repeat-seconds", type=float, default=1.0)
    p.add_argument("--sweep", action="store_true", help="throughput against batch size")
    p.add_argument("--summary", nargs="+", metavar="FILE", help="print the tables of these files")
    args = p.parse_args(argv)
    if args.summary:
        return args
    if not args.out:
        p.error("--out FILE is needed to run (or --summary FILE to print the tables)")
    known = tuple(SWEEP) if args.sweep else MODELS
    args.models = args.models.split(",") if args.models else list(known)
    unknown = [m for m in args.models if m not in known]
    if unknown:
        p.error("unknown model(s) {}: choose from {}".format(", ".join(unknown), ", ".join(known)))
    args.precisions = args.precisions.split(",")
    return args


def main(argv=None):
    args = parse(argv)
    if args.summary:
        print(summary(args.summary, args.backends.split(",")))
        return 0
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    (sweep if args.sweep else grid)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
