"""python -m tbdzoo.rl: train the a3c model, synchronously (A2C) or with asynchronous
actor-learners (A3C, docs/a3c.md), and print what it measured.

    python -m tbdzoo.rl --backend torch --config cartpole --target 475 --max-seconds 600
    python -m tbdzoo.rl --mode async --learners 16 --config cartpole --max-seconds 60
    python -m tbdzoo.rl --backend cntk --seed 0 --target 475 --max-frames 330000 \
        --record benchmarks/results/a3c_cartpole.json   # the runs of docs/environments.md
"""
import argparse
import os
import shlex
import sys

from ..backends.registry import build
from ..errors import TbdError
from ..models.a3c import NAME as A3C
from .a2c import train_a2c
from .async_learners import train_a3c
from .record import add_run


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m tbdzoo.rl", description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("sync", "async"), default="sync",
                   help="sync: A2C, seeded (default); async: A3C's asynchronous learners")
    p.add_argument("--learners", type=int,
                   help="async: the number of actor-learners (default: the config's)")
    p.add_argument("--device", help="async on torch: the learners' device (default cpu)")
    p.add_argument("--backend", default="torch")
    p.add_argument("--config", default="cartpole")
    p.add_argument("--env", help="environment (default: the config's env)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", type=float, help="stop at this mean return over 100 episodes")
    p.add_argument("--max-frames", type=int)
    p.add_argument("--max-seconds", type=float)
    p.add_argument("--log-every", type=int, default=200)
    p.add_argument("--threads", type=int, default=1,
                   help="CPU threads per framework (default 1: the networks are small, and idle "
                        "threads spinning on a loaded machine cost 100x on CartPole's MLP)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="override a hyperparameter (repeatable)")
    p.add_argument("--record", metavar="FILE.json",
                   help="add this run (backend, seed, frames, seconds, reached, the command) to "
                        "the runs of FILE.json, e.g. benchmarks/results/a3c_cartpole.json")
    args = p.parse_args(argv)
    command = "python -m tbdzoo.rl " + " ".join(
        shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    load_before = os.getloadavg()[0]
    threads = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TF_NUM_INTRAOP_THREADS",
               "MXNET_CPU_WORKER_NTHREADS")
    if args.mode == "sync":   # async learner threads call TensorFlow at once: keep inter-op
        threads += ("TF_NUM_INTEROP_THREADS",)
    for name in threads:
        os.environ.setdefault(name, str(args.threads))   # read when a framework is imported
    overrides = {}
    for item in args.set:
        name, _, value = item.partition("=")
        overrides[name] = _parse(value)
    if args.mode == "async":
        return _asynchronous(p, args, overrides)
    if args.learners is not None or args.device is not None:
        p.error("--learners and --device are options of --mode async")
    model = build(A3C, backend=args.backend, config=args.config, seed=args.seed, **overrides)
    hparams = dict(model.hparams)
    try:
        result = train_a2c(model, args.env, seed=args.seed, max_frames=args.max_frames,
                           max_seconds=args.max_seconds, target_return=args.target,
                           log_every=args.log_every, progress=print)
    finally:
        model.close()
    print(result.summary())
    if args.record:
        add_run(args.record, result, backend=args.backend, config=args.config, seed=args.seed,
                target=args.target, overrides=overrides, hparams=hparams, command=command,
                load=(load_before, os.getloadavg()[0]))
    return 0 if args.target is None or result.solved_at is not None else 1


def _asynchronous(p, args, overrides):
    if args.target is not None:
        p.error("--target stops the synchronous mode; --mode async stops at --max-frames or "
                "--max-seconds")
    if args.record:
        p.error("--record keeps the synchronous mode's runs to a target; an asynchronous run's "
                "record comes from `tbd sweep a3c --learners N -o FILE.jsonl`")
    if args.max_frames is None and args.max_seconds is None:
        p.error("--mode async needs --max-frames or --max-seconds")
    try:
        result = train_a3c(args.backend, args.config, learners=args.learners,
                           frames=args.max_frames, seconds=args.max_seconds, seed=args.seed,
                           env=args.env, device=args.device, **overrides)
    except TbdError as e:
        p.error(str(e))
    print(result.summary())
    return 0


def _parse(text):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    if "," in text:
        return tuple(_parse(t) for t in text.split(","))
    return text


if __name__ == "__main__":
    raise SystemExit(main())
