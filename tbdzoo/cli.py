"""``tbd``: list models and backends, benchmark and profile training, and report.

  tbd list
  tbd run MODEL --backend B [--config C] [--batch-size N] [--steps 20 --warmup 5 --repeats 3] -o FILE
  tbd run MODEL --backend B --data DIR [--data-workers N] [--no-augment]   also fed from DIR
                                     (with --nproc N: each rank from its share of DIR)
  tbd sweep MODEL --backend B --batch-sizes 8,16,32 [--memory-cap 8G] -o FILE
  tbd sweep a3c --backend B --learners 1,2,4,8,16 [--frames N | --seconds S] -o FILE
                                     asynchronous A3C over the number of actor-learners
  tbd run MODEL --backend B --nproc N [--nnodes M --node-rank K --master HOST:PORT]
          [--global-batch B] [--bn-mode replica|sync] [--baseline]   data-parallel
  tbd bench [-o FILE]                the suite: every model x every ready backend
  tbd report FILE... -o DIR          DIR/index.html with plots, plus DIR/report.md
  tbd data list                      data sets tbdzoo makes offline, with their options
  tbd data make NAME --out DIR [--seed S] [--set OPTION=VALUE]
  tbd train MODEL --backend B [--data DIR] [--target METRIC=VALUE] [--seed S] [--max-minutes M]
                                     a proxy config trained to a target (docs/training.md);
                                     --nproc N and the placement flags: data-parallel
  tbd consistency record [--cases C,...] [--dir D]    the PyTorch reference, one file a case
  tbd consistency check [--cases C,...] [--backends B,...] [--dir D]
                                     each backend against it: a table per case, exit 1 on a
                                     failure (docs/consistency.md)

Every command takes --verbose: the frameworks' start-up banners and warnings are left on. Where
output is not a terminal, progress is a plain line every 10 s (TBDZOO_PROGRESS_SECONDS).

run, sweep and bench also take --precision, --execution, --memory-format and any
hyperparameter of the config as --set NAME=VALUE (repeatable; tuples as comma lists).
"""
import argparse
import os
import sys
from collections import OrderedDict

from . import suite
from .argtypes import assignment as _assignment
from .argtypes import byte_size as _bytes
from .argtypes import integer as _integer
from .argtypes import learners as _learners
from .argtypes import names as _names
from .argtypes import non_negative as _non_negative
from .argtypes import non_negative_number as _non_negative_number
from .argtypes import positive as _positive
from .argtypes import positive_number as _positive_number
from .argtypes import sizes as _sizes
from .backends.common.quiet import VERBOSE_VARIABLE
from .backends.info import backend_info, backend_infos
from .backends.registry import list_backends
from .consistency import add_parser as add_consistency_parser
from .consistency import command as consistency_command
from .datasets.makers import list_makers, make
from .distributed.launch import RANK_TIMEOUT, STEP_TIMEOUT
from .distributed.world import BN_MODES
from .errors import TbdError, UnknownNameError
from .export import export
from .models import get_model, list_models
from .models.a3c import NAME as A3C
from .models.constraints import COMMON
from .pipelines.measure import open_source
from .progress import progress_display, rich_console
from .rl.async_learners import check_learners
from .training.command import add_parser as add_train_parser
from .training.command import cmd_train as run_train


# -- list ----------------------------------------------------------------------------------
def cmd_list(args):
    from rich.table import Table
    console = rich_console()
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


# -- data ----------------------------------------------------------------------------------
def cmd_data_list(args):
    from rich.table import Table
    table = Table(title="data sets made offline (tbd data make NAME --out DIR; docs/datasets.md)")
    for column in ("name", "what", "options (--set NAME=VALUE; defaults)"):
        table.add_column(column)
    for maker in list_makers():
        table.add_row(maker.name, maker.summary,
                      " ".join("{}={}".format(k, v) for k, v in maker.options.items()))
    rich_console().print(table)
    return 0


def cmd_data(args):
    return {"list": cmd_data_list, "make": cmd_data_make}[args.data_command](args)


def cmd_data_make(args):
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    console = rich_console()
    tasks = {}
    with progress_display(console, TextColumn("{task.description:<28}"), BarColumn(),
                          MofNCompleteColumn(), TimeElapsedColumn()) as progress:
        def report(what, done=None, total=None):
            if what not in tasks:
                tasks[what] = progress.add_task(what, total=total)
            progress.update(tasks[what], completed=done, total=total)

        manifest = make(args.name, args.out, seed=args.seed, options=getattr(args, "set", None),
                        progress=report)
    files = manifest["files"]
    console.print("{} (seed {}) written to {}: {:,} files, {:,} bytes; manifest {}".format(
        args.name, args.seed, args.out, files["count"], files["bytes"],
        "tbdzoo-dataset.json"), soft_wrap=True)
    return 0


# -- runs ----------------------------------------------------------------------------------
class Runner:
    """Shows progress, appends each record as it arrives and emits MLPerf lines if asked."""

    def __init__(self, args, total_runs):
        from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
        self.args = args
        self.console = rich_console()
        self.records = []
        self.mllog = None
        if getattr(args, "mllog", None):
            from .profiling.mlperf import MlperfLog
            self.mllog = MlperfLog(args.mllog)
        self.progress = progress_display(self.console, TextColumn("{task.description:<36}"),
                                         BarColumn(), TextColumn("{task.fields[stage]}"),
                                         TimeElapsedColumn(), transient=False)
        self.overall = None
        self.total_runs = total_runs

    def __enter__(self):
        self.progress.__enter__()
        self.overall = self.progress.add_task("all runs", total=self.total_runs, stage="")
        return self

    def __exit__(self, *exc):
        self.progress.__exit__(*exc)

    def run(self, model, backend, batch_size, overrides=None):
        label = "{} on {}".format(model, backend) + (" (batch {})".format(batch_size) if batch_size else "")
        task = self.progress.add_task(label, total=None, stage="")

        def on_step(done, total):
            self.progress.update(task, completed=done, total=total, stage="step {}/{}".format(done, total))

        a = self.args
        if _distributed(a):
            return self._run_distributed(model, backend, batch_size, overrides, task)
        record = suite.run_one(
            model, backend, config=a.config, batch_size=batch_size, overrides=overrides,
            warmup=a.warmup, steps=a.steps, repeats=a.repeats, device=a.device, samplers=not a.no_samplers,
            peak_flops=a.peak_tflops * 1e12 if a.peak_tflops else None,
            memory_cap=getattr(a, "memory_cap", None), min_repeat_s=a.min_repeat_seconds,
            progress=on_step,
            status=lambda s: self.progress.update(task, stage=s), command=" ".join(["tbd"] + sys.argv[1:]),
            data=data_options(a))
        return self._finished(record, task)

    def _run_distributed(self, model, backend, batch_size, overrides, task):
        a = self.args
        self.progress.update(task, stage="{} process(es) x {} node(s)".format(a.nproc, a.nnodes))
        records = suite.run_distributed(
            model, backend, config=a.config, batch_size=batch_size, overrides=overrides,
            world=world_options(a), baseline=a.baseline, warmup=a.warmup, steps=a.steps,
            repeats=a.repeats, device=a.device, samplers=not a.no_samplers,
            command=" ".join(["tbd"] + sys.argv[1:]), data=data_options(a))
        for record in records:
            self._finished(record, task)
        if not records:  # a node without rank 0: its ranks finished, rank 0's node records
            self.progress.update(task, stage="done (rank 0 records on node 0)")
            return {"status": "ok"}
        return records[-1]

    def _finished(self, record, task):
        a = self.args
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
        for r in self.records:
            if r.get("data") and "throughput" in r["data"]:
                self.console.print(data_line(r), highlight=False)
        if self.args.output:
            self.console.print("records appended to {}".format(self.args.output))
        return 0 if all(r["status"] == "ok" for r in self.records) else 1


def check_protocol(args):
    """--min-repeat-seconds times one process's steps; a data-parallel run times its ranks'."""
    if _distributed(args) and args.min_repeat_seconds:
        raise UsageError("--min-repeat-seconds applies to runs of one process; with --nproc or "
                         "--nnodes give the steps per repeat with --steps")


def cmd_run(args):
    check_protocol(args)
    suite.plan([args.model], [args.backend])
    overrides = overrides_for(args.model, args)
    if args.data:
        check_data(args, overrides)
    with Runner(args, 1) as runner:
        runner.run(args.model, args.backend, args.batch_size, overrides)
    return runner.finish()


def cmd_sweep(args):
    check_protocol(args)
    suite.plan([args.model], [args.backend])
    overrides = overrides_for(args.model, args)
    if args.learners is not None or args.batch_sizes is None:
        return sweep_learners(args, overrides)
    if "batch_size" in overrides:
        raise UsageError("a sweep takes its batch sizes from --batch-sizes; drop --set batch_size")
    with Runner(args, len(args.batch_sizes)) as runner:
        suite.sweep(args.model, args.backend, args.batch_sizes,
                    run=lambda m, b, batch_size: runner.run(m, b, batch_size, overrides))
    runner.finish()
    # A sweep is meant to end at the memory limit: an 'oom' last point is a finding, not a failure.
    return 1 if any(r["status"] == "error" for r in runner.records) else 0


def sweep_learners(args, overrides):
    """``tbd sweep a3c --learners ...``: asynchronous A3C at each number of actor-learners
    (docs/a3c.md); the batch-size sweep's options that do not apply are refused."""
    if args.batch_sizes is not None:
        raise UsageError("give --batch-sizes (a batch-size sweep) or --learners (asynchronous "
                         "A3C), not both")
    if args.learners is None:
        raise UsageError("a sweep needs --batch-sizes, or for a3c --learners (e.g. 1,2,4,8,16)")
    if args.model != A3C:
        raise UsageError("--learners sweeps asynchronous A3C's actor-learners; {} has none. Fix: "
                         "tbd sweep a3c --learners ..., or --batch-sizes for {}".format(
                             args.model, args.model))
    for n in args.learners:
        check_learners(n)
    frames, seconds = args.frames, args.seconds
    if frames is None and seconds is None:
        seconds = 30.0
    command = " ".join(["tbd"] + sys.argv[1:])
    console = rich_console()

    def on_record(record):
        if args.output:
            suite.append_record(args.output, record)
        a = record.get("asynchronous", {})
        if record["status"] == "ok":
            console.print("{} learners: {:,.0f} frames/s, {:.1f} updates/s, CPU per learner "
                          "{:.2f}".format(a["learners"], a["frames_per_second"],
                                          a["updates_per_second"], a["mean_cpu_utilisation"]))
        else:
            console.print("[red]{} learners: {}[/red]".format(a.get("learners"), record["error"]),
                          markup=True, highlight=False)
    records = suite.sweep_learners(args.backend, args.learners, config=args.config,
                                   frames=frames, seconds=seconds, seed=args.seed,
                                   device=args.device, overrides=overrides, command=command,
                                   on_record=on_record)
    console.print(async_table(records))
    if args.output:
        console.print("records appended to {}".format(args.output))
    return 1 if any(r["status"] != "ok" for r in records) else 0


def async_table(records):
    from rich.table import Table
    table = Table(title="asynchronous A3C (frames/s count skipped frames; CPU: each learner's "
                        "CPU seconds over its wall seconds)")
    for column in ("backend", "learners", "frames/s", "updates/s", "CPU per learner",
                   "CPU min-max", "frames", "seconds"):
        table.add_column(column, justify="left" if column == "backend" else "right")
    for r in records:
        a = r.get("asynchronous", {})
        if r["status"] != "ok":
            table.add_row(r["backend"], str(a.get("learners")), "[red]{}[/red]".format(r["status"]),
                          "", "", "", "", "")
            continue
        cpu = a["cpu_utilisation_per_learner"]
        table.add_row(r["backend"], str(a["learners"]), throughput_number(a["frames_per_second"]),
                      "{:.1f}".format(a["updates_per_second"]),
                      "{:.2f}".format(a["mean_cpu_utilisation"]),
                      "{:.2f}-{:.2f}".format(min(cpu), max(cpu)), "{:,}".format(a["frames"]),
                      "{:.1f}".format(a["seconds"]))
    return table


def cmd_bench(args):
    runs = suite.plan(args.models, args.backends)
    if not runs:
        print("tbd: no backend is ready; run `make env` first (see `tbd list`)", file=sys.stderr)
        return 1
    models = list(OrderedDict.fromkeys(model for model, _ in runs))
    overrides = bench_overrides(models, args)
    with Runner(args, len(runs)) as runner:
        for model, backend in runs:
            size = args.batch_size or (None if "batch_size" in overrides[model] else
                                       suite.bench_batch_size(model, backend, args.config,
                                                              args.device, args.cpu_batches))
            cpu = suite.bench_overrides(model, backend, args.config, args.device, args.cpu_batches)
            runner.run(model, backend, size,
                       dict(cpu, **overrides[model]) if cpu else overrides[model])
    return runner.finish()


def cmd_report(args):
    from .profiling.report import write_report
    index = write_report(args.files, args.output)
    print("report written to {}".format(index))
    return 0


def protocol_text(args):
    """The measuring protocol in a few words, for the results table's title."""
    steps = "{} step{}".format(args.steps, "" if args.steps == 1 else "s")
    if getattr(args, "min_repeat_seconds", 0):
        steps = "at least {}, about {:g} s".format(steps, args.min_repeat_seconds)
    return "warm-up {}, {} repeats of {}; median, min-max and cv over repeats".format(
        args.warmup, args.repeats, steps)


# A step time whose coefficient of variation over repeats passes this is shown in yellow: the
# machine was busy or the repeats too short for the figure to be quoted.
UNSTEADY_CV = 0.10


def results_table(records, args):
    from rich.table import Table
    table = Table(title="training throughput ({} config; {})".format(args.config,
                                                                     protocol_text(args)))
    for column in ("model", "backend", "batch", "throughput", "step ms (min-max)", "cv",
                   "rounds", "first step (s)", "peak memory"):
        table.add_column(column, justify="left" if column in ("model", "backend") else "right")
    for r in records:
        if r["status"] != "ok":
            table.add_row(r["model"], r["backend"], str(r.get("batch_size") or ""),
                          "[red]{}[/red]".format(r["status"]), "", "", "", "", "")
            continue
        peak = r["memory"]["peak"]["bytes"]
        step, protocol = r["step_time"], r.get("protocol") or {}
        cv = "{:.1%}".format(step["cv"])
        table.add_row(r["model"], r["backend"], batch_cell(r),
                      "{} {}".format(throughput_number(r["throughput"]["value"]),
                                     r["throughput"]["unit"]),
                      "{} ({}-{})".format(*(milliseconds(step[k]) for k in ("median", "min",
                                                                               "max"))),
                      "[yellow]{}[/yellow]".format(cv) if step["cv"] > UNSTEADY_CV else cv,
                      "{} x {}".format(protocol.get("repeats", ""), protocol.get("steps", "")),
                      "{:.1f}".format(r["first_step_s"]),
                      "{:.2f} GiB".format(peak / 2 ** 30) if peak else "")
    return table


def milliseconds(seconds):
    """A step time in ms: whole ms from 100 up, three significant digits below (4.27)."""
    ms = 1000 * seconds
    return "{:.0f}".format(ms) if ms >= 100 else "{:.3g}".format(ms)


def throughput_number(value):
    """Thousands separators from 100 up, three significant digits below: a tiny Deep Speech 2
    run trains on 0.135 audio seconds per second, which one decimal would show as 0.1."""
    return "{:,.0f}".format(value) if abs(value) >= 100 else "{:.3g}".format(value)


# -- data-fed runs (docs/pipelines.md) ----------------------------------------------------
def data_options(args):
    """The options of tbdzoo.pipelines.measure.data_fed that --data and its flags give."""
    if not getattr(args, "data", None):
        return None
    return {"dir": args.data, "split": args.data_split, "augment": args.augment,
            "workers": args.data_workers, "prefetch": args.data_prefetch,
            "deterministic": args.deterministic_data, "seed": 0}


def check_data(args, overrides):
    """Refuse a --data run that cannot work before anything is built: a model without a
    reader, a data-parallel run on CNTK, or a data set that the reader refuses (named file)."""
    if _distributed(args) and backend_info(args.backend).feeds_from_here:
        raise UsageError("--data with --nproc on {0}: its ranks cannot read images ({1}); "
                         "drop --nproc (one process feeds {0} from here) or use {2}".format(
                             args.backend, backend_info(args.backend).feeds_from_here,
                             ", ".join(b.name for b in backend_infos() if not b.feeds_from_here)))
    hparams = get_model(args.model).hparams(args.config, **overrides)
    open_source(args.model, hparams, args.data, args.data_split)


def data_line(record):
    """One line per data-fed run, beside the synthetic table."""
    d = record["data"]
    cpu = d.get("cpu") or {}
    return ("{} on {}, fed from {} ({}, {} workers{}): {} {} = {:.2f}x synthetic; {:.0%} of "
            "each step waiting for input{}; CPU {:.2f} cores busy").format(
                record["model"], record["backend"], d["dir"], d["pipeline"], d["workers"],
                "" if d["augment"] else ", no augmentation",
                throughput_number(d["throughput"]["value"]), d["throughput"]["unit"],
                d["vs_synthetic"] or 0.0, d["input_wait_fraction"],
                " (input-bound)" if d.get("input_bound") else "",
                cpu.get("process_tree_cores_busy", 0.0))


def _data_flags(p):
    g = p.add_argument_group("data-fed training (docs/pipelines.md)")
    g.add_argument("--data", metavar="DIR",
                   help="also train from this ImageNet-layout folder (train/<synset>/*.JPEG) "
                        "through the backend's own input pipeline, after the synthetic run")
    g.add_argument("--data-split", choices=("train", "val"), default="train",
                   help="the split to read (default train)")
    g.add_argument("--data-workers", type=_non_negative, default=2,
                   help="worker processes or threads of the input pipeline (default 2)")
    g.add_argument("--data-prefetch", type=_positive, default=2,
                   help="batches prefetched (per worker where the loader counts so; default 2)")
    g.add_argument("--no-augment", dest="augment", action="store_false",
                   help="resize and centre-crop instead of random-resized crops and flips")
    g.add_argument("--deterministic-data", action="store_true",
                   help="examples in the seeded order on every pipeline (tf.data keeps order)")


# -- data-parallel runs (docs/distributed.md) ------------------------------------------------
def batch_cell(record):
    """The batch, and for a data-parallel run its split: '64 (2 x 32)'."""
    d = record.get("distributed")
    if not d:
        return str(record["batch_size"])
    return "{} ({} x {})".format(record["batch_size"], d["world_size"], d["per_replica_batch"])


def _distributed(args):
    return getattr(args, "nproc", 1) > 1 or getattr(args, "nnodes", 1) > 1 or \
        getattr(args, "global_batch", None) is not None or getattr(args, "baseline", False)


def world_options(args):
    return {"nproc": args.nproc, "nnodes": args.nnodes, "node_rank": args.node_rank,
            "master": args.master, "hosts": args.hosts, "interface": args.interface,
            "global_batch": args.global_batch, "bn_mode": args.bn_mode,
            "rank_timeout": args.rank_timeout, "step_timeout": args.step_timeout}


def _distributed_flags(p, baseline=True):
    g = p.add_argument_group("data-parallel training (docs/distributed.md)")
    g.add_argument("--nproc", type=_positive, default=1, help="processes on this host (default 1)")
    g.add_argument("--nnodes", type=_positive, default=1, help="hosts (default 1)")
    g.add_argument("--node-rank", type=_non_negative, default=0, help="this host's place, 0..nnodes-1")
    g.add_argument("--master", metavar="HOST:PORT", help="node 0's address (several hosts)")
    g.add_argument("--hosts", type=_names, help="every host in node-rank order (TensorFlow, CNTK)")
    g.add_argument("--interface", help="network interface of the collectives (default: lo on one host)")
    g.add_argument("--global-batch", type=_positive,
                   help="fix the global batch (strong scaling); default: nproc x nnodes x the batch size")
    g.add_argument("--bn-mode", choices=BN_MODES, default="replica",
                   help="BatchNorm statistics per replica or synchronised (default: replica)")
    if baseline:
        g.add_argument("--baseline", action="store_true",
                       help="also run one process first, for speedup and scaling efficiency")
    g.add_argument("--rank-timeout", type=_positive_number, default=RANK_TIMEOUT,
                   help="seconds without a rank's heartbeat before it counts as hung (default %(default)s)")
    g.add_argument("--step-timeout", type=_positive_number, default=STEP_TIMEOUT,
                   help="seconds without any rank finishing a step (default %(default)s)")


# -- hyperparameters -------------------------------------------------------------------------
class UsageError(TbdError):
    """Options that contradict each other."""


EXECUTION_OPTIONS = ("precision", "execution", "memory_format")


def _assignments(args):
    """--set NAME=VALUE pairs in order; a name given twice keeps its last value."""
    return OrderedDict(getattr(args, "set", None) or [])


def overrides_for(model_name, args, assignments=None):
    """The hyperparameters a command sets for ``model_name``: --set values parsed to each
    rule's type and the execution options, checked with --batch-size against the model's rules
    so that a bad value stops the command before any run."""
    md = get_model(model_name)
    if args.config not in md.configs:
        md.hparams(args.config)  # names the known configs
    known = md.configs[args.config]
    overrides = OrderedDict()
    for name, text in (_assignments(args) if assignments is None else assignments).items():
        if name not in known:
            raise UnknownNameError("hyperparameter of " + model_name, name, known)
        overrides[name] = md.rules[name].parse(name, text)
    for option in EXECUTION_OPTIONS:
        if getattr(args, option, None):
            overrides[option] = getattr(args, option)
    size = getattr(args, "batch_size", None)
    if size and overrides.get("batch_size", size) != size:
        raise UsageError("the batch size is given twice (--batch-size {} and --set batch_size={}); "
                         "give it once".format(size, overrides["batch_size"]))
    md.hparams(args.config, **dict(overrides, **({"batch_size": size} if size else {})))
    return overrides


def bench_overrides(models, args):
    """Per model, the --set values it has: a model without the name runs without it (a note
    on stderr says so), and a name that no model has is refused, listing those they have."""
    assignments = _assignments(args)
    names = {m: set(get_model(m).configs.get(args.config, ())) for m in models}
    every = set().union(*names.values())
    for name in assignments:
        if name not in every:
            raise UnknownNameError("hyperparameter of " + " or ".join(models), name, every)
        without = [m for m in models if name not in names[m]]
        if without:
            print("tbd: --set {} applies to {} only; {} run{} without it".format(
                name, ", ".join(m for m in models if m not in without), ", ".join(without),
                "s" if len(without) == 1 else ""), file=sys.stderr)
    return OrderedDict((m, overrides_for(m, args, OrderedDict(
        (k, v) for k, v in assignments.items() if k in names[m]))) for m in models)


# -- arguments -----------------------------------------------------------------------------






def _choices(option):
    return COMMON[option].choices


# tbd bench's protocol: 2 warm-up steps (the first compiles, the second still allocates on some
# frameworks), then 5 repeats of at least 1 step and 1 second each (docs/benchmarks.md).
BENCH_PROTOCOL = (2, 1, 5, 1.0)


def _measuring(p, warmup, steps, repeats, min_repeat=0.0):
    p.add_argument("--config", default="paper", help="model config (default: paper)")
    p.add_argument("--precision", choices=_choices("precision"),
                   help="fp32, tf32 (GPU matmuls) or bf16 mixed precision (default: the config's)")
    p.add_argument("--execution", choices=_choices("execution"),
                   help="the framework's default, eager or compiled steps (default: the config's)")
    p.add_argument("--memory-format", choices=_choices("memory_format"),
                   help="layout of convolutions (default: the config's)")
    p.add_argument("--set", type=_assignment, action="append", metavar="NAME=VALUE",
                   help="set any hyperparameter of the config (repeatable), e.g. --set lr=0.05")
    p.add_argument("--warmup", type=_positive, default=warmup, help="untimed steps first (default %(default)s)")
    p.add_argument("--steps", type=_positive, default=steps, help="timed steps per repeat (default %(default)s)")
    p.add_argument("--repeats", type=_positive, default=repeats, help="timed repeats (default %(default)s)")
    p.add_argument("--min-repeat-seconds", type=_non_negative_number, default=min_repeat,
                   help="each repeat runs at least this long: more steps than --steps where they "
                        "are fast (default %(default)s)")
    p.add_argument("--device", help="cpu or cuda:N (default: the backend's best)")
    p.add_argument("--peak-tflops", type=_positive_number, help="peak TFLOP/s to report utilisation against")
    p.add_argument("--no-samplers", action="store_true", help="time only; no CPU/GPU samplers")
    p.add_argument("--mllog", metavar="FILE", help="also write MLPerf-style :::MLLOG lines here")
    p.add_argument("-o", "--output", help="append one JSON record per run to this JSONL file")


def parser():
    p = argparse.ArgumentParser(prog="tbd", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="models and backends, and whether each backend is ready")

    run = sub.add_parser("run", help="profile one model on one backend")
    run.add_argument("model")
    run.add_argument("--backend", required=True)
    run.add_argument("--batch-size", type=_positive, help="default: the config's")
    _measuring(run, 5, 20, 3)
    _distributed_flags(run)
    _data_flags(run)

    sweep = sub.add_parser("sweep", help="one model on one backend over batch sizes, until OOM; "
                                         "a3c also over its number of asynchronous learners")
    sweep.add_argument("model")
    sweep.add_argument("--backend", required=True)
    sweep.add_argument("--batch-sizes", type=_sizes, help="e.g. 8,16,32,64")
    sweep.add_argument("--learners", type=_learners,
                       help="a3c only: asynchronous actor-learners to sweep, e.g. 1,2,4,8,16")
    sweep.add_argument("--frames", type=_positive,
                       help="with --learners: stop each run after this many frames")
    sweep.add_argument("--seconds", type=_positive_number,
                       help="with --learners: stop each run after this long (default 30)")
    sweep.add_argument("--seed", type=_integer, default=0, help="with --learners: environment seed")
    sweep.add_argument("--memory-cap", type=_bytes, help="stop a run whose resident memory passes this (e.g. 8G)")
    _measuring(sweep, 5, 20, 3)
    _distributed_flags(sweep)

    bench = sub.add_parser("bench", help="every model on every ready backend")
    bench.add_argument("--models", type=_names, help="comma-separated model names (default: all)")
    bench.add_argument("--backends", type=_names, help="comma-separated backends (default: ready ones)")
    bench.add_argument("--batch-size", type=_positive, help="one batch size for every model")
    bench.add_argument("--paper-batches", dest="cpu_batches", action="store_false",
                       help="on the CPU too, each config's batch size (and lengths) instead of CPU-sized ones "
                            "(a GPU always runs the config's)")
    _measuring(bench, *BENCH_PROTOCOL)

    report = sub.add_parser("report", help="HTML and Markdown report from JSONL records")
    report.add_argument("files", nargs="+")
    report.add_argument("-o", "--output", required=True, help="output folder")

    data = sub.add_parser("data", help="real data sets made offline (docs/datasets.md)")
    data_sub = data.add_subparsers(dest="data_command", metavar="{list,make}", required=True)
    data_sub.add_parser("list", help="the data sets tbdzoo makes, with their options")
    data_make = data_sub.add_parser("make", help="make one data set in a new folder")
    data_make.add_argument("name")
    data_make.add_argument("--out", required=True, help="a new (or empty) folder")
    data_make.add_argument("--seed", type=_non_negative, default=0,
                           help="every random choice follows from it (default %(default)s)")
    data_make.add_argument("--set", type=_assignment, action="append", metavar="OPTION=VALUE",
                           help="a maker's option (repeatable; tbd data list shows them), "
                                "e.g. --set size=299")
    export = sub.add_parser("export", help="standalone source of a model for one framework, "
                                           "with its weights beside it")
    export.add_argument("model")
    export.add_argument("--backend", required=True, help="the framework to write source for")
    export.add_argument("-o", "--output", required=True,
                        help="the source file to write, or a folder (gets MODEL_BACKEND.py)")
    export.add_argument("--config", default="paper", help="the model's config (default %(default)s)")
    export.add_argument("--weights", help="a tbdzoo weights file (.npz) of the model to export "
                                          "with, instead of its initial weights")
    export.add_argument("--seed", type=_integer, default=0, help="initial weights' seed")
    _distributed_flags(add_train_parser(sub, _assignment, _positive), baseline=False)
    add_consistency_parser(sub)
    for command in _leaf_parsers(sub):
        # after the command too (tbd run ... --verbose); SUPPRESS keeps one given before it
        command.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS,
                             help=VERBOSE_HELP)
    return p


VERBOSE_HELP = ("leave the frameworks' start-up banners and warnings on (TensorFlow, MXNet, "
                "CNTK), in this process and in the workers")


def cmd_train(args):
    return run_train(args, rich_console())


def _leaf_parsers(sub):
    """Every parser under the subparsers action ``sub`` that takes arguments: each command,
    and each command of a command that has its own (tbd data make, tbd consistency check)."""
    leaves = []
    for command in sub.choices.values():
        nested = [a for a in command._actions if isinstance(a, argparse._SubParsersAction)]
        leaves.append(command)
        for action in nested:
            leaves.extend(_leaf_parsers(action))
    return leaves


def cmd_export(args):
    source, weights = export(args.model, args.backend, args.output, config=args.config,
                             weights=args.weights, seed=args.seed)
    print("wrote {} and its weights {}".format(source, weights))
    return 0


def cmd_consistency(args):
    return consistency_command(args, rich_console())


def main(argv=None):
    args = parser().parse_args(argv)
    if args.verbose:  # read by each backend as it imports its framework, here and in workers
        os.environ[VERBOSE_VARIABLE] = "1"
    commands = {"list": cmd_list, "run": cmd_run, "sweep": cmd_sweep, "bench": cmd_bench,
                "report": cmd_report, "data": cmd_data, "train": cmd_train,
                "consistency": cmd_consistency, "export": cmd_export}
    try:
        return commands[args.command](args)
    except TbdError as e:
        print("tbd: error: {}".format(e), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if args.command == "train":
            print("tbd: interrupted; no record was written", file=sys.stderr)
            return 130
        if args.command == "data":
            print("tbd: interrupted; nothing was left in the output folder", file=sys.stderr)
            return 130
        print("tbd: interrupted; every finished run is already in the output file", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
