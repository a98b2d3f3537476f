"""The record's "data" part of a data-parallel data-fed run (``tbd run --data DIR --nproc N``):
every rank trained from its own share of the folder through its framework's pipeline; this
sums what the ranks measured into the global figures (docs/distributed.md, "Data-fed runs").
Valid Python 3.6."""
from collections import OrderedDict

from ..pipelines.measure import INPUT_BOUND_WAIT

SHARDING = ("each rank reads its share of every epoch: positions r, r + W, ... of the seeded "
            "permutation (tbdzoo/pipelines/order.py)")


def global_data_fed(results, node, synthetic_throughput=None):
    """Rank 0's "data" part with the throughput summed over the ranks (global items per
    second), the input wait of the rank that waited longest, and the CPU of every rank's
    process tree; each rank's own figures under ``per_rank``."""
    ranks = [results[k]["data"] for k in sorted(results, key=int)]
    fed = OrderedDict((k, v) for k, v in ranks[0].items() if k not in ("rank", "share_examples"))
    complete = len(ranks) == node.world_size
    per_rank_items = fed["throughput"]["items_per_step"]
    throughput = OrderedDict(fed["throughput"])
    if complete:
        throughput["value"] = sum(r["throughput"]["value"] for r in ranks)
        throughput["summed_over"] = "every rank"
    else:  # several nodes: this node sees only its own ranks' results
        throughput["value"] = fed["throughput"]["value"] * node.world_size
        throughput["summed_over"] = "rank 0 x world size (the other nodes' ranks are theirs)"
    throughput["items_per_step"] = per_rank_items * node.world_size
    fed["throughput"] = throughput
    fed["input_wait_fraction"] = max(r["input_wait_fraction"] for r in ranks)
    cpus = [r["cpu"] for r in ranks if r.get("cpu")]
    if cpus:
        cpu = OrderedDict(cpus[0])
        busy = sum(c["process_tree_cores_busy"] for c in cpus)
        cpu["process_tree_cores_busy"] = busy
        cpu["process_tree_utilization"] = busy / cpu["cores"]
        cpu["process_trees"] = len(cpus)
        fed["cpu"] = cpu
    fed["vs_synthetic"] = throughput["value"] / synthetic_throughput \
        if synthetic_throughput else None
    fed["input_bound"] = fed["input_wait_fraction"] > INPUT_BOUND_WAIT
    fed["world_size"] = node.world_size
    fed["per_replica_batch"] = per_rank_items
    fed["sharding"] = SHARDING
    fed["per_rank"] = [OrderedDict([
        ("rank", int(k)), ("throughput", r["throughput"]["value"]),
        ("step_time_median", r["step_time"]["median"]),
        ("input_wait_fraction", r["input_wait_fraction"]),
        ("share_examples", r.get("share_examples")),
        ("process_tree_cores_busy", (r.get("cpu") or {}).get("process_tree_cores_busy"))])
        for k, r in zip(sorted(results, key=int), ranks)]
    return fed
