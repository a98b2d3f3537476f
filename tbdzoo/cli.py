"""``tbd``: list models and backends, benchmark and profile training, and report.

  tbd list
  tbd run MODEL --backend B [--config C] [--batch-size N] [--steps 20 --warmup 5 --repeats 3] -o FILE
  tbd sweep MODEL --backend B --batch-sizes 8,16,32 [--memory-cap 8G] -o FILE
  tbd bench [-o FILE]                the suite: every model x every ready backend
  tbd report FILE... -o DIR          DIR/index.html with plots, plus DIR/report.md
"""
import argparse
import sys

from .errors import TbdError


def _console():
    """Rich's console; wide enough for the tables when output is not a terminal."""
    from rich.console import Console
    console = Console()
    return console if console.is_terminal else Console(width=120)


# -- list ----------------------------------------------------------------------------------
def cmd_list(args):
    from rich.table import Table
    from .backends.registry import list_backends
    from .models import get_model, list_models

    console = _console()
    models = Table(title="models")
    for column in ("model", "domain", "configs", "parameters (paper)", "throughput unit"):
        models.add_column(column)
    for name in list_models():
        md = get_model(name)
        params = md.build_graph(md.hparams("paper")).trainable_count()
        models.add_row(name, md.domain, ", ".join(md.configs), "{:,}".format(params), md.unit)
    console.print(models)
    backends = Table(title="backends")
    for column in ("backend", "environment", "ready", "runs", "note"):
        backends.add_column(column)
    for b in list_backends():
        backends.add_row(b["name"], b["environment"], "yes" if b["ready"] else "no", b["runs"],
                         b["fix"] or b["python"])
    console.print(backends)
    return 0


# -- runs ----------------------------------------------------------------------------------
class Runner(object):
    """Shows progress, appends each record as it arrives and emits MLPerf lines if asked."""

    def __init__(self, args, total_runs):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
        self.args = args
        self.console = _console()
        self.records = []
        self.mllog = None
        if getattr(args, "mllog", None):
            from .profiling.mlperf import MlperfLog
            self.mllog = MlperfLog(args.mllog)
        self.progress = Progress(TextColumn("{task.description:<36}"), BarColumn(),
                                 TextColumn("{task.fields[stage]}"), TimeElapsedColumn(),
                                 console=self.console, transient=False)
        self.overall = None
        self.total_runs = total_runs

    def __enter__(self):
        self.progress.__enter__()
        self.overall = self.progress.add_task("all runs", total=self.total_runs, stage="")
        return self

    def __exit__(self, *exc):
        self.progress.__exit__(*exc)

    def run(self, model, backend, batch_size):
        from . import suite
        label = "{} on {}".format(model, backend) + (" (batch {})".format(batch_size) if batch_size else "")
        task = self.progress.add_task(label, total=None, stage="")

        def on_step(done, total):
            self.progress.update(task, completed=done, total=total, stage="step {}/{}".format(done, total))

        a = self.args
        record = suite.run_one(
            model, backend, config=a.config, batch_size=batch_size, warmup=a.warmup,
            steps=a.steps, repeats=a.repeats, device=a.device, samplers=not a.no_samplers,
            peak_flops=a.peak_tflops * 1e12 if a.peak_tflops else None,
            memory_cap=getattr(a, "memory_cap", None), progress=on_step,
            status=lambda s: self.progress.update(task, stage=s), command=" ".join(["tbd"] + sys.argv[1:]))
        self.records.append(record)
        if a.output:
            suite.append_record(a.output, record)
        if self.mllog:
            self.mllog.log_record(record)
        self.progress.update(task, stage=record["status"])
        self.progress.stop_task(task)  # freezes its clock at the run's duration
        self.progress.advance(self.overall)
        return record

    def finish(self):
        self.console.print(results_table(self.records, self.args))
        for r in self.records:
            if r["status"] != "ok":
                self.console.print("[red]{} on {} (batch {}): {}[/red]".format(
                    r["model"], r["backend"], r.get("batch_size"), r.get("error")), markup=True,
                    highlight=False)
        if self.args.output:
            self.console.print("records appended to {}".format(self.args.output))
        return 0 if all(r["status"] == "ok" for r in self.records) else 1


def cmd_run(args):
    from . import suite
    suite.plan([args.model], [args.backend])
    with Runner(args, 1) as runner:
        runner.run(args.model, args.backend, args.batch_size)
    return runner.finish()


def cmd_sweep(args):
    from . import suite
    suite.plan([args.model], [args.backend])
    with Runner(args, len(args.batch_sizes)) as runner:
        suite.sweep(args.model, args.backend, args.batch_sizes,
                    run=lambda m, b, batch_size: runner.run(m, b, batch_size))
    runner.finish()
    # A sweep is meant to end at the memory limit: an 'oom' last point is a finding, not a failure.
    return 1 if any(r["status"] == "error" for r in runner.records) else 0


def cmd_bench(args):
    from . import suite
    runs = suite.plan(args.models, args.backends)
    if not runs:
        print("tbd: no backend is ready; run `make env` first (see `tbd list`)", file=sys.stderr)
        return 1
    with Runner(args, len(runs)) as runner:
        for model, backend in runs:
            cpu_size = suite.CPU_BATCH_SIZES.get(model) if args.config == "paper" else None
            size = args.batch_size or (cpu_size if args.cpu_batches else None)
            runner.run(model, backend, size)
    return runner.finish()


def cmd_report(args):
    from .profiling.report import write_report
    index = write_report(args.files, args.output)
    print("report written to {}".format(index))
    return 0


def results_table(records, args):
    from rich.table import Table
    table = Table(title="training throughput ({} config; warm-up {}, {} steps x {} repeats; median)"
                  .format(args.config, args.warmup, args.steps, args.repeats))
    for column in ("model", "backend", "batch", "throughput", "step (ms)", "cv", "first step (s)",
                   "peak memory"):
        table.add_column(column, justify="left" if column in ("model", "backend") else "right")
    for r in records:
        if r["status"] != "ok":
            table.add_row(r["model"], r["backend"], str(r.get("batch_size") or ""),
                          "[red]{}[/red]".format(r["status"]), "", "", "", "")
            continue
        peak = r["memory"]["peak"]["bytes"]
        table.add_row(r["model"], r["backend"], str(r["batch_size"]),
                      "{:,.1f} {}".format(r["throughput"]["value"], r["throughput"]["unit"]),
                      "{:.0f}".format(1000 * r["step_time"]["median"]),
                      "{:.1%}".format(r["step_time"]["cv"]), "{:.1f}".format(r["first_step_s"]),
                      "{:.2f} GiB".format(peak / 2 ** 30) if peak else "")
    return table


# -- arguments -----------------------------------------------------------------------------
def _names(text):
    return [t.strip() for t in text.split(",") if t.strip()]


def _sizes(text):
    try:
        sizes = [int(t) for t in _names(text)]
    except ValueError:
        raise argparse.ArgumentTypeError("batch sizes are comma-separated integers, e.g. 8,16,32")
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError("batch sizes must be positive integers")
    return sizes


def _bytes(text):
    units = {"k": 2 ** 10, "m": 2 ** 20, "g": 2 ** 30, "t": 2 ** 40}
    t = text.strip().lower().rstrip("ib").rstrip("b")
    try:
        if t and t[-1] in units:
            return int(float(t[:-1]) * units[t[-1]])
        return int(t)
    except ValueError:
        raise argparse.ArgumentTypeError("a size like 8G, 512M or a number of bytes, not {!r}".format(text))


def _positive(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _measuring(p, warmup, steps, repeats):
    p.add_argument("--config", default="paper", help="model config (default: paper)")
    p.add_argument("--warmup", type=_positive, default=warmup, help="untimed steps first (default %(default)s)")
    p.add_argument("--steps", type=_positive, default=steps, help="timed steps per repeat (default %(default)s)")
    p.add_argument("--repeats", type=_positive, default=repeats, help="timed repeats (default %(default)s)")
    p.add_argument("--device", help="cpu or cuda:N (default: the backend's best)")
    p.add_argument("--peak-tflops", type=float, help="peak TFLOP/s to report utilisation against")
    p.add_argument("--no-samplers", action="store_true", help="time only; no CPU/GPU samplers")
    p.add_argument("--mllog", metavar="FILE", help="also write MLPerf-style :::MLLOG lines here")
    p.add_argument("-o", "--output", help="append one JSON record per run to this JSONL file")


def parser():
    p = argparse.ArgumentParser(prog="tbd", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="models and backends, and whether each backend is ready")

    run = sub.add_parser("run", help="profile one model on one backend")
    run.add_argument("model")
    run.add_argument("--backend", required=True)
    run.add_argument("--batch-size", type=_positive, help="default: the config's")
    _measuring(run, 5, 20, 3)

    sweep = sub.add_parser("sweep", help="one model on one backend over batch sizes, until OOM")
    sweep.add_argument("model")
    sweep.add_argument("--backend", required=True)
    sweep.add_argument("--batch-sizes", type=_sizes, required=True, help="e.g. 8,16,32,64")
    sweep.add_argument("--memory-cap", type=_bytes, help="stop a run whose resident memory passes this (e.g. 8G)")
    _measuring(sweep, 5, 20, 3)

    bench = sub.add_parser("bench", help="every model on every ready backend")
    bench.add_argument("--models", type=_names, help="comma-separated model names (default: all)")
    bench.add_argument("--backends", type=_names, help="comma-separated backends (default: ready ones)")
    bench.add_argument("--batch-size", type=_positive, help="one batch size for every model")
    bench.add_argument("--paper-batches", dest="cpu_batches", action="store_false",
                       help="use each config's batch size instead of the CPU-sized defaults")
    _measuring(bench, 1, 1, 3)

    report = sub.add_parser("report", help="HTML and Markdown report from JSONL records")
    report.add_argument("files", nargs="+")
    report.add_argument("-o", "--output", required=True, help="output folder")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    commands = {"list": cmd_list, "run": cmd_run, "sweep": cmd_sweep, "bench": cmd_bench,
                "report": cmd_report}
    try:
        return commands[args.command](args)
    except TbdError as e:
        print("tbd: error: {}".format(e), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tbd: interrupted; every finished run is already in the output file", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
