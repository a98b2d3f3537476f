"""``run`` and ``train``: a data-parallel run of one model, from Python or ``tbd``.

``run`` profiles by the measuring protocol on every rank and returns rank 0's record with the
``distributed`` fields (docs/distributed.md); ``train`` runs a few steps and returns the
global loss of each step and the weights after them, which is what the correctness tests
compare with one process.
"""
import os
import shutil
import tempfile
from collections import OrderedDict

from ..backends import environments
from ..errors import DistributedError
from ..models import get_model
from ..weights import load_arrays
from . import launch
from .data_fed import global_data_fed
from .world import Node, batch_sizes


def _node(backend, nproc, nnodes, node_rank, master, hosts, interface, bn_mode, device):
    addr, port = "127.0.0.1", None
    if master:
        addr, _, text = master.rpartition(":")
        if not addr or not text.isdigit():
            raise DistributedError("--master is HOST:PORT, e.g. 10.0.0.1:29500, not {!r}".format(master))
        port = int(text)
    if device is None:
        device = "cuda" if environments.on_gpu(backend) else "cpu"
    kind = "cuda" if str(device).startswith("cuda") else "cpu"
    return Node(backend, nproc=nproc, nnodes=nnodes, node_rank=node_rank, master_addr=addr,
                master_port=port, hosts=hosts, interface=interface, bn_mode=bn_mode, device=kind)


def _sizes(model, config, overrides, batch_size, global_batch, world_size):
    hp = get_model(model).hparams(config, **overrides)  # every value checked before a process starts
    return batch_sizes(world_size, batch_size or hp["batch_size"], global_batch)


def run(model, backend, nproc=1, nnodes=1, node_rank=0, master=None, hosts=None, interface=None,
        config="paper", batch_size=None, global_batch=None, bn_mode="replica", device=None,
        seed=0, overrides=None, warmup=5, steps=20, repeats=3, samplers=True, baseline=None,
        rank_timeout=launch.RANK_TIMEOUT, step_timeout=launch.STEP_TIMEOUT, command=None,
        data=None):
    """Profile ``model`` on ``backend`` over ``nproc`` x ``nnodes`` ranks; rank 0's record
    (None on a node without rank 0). ``batch_size`` is per replica (default: the config's);
    ``global_batch`` fixes the global one instead. ``baseline``: a one-process record (or its
    throughput) for speedup and efficiency. ``data``: the options of
    tbdzoo.pipelines.measure.data_fed (dir, split, augment, workers, prefetch, deterministic,
    seed); every rank then also trains from its share of that folder (the record's "data")."""
    overrides = OrderedDict(overrides or {})
    overrides.pop("batch_size", None)
    node = _node(backend, nproc, nnodes, node_rank, master, hosts, interface, bn_mode, device)
    per_replica, global_size, scaling = _sizes(model, config, overrides, batch_size, global_batch,
                                               node.world_size)
    job = launch.make_job(model, backend, node, "profile", per_replica, global_size, config, seed,
                          overrides, protocol={"warmup": warmup, "steps": steps,
                                               "repeats": repeats, "samplers": samplers},
                          rank_timeout=rank_timeout, step_timeout=step_timeout, command=command,
                          data=data)
    results = launch.start(job).wait()
    if "0" not in results:
        return None
    record = distributed_record(results["0"], node, per_replica, global_size, scaling, baseline)
    if data:
        record["data"] = global_data_fed(results, node, record["throughput"]["value"])
    return record


def distributed_record(result, node, per_replica, global_size, scaling, baseline=None):
    """Rank 0's record over the global batch, with the ``distributed`` fields."""
    record = result["record"]
    step = record["step_time"]["median"]
    record["batch_size"] = global_size
    throughput = record["throughput"]
    throughput["items_per_step"] = result["global_items"]
    throughput["value"] = result["global_items"] / step
    local = result["step_time_local"]
    base = baseline.get("throughput", {}).get("value") if isinstance(baseline, dict) else baseline
    speedup = throughput["value"] / base if base else None
    record["distributed"] = OrderedDict([
        ("world_size", node.world_size), ("nnodes", node.nnodes), ("nproc_per_node", node.nproc),
        ("per_replica_batch", per_replica), ("global_batch", global_size), ("scaling", scaling),
        ("engine", result.get("engine")), ("communication", result.get("communication")),
        ("bn_mode", node.bn_mode), ("sharding", "contiguous"),
        ("communication_share", max(0.0, 1.0 - local / step) if step else None),
        ("step_time_local", local),
        ("baseline_throughput", base), ("speedup", speedup),
        ("efficiency", speedup / node.world_size if speedup else None),
    ])
    return record


def train(model, backend, nproc=2, global_batch=None, steps=3, config="paper", seed=0,
          bn_mode="replica", device="cpu", rank_timeout=launch.RANK_TIMEOUT,
          step_timeout=launch.STEP_TIMEOUT, **overrides):
    """``steps`` data-parallel steps at ``global_batch`` (default: the config's batch x
    nproc); returns {"losses": the global loss of each step (sum_r w_r loss_r), "weights":
    rank 0's weights after them, "ranks": each rank's own losses, gradient weight w_r and
    weights}."""
    node = _node(backend, nproc, 1, 0, None, None, None, bn_mode, device)
    per_replica, global_size, _ = _sizes(model, config, overrides, None, global_batch, nproc)
    overrides.pop("batch_size", None)
    folder = tempfile.mkdtemp(prefix="tbdzoo-train-")
    try:
        weights_path = os.path.join(folder, "weights-{rank}.npz")
        job = launch.make_job(model, backend, node, "train", per_replica, global_size, config,
                              seed, overrides, steps=steps, rank_timeout=rank_timeout,
                              step_timeout=step_timeout, weights_path=weights_path)
        results = launch.start(job).wait()
        ranks = [results[str(r)] for r in range(nproc)]
        for r, result in enumerate(ranks):
            result["weights"] = load_arrays(weights_path.format(rank=r))
        losses = [_weighted([r["losses"][i] for r in ranks], [r["gradient_weight"] for r in ranks])
                  for i in range(steps)]
        return {"losses": losses, "weights": ranks[0]["weights"], "ranks": ranks}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _weighted(values, weights):
    if isinstance(values[0], dict):
        return OrderedDict((k, sum(w * v[k] for v, w in zip(values, weights))) for k in values[0])
    return sum(w * v for v, w in zip(values, weights))
