"""Training to a target data-parallel (``tbd train ... --nproc N``): the launcher starts the
ranks (tbdzoo/distributed/), each trains its replica on its share of the data through the
loop of loop.py, rank 0 evaluates and decides when to stop, and the engine hands that
decision to every rank (``agree`` in the backend's distributed.py; without one, the ranks run
the step budget ``max_steps`` agreed in advance). Rank 0's record comes back with the world
it ran in. docs/distributed.md, "Training to a target". Valid Python 3.6 (CNTK's ranks)."""
import os
import time
from collections import OrderedDict

from ..backends.info import backend_info, backend_infos
from ..distributed import launch
from ..distributed.runs import _node
from ..distributed.world import batch_sizes
from ..errors import DistributedError
from ..models import get_model, list_models
from .errors import TrainingError
from .loop import TrainResult, _run_supervised, task_check
from .mllog import TrainingMllog
from .proxies import proxy_overrides, training_of
from .targets import parse_target

__all__ = ["train_distributed", "train_rank", "data_parallel_models"]


def data_parallel_models():
    """The models whose tasks read a rank's share (their card's ``training.data_parallel``:
    the image pipelines, the translation and speech batches). docs/training.md, "Not covered
    yet", says why the others do not."""
    return [m for m in list_models()
            if get_model(m).training is not None and get_model(m).training.data_parallel]

WORLD_OPTIONS = ("nnodes", "node_rank", "master", "hosts", "interface", "global_batch",
                 "bn_mode", "rank_timeout", "step_timeout", "command", "device")


def train_distributed(name, backend, data_dir, target, seed, max_minutes, eval_every, progress,
                      mllog, max_steps, overrides, workers, nproc, **world):
    """Launch the ranks and wait; returns rank 0's TrainResult (None on a node without it)."""
    unknown = set(world) - set(WORLD_OPTIONS)
    if unknown:
        raise TrainingError("train_to_target takes no option {}; the data-parallel ones are "
                            "nproc, {}".format(", ".join(sorted(unknown)),
                                               ", ".join(WORLD_OPTIONS)))
    card = training_of(name)
    if card.data_parallel is None:
        raise TrainingError("{} does not train data-parallel to a target (its task reads no "
                            "rank's share of its batches); data-parallel runs train {}: drop "
                            "--nproc, or measure its data-parallel throughput with tbd run "
                            "--nproc".format(name, ", ".join(data_parallel_models())))
    if backend is None:
        raise TrainingError("give the backend to build {} on".format(name))
    task_check(name, data_dir)
    node = _node(backend, nproc, world.get("nnodes", 1), world.get("node_rank", 0),
                 world.get("master"), world.get("hosts"), world.get("interface"),
                 world.get("bn_mode", "replica"), world.get("device", "cpu"))
    info = backend_info(backend)
    engine_agrees = info.broadcasts
    if info.feeds_from_here and get_model(name).image is not None and node.world_size > 1:
        raise TrainingError("{} on {} with --nproc: its ranks cannot read images ({}); use "
                            "{}, or drop --nproc".format(
                                name, backend, info.feeds_from_here,
                                ", ".join(b.name for b in backend_infos()
                                          if not b.feeds_from_here)))
    if not engine_agrees and node.world_size > 1 and max_steps is None:
        raise TrainingError("{}'s ranks cannot hand rank 0's stop decision to each other "
                            "(its engine has no broadcast), so they run a step budget "
                            "agreed in advance: give --max-steps N".format(backend))
    config, merged = proxy_overrides(name)
    merged.update(overrides or {})
    get_model(name).hparams(config, **merged)  # every value checked before a process starts
    per_replica, global_size, scaling = batch_sizes(node.world_size, merged.pop("batch_size"),
                                                    world.get("global_batch"))
    training = OrderedDict([
        ("data_dir", data_dir), ("target", [target.metric.name, target.value]),
        ("max_minutes", max_minutes), ("eval_every", eval_every), ("max_steps", max_steps),
        ("workers", workers), ("mllog", getattr(mllog, "path", None)),
        ("user_overrides", OrderedDict(sorted((overrides or {}).items())))])
    job = launch.make_job(name, backend, node, "target", per_replica, global_size, config, seed,
                          merged, rank_timeout=world.get("rank_timeout", launch.RANK_TIMEOUT),
                          step_timeout=world.get("step_timeout", launch.STEP_TIMEOUT),
                          command=world.get("command"), training=training,
                          rank_module="tbdzoo.training.rank")
    run = launch.start(job)
    _follow(run, progress, target, max_minutes)
    results = run.wait()
    if "0" not in results:
        return None
    record = results["0"]["record"]
    ranks = [results[k] for k in sorted(results, key=int)]
    if len(set(len(r["losses"]) for r in ranks)) != 1:
        raise DistributedError("the ranks stopped at different steps ({}): the stop decision "
                               "did not reach every rank".format(
                                   ", ".join(str(len(r["losses"])) for r in ranks)))
    if len(ranks) == node.world_size:
        record["losses"] = [sum(w * l for w, l in zip(ws, ls)) for ws, ls in zip(
            zip(*[r["gradient_weights"] for r in ranks]), zip(*[r["losses"] for r in ranks]))]
        losses = "the global loss of each step, sum_r w_r loss_r"
    else:
        losses = "rank 0's own loss of each step (the other nodes' ranks are theirs)"
    record["batch_size"] = global_size
    record["distributed"] = OrderedDict([
        ("world_size", node.world_size), ("nnodes", node.nnodes), ("nproc_per_node", node.nproc),
        ("per_replica_batch", per_replica), ("global_batch", global_size), ("scaling", scaling),
        ("engine", results["0"].get("engine")), ("communication", results["0"].get("communication")),
        ("bn_mode", node.bn_mode), ("sharding", card.sharding),
        ("stop", results["0"]["stop"]), ("losses", losses)])
    return TrainResult.from_record(record)


def _follow(run, progress, target, max_minutes):
    """Rank 0's evaluations, from its status file, to ``progress`` while the ranks run."""
    if progress is None:
        return
    seen, start = 0, time.time()
    while run.process.poll() is None:
        time.sleep(0.5)
        events = [e for e in run.statuses().get(0, []) if e.get("evaluation")]
        for e in events[seen:]:
            entry = e["evaluation"]
            progress(dict(entry, target=target.value, metric=target.metric.name,
                          wall_seconds=time.time() - start,
                          limit_seconds=max_minutes * 60.0 if max_minutes else None,
                          done=False))
        seen = len(events)


def train_rank(job, model, status, engine):
    """One rank's run to the target; rank 0's result carries the record."""
    t = job["training"]
    world = model.world
    target = parse_target(job["model"], tuple(t["target"]))
    result = TrainResult(job["model"], job["backend"], job["seed"], target, t["eval_every"])
    result.details["config"] = "proxy of " + job["config"]
    result.details["overrides"] = t["user_overrides"]
    result.details["batch_size"] = job["global_batch"]
    agree = getattr(engine, "agree", None)
    if agree is not None:
        stop = "rank 0's decision after each evaluation, through {}".format(engine.AGREEMENT)
        def decide(code):
            return agree(world, code)
    else:
        stop = "the step budget (max_steps {}) agreed in advance".format(t["max_steps"])
        decide = None
    mllog = TrainingMllog(t["mllog"]) if t.get("mllog") and world.rank == 0 else None

    def on_eval(event):
        keep = ("step", "value", "train_seconds", "eval_seconds")
        status.write(event="evaluated", evaluation=dict((k, event[k]) for k in keep))

    _run_supervised(model, result, t["data_dir"], target, job["seed"], t["max_minutes"],
                    t["eval_every"], on_eval, mllog, t["max_steps"], t["workers"], world=world,
                    agree=decide, on_step=lambda n: status.write(event="step", step=n))
    weights = result.details.pop("gradient_weights", None) or [1.0] * len(result.losses)
    out = {"losses": result.losses, "gradient_weights": weights, "stop": stop}
    if world.rank == 0:
        result.details["hparams"] = OrderedDict(sorted(
            (k, list(v) if isinstance(v, tuple) else v) for k, v in model.hparams.items()))
        result.details["load_average"] = [round(x, 2) for x in os.getloadavg()]
        result.details["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        out["record"] = result.record()
    return out
