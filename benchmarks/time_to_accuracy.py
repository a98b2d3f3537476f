"""Steps and seconds to a target metric, over a grid of models x backends x seeds.

    .venv/bin/tbd data make fashion-mnist-imagenet --out data/fm32 --set size=32 \\
        --set train_per_class=200 --set val_per_class=50
    .venv/bin/python -m benchmarks.time_to_accuracy --data data/fm32 \\
        --models resnet50 --backends torch,tensorflow,mxnet,cntk,jax --seeds 0,1,2
    .venv/bin/python -m benchmarks.time_to_accuracy --summary      # the table and the plot

Each run is `tbdzoo.training.train_to_target` on the model's proxy config with its default
target (docs/training.md), in a process of its own (no framework's threads or memory touch the
next run's); a jax run reaches `.venv-jax` through the backend's worker, as `tbd train --backend
jax` does. Each finished run is appended at once to ``--out`` (a JSON list, rewritten
through a temporary file), so an interrupted grid keeps its runs; a run already in the file
(same model, backend, seed, target and dataset) is skipped unless ``--again``, which appends
the rerun: the table and the plot take each seed's last run, and the file keeps every run.
``--summary`` prints the Markdown table of reports/2026-12-time-to-accuracy.md and draws
docs/time_to_accuracy.png.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "benchmarks", "results", "time_to_accuracy.json")
PLOT = os.path.join(ROOT, "docs", "time_to_accuracy.png")
BACKENDS = ("torch", "tensorflow", "mxnet", "cntk", "jax")


def read_runs(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return json.load(f)


def write_runs(path, runs):
    """The whole list through a temporary file and a rename: a kill never leaves half a file."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".time_to_accuracy.", dir=folder)
    with os.fdopen(fd, "w") as f:
        json.dump(runs, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def one_run(args):
    """In the child process: one run, its record as JSON on the last line of stdout."""
    from tbdzoo.training import train_to_target
    result = train_to_target(args.model, args.backend, args.data, args.target, seed=args.seed,
                             max_minutes=args.max_minutes, eval_every=args.eval_every)
    record = result.record()
    record.pop("data_dir", None)     # where it lay here; "dataset" names what it holds
    print("RECORD " + json.dumps(record), flush=True)


def run_in_child(model, backend, seed, args):
    command = [sys.executable, "-m", "benchmarks.time_to_accuracy", "--one", "--model", model,
               "--backend", backend, "--seed", str(seed), "--max-minutes", str(args.max_minutes)]
    if args.data:
        command += ["--data", args.data]
    if args.target:
        command += ["--target", args.target]
    if args.eval_every:
        command += ["--eval-every", str(args.eval_every)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("RECORD "):
            return json.loads(line[len("RECORD "):])
    raise RuntimeError("{} on {} (seed {}) failed:\n{}".format(model, backend, seed,
                                                             done.stderr[-3000:]))


def _same(run, model, backend, seed, target):
    return (run["model"], run["backend"], run["seed"]) == (model, backend, seed) and \
        (target is None or "{}={:g}".format(run["metric"], run["target"]) == target)


def grid(args):
    runs = read_runs(args.out)
    for model in args.models:
        for backend in args.backends:
            for seed in args.seeds:
                if not args.again and any(_same(r, model, backend, seed, args.target)
                                          for r in runs):
                    print("{} on {} seed {}: already in {}".format(model, backend, seed,
                                                                   args.out))
                    continue
                record = run_in_child(model, backend, seed, args)
                record["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
                runs = read_runs(args.out) + [record]   # what another grid wrote meanwhile too
                write_runs(args.out, runs)
                print("{} on {} seed {}: {} at step {} ({} s of training)".format(
                    model, backend, seed, "reached" if record["reached"] else "NOT reached",
                    record["steps"], record["seconds"]), flush=True)


def _spread(values):
    if not values:
        return "-"
    if len(values) == 1:
        return "{:.0f}".format(values[0])
    return "{:.0f} ± {:.0f}".format(statistics.mean(values), statistics.stdev(values))


def _cell_runs(runs, model, metric, target, backend):
    """One table row's runs: each seed's last (the file is in the order the runs finished),
    since ``--again`` appends a rerun, given more minutes or newer code, and keeps the run it
    supersedes in the file."""
    latest = {}
    for r in runs:
        if (r["model"], r["metric"], r["target"], r["backend"]) == (model, metric, target, backend):
            latest[r["seed"]] = r
    return list(latest.values())


def summary(args):
    runs = read_runs(args.out)
    keys = sorted({(r["model"], r["metric"], r["target"]) for r in runs})
    lines = ["| model | target | backend | seeds | reached | steps to target (mean ± sd) | "
             "steps per seed | training s to target (mean ± sd) | evaluation s |",
             "|---|---|---|---:|---:|---:|---|---:|---:|"]
    for model, metric, target in keys:
        for backend in BACKENDS:
            mine = _cell_runs(runs, model, metric, target, backend)
            if not mine:
                continue
            reached = [r for r in mine if r["reached"]]
            lines.append("| {} | {}={:g} | {} | {} | {}/{} | {} | {} | {} | {} |".format(
                model, metric, target, backend, len(mine), len(reached), len(mine),
                _spread([r["steps"] for r in reached]),
                ", ".join(str(r["steps"]) if r["reached"] else "-" for r in
                          sorted(mine, key=lambda r: r["seed"])),
                _spread([r["seconds"] for r in reached]),
                _spread([r["eval_seconds"] for r in reached])))
    print("\n".join(lines))
    plot(runs, keys, args.plot)


def plot(runs, keys, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cols = min(2, len(keys))
    rows = (len(keys) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 3.6 * rows), squeeze=False)
    for ax in axes.flat[len(keys):]:
        ax.set_visible(False)
    for ax, (model, metric, target) in zip(axes.flat, keys):
        highest = 1
        for i, backend in enumerate(BACKENDS):
            mine = sorted((r for r in _cell_runs(runs, model, metric, target, backend)
                           if r["reached"]), key=lambda r: r["seed"])
            steps = [r["steps"] for r in mine]
            if not steps:
                continue
            highest = max(highest, max(steps))
            # Seeds side by side, so two seeds of the same steps stay two dots.
            offsets = [0.1 * (k - (len(mine) - 1) / 2.0) for k in range(len(mine))]
            ax.scatter([i + o for o in offsets], steps, color="C{}".format(i), zorder=3)
            ax.hlines(statistics.mean(steps), i - 0.25, i + 0.25, color="C{}".format(i))
        ax.set_xticks(range(len(BACKENDS)))
        ax.set_xticklabels(BACKENDS)
        ax.set_xlim(-0.5, len(BACKENDS) - 0.5)
        ax.set_ylim(0, highest * 1.12)
        ax.set_ylabel("steps to target\n(dots: seeds in order; line: mean)")
        ax.set_title("{}: {}={:g}".format(model, metric, target))
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print("plot written to {}".format(path))


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", type=lambda s: s.split(","), default=["resnet50"])
    p.add_argument("--backends", type=lambda s: s.split(","), default=list(BACKENDS))
    p.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    p.add_argument("--data", help="data folder of the image models (see above)")
    p.add_argument("--target", help="METRIC=VALUE for every model (default: each model's)")
    p.add_argument("--eval-every", type=int)
    p.add_argument("--max-minutes", type=float, default=10.0)
    p.add_argument("--out", default=OUT)
    p.add_argument("--plot", default=PLOT)
    p.add_argument("--again", action="store_true", help="rerun runs already in --out")
    p.add_argument("--summary", action="store_true", help="the table and the plot only")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--backend", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        return one_run(args)
    if args.summary:
        return summary(args)
    if any(m != "a3c" for m in args.models) and not args.data:
        p.error("--data DIR is needed for the image models (see the usage above)")
    grid(args)


if __name__ == "__main__":
    main()
