"""MXNet's engine for data-parallel training (docs/distributed.md): the ``dist_sync`` kvstore.

tbdzoo starts the scheduler (node 0) and one server per node itself, because the wheel's own
launcher needs dmlc-core's tracker, which the wheel lacks; a process with ``DMLC_ROLE``
scheduler or server runs ps-lite's loop inside ``import mxnet``. Workers reduce gradients
through the kvstore only (one key per trainable parameter): the servers sum what the workers
push, so each pushes w_r g_r and applies the pulled sum, with tbdzoo's own optimizer
(tbdzoo/backends/mxnet/optimizers.py), not a server-side one. BatchNorm per replica only.
"""
from . import framework  # noqa: F401  (first: numpy.bool for mxnet 1.9.1, quiet import)

# isort: split
import sys

import mxnet as mx

from ...errors import UnsupportedOptionError
from ..common.engines import Helper
from .model import Model

ENGINE = "KVStore"
KVSTORE = "dist_sync"
_KVSTORE = []  # the one kvstore of this process, made by init()
# a helper process: the package's shim, then ``import mxnet``, which serves until stopped
HELPER_CODE = "import tbdzoo.backends.mxnet.framework"


# -- launch side ---------------------------------------------------------------------------------
def communication(node):
    return KVSTORE


def check(node):
    if node.bn_mode != "replica":
        raise UnsupportedOptionError(
            "--bn-mode {} is not available on MXNet's dist_sync kvstore: the kvstore reduces "
            "between steps and cannot all-reduce BatchNorm's moments inside the forward pass; "
            "use --bn-mode replica (or the torch or tensorflow backend)".format(node.bn_mode))


def _ps_environment(node, role):
    """ps-lite's variables: every process meets at the scheduler on the master address."""
    env = {"DMLC_ROLE": role, "DMLC_PS_ROOT_URI": node.master_addr,
           "DMLC_PS_ROOT_PORT": node.master_port, "DMLC_NUM_SERVER": node.nnodes,
           "DMLC_NUM_WORKER": node.world_size}
    if node.interface:
        env["DMLC_INTERFACE"] = node.interface
    return env


def rank_environment(world):
    env = _ps_environment(world.node, "worker")
    # each rank sees its own GPU only; none for a CPU run
    env["CUDA_VISIBLE_DEVICES"] = str(world.local_rank) if world.node.device == "cuda" else ""
    return env


def helpers(node):
    """The scheduler on node 0 and one server on every node."""
    roles = (["scheduler"] if node.node_rank == 0 else []) + ["server"]
    return [Helper("{}-{}".format(role, node.node_rank), [sys.executable, "-c", HELPER_CODE],
                   dict(_ps_environment(node, role), CUDA_VISIBLE_DEVICES=""))
            for role in roles]


def rank_launcher(node, argv):
    return None


# -- rank side -----------------------------------------------------------------------------------
def init(world):
    """Joins the kvstore; the scheduler assigns ranks, so shards follow ``kv.rank``."""
    kv = mx.kv.create(KVSTORE)
    if kv.num_workers != world.size:
        raise RuntimeError("the kvstore has {} workers, the run {}".format(kv.num_workers, world.size))
    _KVSTORE.append(kv)
    return world.with_rank(kv.rank)


def finalize(world):
    """A barrier across workers. The kvstore is not torn down here: a worker's teardown stops
    the servers, which a peer may still be leaving; the agent stops the helpers once every
    rank is done."""
    if _KVSTORE:
        _KVSTORE[-1]._barrier()  # the kvstore's only barrier in MXNet 1.9 (no public name)


AGREEMENT = "the kvstore's push-pull (the servers sum) of rank 0's value and zeros"
AGREE_KEY = 2 ** 30  # beyond every parameter's key
_AGREE_READY = []    # the kvstore whose agreement key is initialised


def agree(world, value):
    """Rank 0's ``value`` (a number) on every rank: each worker pushes it on rank 0 and 0
    elsewhere to one key of its own, and pulls the servers' sum."""
    kv = _KVSTORE[-1]
    if kv not in _AGREE_READY:  # every worker reaches its first agreement together
        kv.init(AGREE_KEY, mx.nd.zeros((1,), dtype="float64"))
        _AGREE_READY.append(kv)
    mine = mx.nd.array([float(value) if world.rank == 0 else 0.0], dtype="float64")
    out = mx.nd.zeros((1,), dtype="float64")
    kv.pushpull(AGREE_KEY, mine, out=out)
    return float(out.asnumpy()[0])


def model_class():
    return DistributedModel


class DistributedModel(Model):
    """The MXNet model as one replica of ``world``: before clipping and the update, every
    trainable parameter's gradient is pushed as w_r g_r and replaced by the pulled sum."""

    def __init__(self, model_def, hparams, seed=0, device=None, world=None):
        self.world = world
        self.communicate = True
        self.kv = _KVSTORE[-1]
        Model.__init__(self, model_def, hparams, seed, device=device)

    def _build(self, weights):
        Model._build(self, weights)
        names = self.trainable_names()
        self._keys = dict((name, key) for key, name in enumerate(names))
        # the servers keep one summed array per key; rank 0's value initialises it
        self.kv.init(list(range(len(names))), [mx.nd.zeros(p.shape) for p in self._trainable])

    def _reduce_gradients(self, params):
        if not self.communicate:
            return params
        weight = self.world.gradient_weight
        keys, grads = [], []
        for p in params:
            g = p.grad()
            g *= weight
            keys.append(self._keys[p.name])
            grads.append(g)
        # one call for every key; the engine runs it after the backward pass that wrote them
        self.kv.pushpull(keys, grads, out=grads)
        return params
