"""``tbd``: list what is available and benchmark training on every ready backend."""
import argparse
import sys

from .errors import TbdError


def _console():
    from rich.console import Console
    return Console()


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


def cmd_bench(args):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from . import suite
    from .backends.registry import _check_backend

    for b in args.backends or []:
        _check_backend(b)
    runs = suite.plan(args.models, args.backends)
    console = _console()
    if not runs:
        console.print("no backend is ready; run `make env` first (see `tbd list`)")
        return 1
    records = []
    columns = (TextColumn("{task.description:<34}"), BarColumn(), TextColumn("{task.fields[stage]}"),
               TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        overall = progress.add_task("suite", total=len(runs), stage="")
        for model, backend in runs:
            task = progress.add_task("{} on {}".format(model, backend), total=None, stage="")
            batch = args.batch_size or suite.CPU_BATCH_SIZES.get(model)

            def on_step(done, total, task=task):
                progress.update(task, completed=done, total=total,
                                stage="step {}/{}".format(done, total))

            record = suite.run_one(model, backend, config=args.config, batch_size=batch,
                                   warmup=args.warmup, steps=args.steps, repeats=args.repeats,
                                   progress=on_step,
                                   status=lambda s, task=task: progress.update(task, stage=s))
            records.append(record)
            if args.output:
                suite.append_record(args.output, record)
            progress.update(task, stage=record["status"])
            progress.advance(overall)
    console.print(results_table(records, args))
    if args.output:
        console.print("records appended to {}".format(args.output))
    return 0 if all(r["status"] == "ok" for r in records) else 1


def results_table(records, args):
    from rich.table import Table
    table = Table(title="training throughput ({} config; warm-up {}, {} steps x {} repeats, median)"
                  .format(args.config, args.warmup, args.steps, args.repeats))
    for column in ("model", "backend", "batch", "throughput", "step (ms)", "cv", "first step (s)"):
        table.add_column(column, justify="right" if column not in ("model", "backend") else "left")
    for r in records:
        if r["status"] != "ok":
            table.add_row(r["model"], r["backend"], str(r["batch_size"] or ""),
                          "[red]{}[/red]".format(r["status"]), "", "", r.get("error", "")[:80])
            continue
        table.add_row(r["model"], r["backend"], str(r["batch_size"]),
                      "{:,.1f} {}".format(r["throughput"]["value"], r["throughput"]["unit"]),
                      "{:.0f}".format(1000 * r["step_time"]["median"]),
                      "{:.1%}".format(r["step_time"]["cv"]), "{:.1f}".format(r["first_step_s"]))
    return table


def parser():
    p = argparse.ArgumentParser(prog="tbd", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="models and backends, and whether each backend is ready")
    bench = sub.add_parser("bench", help="train every model on every ready backend, timed")
    bench.add_argument("--models", type=_names, help="comma-separated model names (default: all)")
    bench.add_argument("--backends", type=_names, help="comma-separated backends (default: ready ones)")
    bench.add_argument("--config", default="paper", help="model config (default: paper)")
    bench.add_argument("--batch-size", type=int, help="override the CPU-sized default batch")
    bench.add_argument("--warmup", type=int, default=1, help="untimed steps first (default 1)")
    bench.add_argument("--steps", type=int, default=2, help="timed steps per repeat (default 2)")
    bench.add_argument("--repeats", type=int, default=3, help="timed repeats (default 3)")
    bench.add_argument("-o", "--output", help="append one JSON record per run to this file")
    return p


def _names(text):
    return [t.strip() for t in text.split(",") if t.strip()]


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        return {"list": cmd_list, "bench": cmd_bench}[args.command](args)
    except TbdError as e:
        print("tbd: error: {}".format(e), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
