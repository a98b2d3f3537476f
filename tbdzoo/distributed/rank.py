"""One rank of a data-parallel run: ``python -m tbdzoo.distributed.rank JOB.json``.

Started by the node's agent (tbdzoo/distributed/agent.py) in the backend's environment with
its ``World`` in the environment. It starts its heartbeat before anything slow, lets the
backend's engine set itself up, builds the model as the engine's subclass, trains on its shard
of the global batch and, on rank 0, writes the result. Valid Python 3.6 (CNTK ranks).
"""
import json
import os
import sys
import threading
import time
import traceback

from ..backends.info import backend_info
from ..models import get_model
from ..pipelines.measure import data_fed
from ..profiling.profile import profile
from ..weights import save_arrays
from .world import Node, World, gradient_weight, shard

STATUS_VARIABLE = "TBDZOO_STATUS"   # the file this rank reports to
NODE_VARIABLE = "TBDZOO_NODE"       # the node, when an outside launcher (mpiexec) starts ranks
LOCAL_RANK_VARIABLE = "TBDZOO_LOCAL_RANK_VARIABLE"  # then: the variable holding the local rank
HEARTBEAT_SECONDS = 1.0


class Status:
    """JSON lines to the agent; a thread touches the file every second as a heartbeat."""

    def __init__(self, path):
        self.path = path
        self._stop = threading.Event()
        self.write(event="start", pid=os.getpid())
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()

    def write(self, **fields):
        fields["time"] = time.time()
        with open(self.path, "a") as f:
            f.write(json.dumps(fields) + "\n")
            f.flush()

    def _beat(self):
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                os.utime(self.path, None)
            except OSError:
                pass

    def stop(self):
        self._stop.set()


def status_path():
    """This rank's status file; one path per local rank when an outside launcher started it."""
    path = os.environ[STATUS_VARIABLE]
    if "{local_rank}" in path:
        path = path.format(local_rank=os.environ[os.environ[LOCAL_RANK_VARIABLE]])
    return path


def engine_of(backend):
    """The data-parallel engine module that ``backend``'s BackendInfo names."""
    return backend_info(backend).load("distributed_engine")


def this_world(engine):
    if os.environ.get("TBDZOO_WORLD"):
        return World.from_environment()
    node = Node.from_dict(json.loads(os.environ[NODE_VARIABLE]))
    return node.world(int(os.environ[os.environ[LOCAL_RANK_VARIABLE]]))


def build(job, world, engine):
    """The engine's model at the per-replica batch; an epoch-based learning-rate schedule
    counts epochs in steps of the global batch, as one process at that batch does."""
    model_def = get_model(job["model"])
    overrides = dict(job["overrides"], batch_size=job["per_replica"])
    whole = model_def.hparams(job["config"], **dict(job["overrides"], batch_size=job["global_batch"]))
    if "steps_per_epoch" in whole and "steps_per_epoch" not in job["overrides"]:
        overrides["steps_per_epoch"] = whole["steps_per_epoch"]
    hparams = model_def.hparams(job["config"], **overrides)
    return engine.model_class()(model_def, hparams, job["seed"], device=world.device, world=world)


def global_batch(job, model):
    """The same global batch on every rank (the same seed), and this rank's part of it."""
    full = model.synthetic_batch(seed=job["data_seed"], batch_size=job["global_batch"])
    world = model.world
    model.world.gradient_weight = gradient_weight(model.spec, full, world.rank, world.size)
    return shard(model.spec, full, world.rank, world.size), model.model_def.items(model.hparams, full)


def run_profile(job, model, status, engine=None):
    """Every rank runs the same protocol (collectives must match); rank 0 keeps the record."""
    batch, items = global_batch(job, model)
    p = job["protocol"]
    record = profile(model, steps=p["steps"], warmup=p["warmup"], repeats=p["repeats"],
                     batch=batch, samplers=p.get("samplers", True), command=job.get("command"),
                     progress=lambda done, total: status.write(event="step", step=done))
    prepared = model.prepare_batch(batch)
    model.communicate = False  # the same steps with no gradient reduction: exposed communication
    try:
        model.train_step(prepared)  # untimed: a compiled step without the reduction is traced here
        model.synchronize()
        start = time.perf_counter()
        for i in range(p["steps"]):
            model.train_step(prepared, sync=(i == p["steps"] - 1))
            status.write(event="step", step="local {}".format(i + 1))
        model.synchronize()
        local = (time.perf_counter() - start) / p["steps"]
    finally:
        model.communicate = True
    out = {"record": record, "step_time_local": local, "global_items": items}
    if job.get("data"):
        out["data"] = run_data_fed(job, model, status)
    return out


def run_data_fed(job, model, status):
    """The same protocol again, each step on the next batch of this rank's own pipeline over
    its share of every epoch of the data folder (docs/distributed.md, "Data-fed runs")."""
    p, options = job["protocol"], dict(job["data"])
    options["data_dir"] = options.pop("dir")
    world = model.world
    world.gradient_weight = 1.0 / world.size  # equal shares of images
    return data_fed(model, steps=p["steps"], warmup=p["warmup"], repeats=p["repeats"],
                    samplers=p.get("samplers", True), rank=world.rank, world_size=world.size,
                    progress=lambda done, total: status.write(event="step",
                                                              step="data {}".format(done)),
                    **options)


def run_train(job, model, status, engine=None):
    """``steps`` steps on the shard; this rank's losses, gradient weight and weights after
    them (``weights_path`` with {rank} in it)."""
    batch = model.prepare_batch(global_batch(job, model)[0])
    losses = []
    for i in range(job["steps"]):
        losses.append(model.train_step(batch))
        status.write(event="step", step=i + 1)
    out = {"losses": losses, "gradient_weight": model.world.gradient_weight}
    if job.get("weights_path"):
        save_arrays(job["weights_path"].format(rank=model.world.rank), model.get_weights())
    return out


MODES = {"profile": run_profile, "train": run_train}


def main(argv=None, modes=None):
    """Run the job's mode: one of MODES, or of ``modes`` that a module above this one adds
    (tbdzoo.training.rank adds "target"), each called as ``run(job, model, status, engine)``."""
    modes = dict(MODES, **(modes or {}))
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        job = json.load(f)
    os.environ.setdefault("OMP_NUM_THREADS", str(job.get("threads_per_rank", 1)))
    status = Status(status_path())
    try:
        engine = engine_of(job["backend"])
        world = this_world(engine)
        world = engine.init(world)
        status.write(event="init", rank=world.rank)
        model = build(job, world, engine)
        status.write(event="built", rank=world.rank)
        result = modes[job["mode"]](job, model, status, engine)
        result.update(rank=world.rank, engine=engine.ENGINE,
                      communication=engine.communication(world.node))
        path = os.path.join(job["dir"], "result-{}.json".format(world.rank))
        with open(path + ".part", "w") as f:
            json.dump(result, f)
        os.rename(path + ".part", path)
        status.write(event="done", rank=world.rank)
        model.close()
        engine.finalize(world)
    except BaseException as e:  # noqa: BLE001  (any end but success is reported, then the rank exits)
        status.write(event="error", error="{}: {}".format(type(e).__name__, e))
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)  # a framework's threads must not keep a failed rank alive
    finally:
        status.stop()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # some engines' threads (gloo, MPI) hold the interpreter at exit


if __name__ == "__main__":
    main()
