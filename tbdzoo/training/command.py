"""`tbd train MODEL --backend B --data DIR --target METRIC=VALUE`: one run to a target with a
rich progress bar, its record appended to a JSONL file and, if asked, MLPerf-style lines."""
import sys
from collections import OrderedDict

from .. import suite
from ..argtypes import integer, non_negative, positive_number
from ..errors import UnknownNameError
from ..models import get_model
from ..progress import progress_display
from .errors import TrainingError
from .loop import task_check
from .mllog import TrainingMllog
from .proxies import proxy_overrides, training_of
from .run import train_to_target
from .targets import metrics_of, parse_target

__all__ = ["add_parser", "cmd_train"]


def add_parser(sub, assignment, positive):
    p = sub.add_parser("train", help="train a proxy config to a target metric on the held-out "
                                     "split (docs/training.md)")
    p.add_argument("model")
    p.add_argument("--backend", required=True)
    p.add_argument("--data", metavar="DIR",
                   help="the data folder: ImageNet layout for resnet50 and inception_v3 (tbd data "
                        "make fashion-mnist-imagenet), IWSLT'15 layout for seq2seq and "
                        "transformer (numbers-en-vi), LibriSpeech layout for deepspeech2 "
                        "(spoken-numbers), VOC 2007 layout for faster_rcnn (voc-composed), "
                        "downsampled-ImageNet layout for wgan (fashion-mnist-64); a3c needs none")
    p.add_argument("--target", metavar="METRIC=VALUE",
                   help="e.g. top1=0.65 (resnet50, inception_v3), token_accuracy=0.5 (seq2seq, "
                        "transformer), cer=0.7 (deepspeech2), map=0.1 (faster_rcnn), "
                        "frechet=30 (wgan), return=475 (a3c); default: the model's in "
                        "docs/training.md")
    p.add_argument("--seed", type=integer, default=0, help="weights, data order and environments")
    p.add_argument("--max-minutes", type=positive_number, default=10.0,
                   help="stop unreached after this long, training and evaluation together "
                        "(default %(default)s)")
    p.add_argument("--max-steps", type=positive, help="stop unreached after this many steps")
    p.add_argument("--eval-every", type=positive,
                   help="steps between evaluations (default: the model's, docs/training.md)")
    p.add_argument("--data-workers", type=non_negative, default=0,
                   help="input pipeline workers (default %(default)s: a background thread)")
    p.add_argument("--set", type=assignment, action="append", metavar="NAME=VALUE",
                   help="a hyperparameter on top of the proxy config (repeatable)")
    p.add_argument("--mllog", metavar="FILE", help="also write MLPerf-style :::MLLOG lines here")
    p.add_argument("-o", "--output", default="training.jsonl",
                   help="append the run's record to this JSONL file (default %(default)s)")
    return p


def _overrides(model_name, assignments):
    md = get_model(model_name)
    config, proxy = proxy_overrides(model_name)
    known = md.configs[config]
    overrides = OrderedDict()
    for name, text in assignments or ():
        if name not in known:
            raise UnknownNameError("hyperparameter of " + model_name, name, known)
        overrides[name] = md.rules[name].parse(name, text)
    md.hparams(config, **dict(proxy, **overrides))   # every value checked before anything runs
    return overrides


def world_options(args, command):
    """The data-parallel keyword arguments of train_to_target, or {} for one process."""
    if args.nproc == 1 and args.nnodes == 1 and args.global_batch is None:
        return {}
    return {"nproc": args.nproc, "nnodes": args.nnodes, "node_rank": args.node_rank,
            "master": args.master, "hosts": args.hosts, "interface": args.interface,
            "global_batch": args.global_batch, "bn_mode": args.bn_mode,
            "rank_timeout": args.rank_timeout, "step_timeout": args.step_timeout,
            "command": command}


def cmd_train(args, console):
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn

    metrics_of(args.model)
    target = parse_target(args.model, args.target or training_of(args.model).target)
    if args.max_minutes <= 0:
        raise TrainingError("--max-minutes must be positive, not {:g}".format(args.max_minutes))
    overrides = _overrides(args.model, args.set)
    task_check(args.model, args.data)
    mllog = TrainingMllog(args.mllog) if args.mllog else None
    label = "{} on {} to {}".format(args.model, args.backend, target)
    with progress_display(console, TextColumn("{task.description}"), BarColumn(),
                          TextColumn("{task.fields[stage]}"), TimeElapsedColumn()) as progress:
        task = progress.add_task(label, total=args.max_minutes * 60.0, stage="building")

        def on_eval(event):
            progress.update(task, completed=event["wall_seconds"], stage="step {}: {} {:.4g}".format(
                event["step"], event["metric"], event["value"] if event["value"] is not None
                else float("nan")))

        command = " ".join(["tbd"] + sys.argv[1:])
        world = world_options(args, command)
        if world:
            progress.update(task, stage="{} process(es) x {} node(s)".format(
                args.nproc, args.nnodes))
        result = train_to_target(args.model, args.backend, args.data, target, seed=args.seed,
                                 max_minutes=args.max_minutes, eval_every=args.eval_every,
                                 progress=on_eval, mllog=mllog, max_steps=args.max_steps,
                                 overrides=overrides, workers=args.data_workers, **world)
        if result is None:  # a node without rank 0: rank 0's node writes the record
            progress.update(task, stage="done (rank 0 records on node 0)")
            return 0
        progress.update(task, stage=result.stop_reason)
    record = result.record()
    record["command"] = command
    suite.append_record(args.output, record)
    if result.reached:
        console.print("{}: {} reached at step {} after {:.1f} s of training ({:.1f} s of "
                      "evaluation)".format(label, target, result.steps, result.seconds,
                                           result.eval_seconds_at_target), highlight=False)
    else:
        console.print("{}: not reached ({}); last {} {}".format(
            label, result.stop_reason, target.metric.name, result.last_value), highlight=False)
    console.print("record appended to {}".format(args.output))
    return 0 if result.reached else 1
