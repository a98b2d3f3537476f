"""Who a process is in a data-parallel run, and which rows of the global batch it trains on.

A ``Node`` is what one host's agent knows (docs/distributed.md); ``node.world(local_rank)``
is one rank's ``World``. Both travel as JSON (the launcher writes them, the agent and ranks
read them) and neither imports a framework. Valid Python 3.6: the CNTK ranks import it.
"""
import json
import os
from collections import OrderedDict

import numpy as np

from ..backends.programs import rows_per_input, split_step_batch
from ..errors import UnsupportedOptionError

BN_MODES = ("replica", "sync")
ENVIRONMENT_VARIABLE = "TBDZOO_WORLD"  # a rank's World, as JSON


class Node:
    """One host of the run: ``nproc`` ranks, node ``node_rank`` of ``nnodes``."""

    FIELDS = ("backend", "nnodes", "node_rank", "nproc", "master_addr", "master_port", "hosts",
              "interface", "bn_mode", "device")

    def __init__(self, backend, nproc=1, nnodes=1, node_rank=0, master_addr="127.0.0.1",
                 master_port=None, hosts=None, interface=None, bn_mode="replica", device="cpu"):
        self.backend, self.nproc, self.nnodes, self.node_rank = backend, nproc, nnodes, node_rank
        self.master_addr, self.master_port = master_addr, master_port
        self.hosts = list(hosts) if hosts else None
        self.interface = interface if interface is not None else ("lo" if nnodes == 1 else None)
        self.bn_mode, self.device = bn_mode, device
        check(self)

    @property
    def world_size(self):
        return self.nproc * self.nnodes

    def world(self, local_rank):
        return World(self, self.node_rank * self.nproc + local_rank, local_rank)

    def host_of(self, node_rank):
        """The address of node ``node_rank``: from ``hosts``, or this host for one node."""
        if self.hosts:
            return self.hosts[node_rank]
        if self.nnodes == 1:
            return self.master_addr
        raise ValueError("the address of every node is needed here: give --hosts h0,h1,... "
                         "in node-rank order")

    def to_dict(self):
        return OrderedDict((k, getattr(self, k)) for k in self.FIELDS)

    @classmethod
    def from_dict(cls, d):
        return cls(**{k: d[k] for k in cls.FIELDS if k in d})


class World:
    """One rank: its place in the world, the node it runs on, and the weight of its gradient
    for the batch it trains on (``gradient_weight``, set per batch: see ``shard``)."""

    def __init__(self, node, rank, local_rank):
        self.node, self.rank, self.local_rank = node, rank, local_rank
        self.gradient_weight = 1.0 / node.world_size

    @property
    def size(self):
        return self.node.world_size

    @property
    def bn_mode(self):
        return self.node.bn_mode

    @property
    def device(self):
        """'cpu', or 'cuda:<local rank>' when the node runs on GPUs."""
        return "cuda:{}".format(self.local_rank) if self.node.device == "cuda" else "cpu"

    def to_json(self):
        return json.dumps({"node": self.node.to_dict(), "rank": self.rank,
                           "local_rank": self.local_rank})

    @classmethod
    def from_json(cls, text):
        d = json.loads(text)
        return cls(Node.from_dict(d["node"]), d["rank"], d["local_rank"])

    @classmethod
    def from_environment(cls):
        text = os.environ.get(ENVIRONMENT_VARIABLE)
        if not text:
            raise RuntimeError("{} is not set: this process was not started by tbdzoo's launcher"
                               .format(ENVIRONMENT_VARIABLE))
        return cls.from_json(text)

    def with_rank(self, rank):
        """The same world with the rank the engine assigned (MXNet's scheduler, MPI)."""
        return World(self.node, rank, self.local_rank)

    def __repr__(self):
        return "<World rank {} of {} (local {}, node {} of {})>".format(
            self.rank, self.size, self.local_rank, self.node.node_rank, self.node.nnodes)


def check(node):
    if node.nproc < 1 or node.nnodes < 1:
        raise ValueError("--nproc and --nnodes must be at least 1")
    if not 0 <= node.node_rank < node.nnodes:
        raise ValueError("--node-rank {} is outside 0..{} (--nnodes {})".format(
            node.node_rank, node.nnodes - 1, node.nnodes))
    if node.hosts is not None and len(node.hosts) != node.nnodes:
        raise ValueError("--hosts lists {} hosts for --nnodes {}; list one per node".format(
            len(node.hosts), node.nnodes))
    if node.bn_mode not in BN_MODES:
        raise UnsupportedOptionError("--bn-mode {!r} is not a BatchNorm mode; the modes are {}"
                                     .format(node.bn_mode, ", ".join(BN_MODES)))


# -- batches ------------------------------------------------------------------------------------
def batch_sizes(world_size, per_replica=None, global_batch=None):
    """(per-replica batch, global batch, scaling): weak scaling multiplies the per-replica
    batch by the world size; strong scaling divides a fixed global batch."""
    if global_batch is None:
        return per_replica, per_replica * world_size, "weak"
    if global_batch % world_size:
        raise ValueError("--global-batch {} does not divide among {} processes; give a multiple "
                         "of {}".format(global_batch, world_size, world_size))
    return global_batch // world_size, global_batch, "strong"


def shard_rows(global_rows, rank, size):
    """The contiguous slice rank ``rank`` of ``size`` takes of ``global_rows`` rows."""
    per = global_rows // size
    return slice(rank * per, (rank + 1) * per)


def shard(spec, batch, rank, size):
    """Rank ``rank``'s part of a global NumPy batch: a contiguous slice of every update's
    examples (a training program's step stacks several updates' batches per input)."""
    if spec.program is None:
        rows = len(next(iter(batch.values())))
        return OrderedDict((k, np.asarray(v)[shard_rows(rows, rank, size)]) for k, v in batch.items())
    uses = rows_per_input(spec, spec.program)
    _, per_update = split_step_batch(spec, spec.program, batch)
    part = shard_rows(per_update, rank, size)
    out = OrderedDict()
    for name, value in batch.items():
        value = np.asarray(value)
        blocks = value.reshape((uses[name], per_update) + value.shape[1:])[:, part]
        out[name] = blocks.reshape((-1,) + value.shape[1:])
    return out


def counted(spec, batch):
    """What the loss averages over in ``batch``: non-ignored labels for a loss with an
    ``ignore_index``, else examples (of one update, for a training program)."""
    if spec.program is not None:
        updates, examples = split_step_batch(spec, spec.program, batch)
        labels = _ignored_labels(spec.program)
        if labels is None or len(updates) != 1:
            return examples
        name, ignore = labels
        return int((np.asarray(updates[0][1][name]) != ignore).sum())
    loss = spec.loss
    labels = np.asarray(batch[loss["labels"]])
    ignore = loss.get("ignore_index")
    if ignore is None:
        return len(labels)
    return int((labels != ignore).sum())


def _ignored_labels(program):
    """(labels input, ignored id) when every loss of the program averages over the same
    labels' non-ignored entries (Seq2Seq's padded targets), else None: the losses then
    average over examples."""
    keys = set()
    for loss in program.losses.values():
        keys.add((loss["inputs"].get("labels"), loss["attrs"].get("ignore_index")))
    if len(keys) != 1:
        return None
    name, ignore = keys.pop()
    return None if name is None or ignore is None else (name, ignore)


def gradient_weight(spec, global_batch, rank, size):
    """w_r = n_r / n: the weight that makes the reduced gradient the global batch's."""
    total = counted(spec, global_batch)
    return float(counted(spec, shard(spec, global_batch, rank, size))) / total
