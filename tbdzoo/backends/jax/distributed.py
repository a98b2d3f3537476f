"""JAX's engine for data-parallel training (docs/distributed.md): ``jax.distributed`` joins
the ranks (its coordination service on rank 0, at the master address and port), one device
per rank, and every update is one compiled program over the global mesh of those devices: a
``shard_map`` whose 'data' axis holds each rank's shard of the batch, where each replica's
gradient is weighted by w_r and summed (``psum``) before clipping and the optimizer. Gloo's
collectives between the processes on the CPU, NCCL's on GPUs. BatchNorm per replica: each
shard is normalised by its own statistics, and the running statistics are averaged over the
replicas in the same program, so every replica keeps the same variables."""
from . import framework  # noqa: F401  (first: JAX imported quietly, full float32 precision)

# isort: split
import contextlib
import functools
import os

import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ..common.engines import RANK_TIMEOUT_VARIABLE
from . import ops
from .model import Model, _values_of

ENGINE = "jax.distributed"
AXIS = "data"  # the mesh axis the batch is sharded along
AGREEMENT = "jax.experimental.multihost_utils.broadcast_one_to_all"


# -- launch side ---------------------------------------------------------------------------------
def communication(node):
    return "nccl" if node.device == "cuda" else "gloo"


def check(node):
    """Both BatchNorm modes run: ``replica`` (each shard's statistics) and ``sync`` (the
    global batch's, summed across the mesh inside the update, ops.statistics_across)."""


def rank_environment(world):
    """A CPU run keeps JAX off any GPU of the host; a GPU run gives each rank the GPU of its
    local rank (init's local_device_ids)."""
    return {"JAX_PLATFORMS": "cpu"} if world.node.device != "cuda" else {}


def helpers(node):
    return []


def rank_launcher(node, argv):
    return None


# -- rank side -----------------------------------------------------------------------------------
def init(world):
    """``jax.distributed.initialize`` with the rank tbdzoo's launcher gave this process."""
    node = world.node
    if node.device != "cuda":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    timeout = float(os.environ.get(RANK_TIMEOUT_VARIABLE, 0) or 0)
    options = {"heartbeat_timeout_seconds": max(10, int(timeout))} if timeout else {}
    jax.distributed.initialize(
        coordinator_address="{}:{}".format(node.master_addr, node.master_port),
        num_processes=world.size, process_id=world.rank,
        local_device_ids=[world.local_rank] if node.device == "cuda" else None, **options)
    if jax.device_count() != world.size or jax.local_device_count() != 1:
        raise RuntimeError("jax.distributed sees {} device(s), {} of them here; the run needs one "
                           "per rank ({})".format(jax.device_count(), jax.local_device_count(),
                                                  world.size))
    return world


def finalize(world):
    """A barrier first (no rank leaves while a peer still needs it), then the shutdown."""
    multihost_utils.sync_global_devices("tbdzoo finalize")
    jax.distributed.shutdown()


def agree(world, value):
    """Rank 0's ``value`` (a stop code, a small integer) on every rank."""
    return float(multihost_utils.broadcast_one_to_all(np.int32(value)))


def model_class():
    return DistributedModel


def global_mesh():
    """Every rank's device along the 'data' axis, in rank order."""
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    return Mesh(np.array(devices), (AXIS,))


class DistributedModel(Model):
    """The JAX model as one replica of ``world``: its variables are global arrays replicated
    over the mesh, and each update is the single-process update inside a ``shard_map``, with
    the gradients reduced across replicas in between. Inference (rank 0's evaluation) runs on
    this rank's own copy, with no collective."""

    def __init__(self, model_def, hparams, seed=0, device=None, world=None):
        self.world = world
        self.communicate = True
        self._mesh = global_mesh()
        self._replicated = NamedSharding(self._mesh, P())
        self._sharded = NamedSharding(self._mesh, P(AXIS))
        self._tracing = None  # (w_r, communicate) while an update is traced
        Model.__init__(self, model_def, hparams, seed, device=device)

    @property
    def jax_device(self):
        return jax.local_devices()[0]

    # -- global arrays ---------------------------------------------------------------------------
    def _replicate(self, value):
        """``value`` (the same on every rank) as a global array replicated over the mesh."""
        value = np.asarray(value)
        return jax.make_array_from_callback(value.shape, self._replicated, lambda index: value[index])

    def _to_global(self, local):
        """This rank's rows as its shard of the global batch (every rank holds as many)."""
        local = jax.device_put(local, self.jax_device)
        shape = (local.shape[0] * self.world.size,) + tuple(local.shape[1:])
        return jax.make_array_from_single_device_arrays(shape, self._sharded, [local])

    def _commit(self, *held):
        nnx.update(held, jax.tree.map(self._replicate, nnx.as_pure(nnx.state(held))))

    def _set_weights(self, weights):
        Model._set_weights(self, weights)
        self._commit(self.native)

    # -- the update ------------------------------------------------------------------------------
    def _reduce_gradients(self, grads):
        weight, communicate = self._tracing
        if not communicate:
            return grads
        return jax.tree.map(lambda g: jax.lax.psum(g * weight.astype(g.dtype), AXIS), grads)

    def _any_replica(self, flag):
        if not self._tracing[1]:
            return flag
        return jax.lax.psum(flag.astype(np.int32), AXIS) > 0

    def _bind(self, phase_index, *held):
        """The sharded update takes the model and the optimizer as any call does (it places
        them across the mesh), so it is bound plainly, without the held state."""
        key = ("update", phase_index)
        if key not in self._jitted:
            self._jitted[key] = self._compile_update(self._update_body(phase_index))
        step = self._jitted[key]
        bound = functools.partial(step, *held)
        bound.lower = functools.partial(step.lower, *held)
        return bound

    def _compile_update(self, update):
        owner = self

        def program(model, optimizer, batch, weight, lr, key, communicate):
            graphdef, state = nnx.split((model, optimizer))

            def replica(state, batch, weight, lr, key):
                m, opt = nnx.merge(graphdef, state)
                owner._tracing = (weight[0], communicate)
                shared = AXIS if communicate and owner.world.bn_mode == "sync" else None
                try:
                    key = jax.random.fold_in(key, jax.lax.axis_index(AXIS))  # own dropout masks
                    with ops.statistics_across(shared):
                        loss, bad = update(m, opt, batch, lr, key)
                finally:
                    owner._tracing = None
                if communicate:  # running statistics: the replicas' mean
                    statistics = nnx.as_pure(nnx.state(m, nnx.BatchStat))
                    nnx.update(m, jax.tree.map(lambda s: jax.lax.pmean(s, AXIS), statistics))
                return loss[None], bad, nnx.as_pure(nnx.state((m, opt)))

            loss, bad, state = jax.shard_map(
                replica, mesh=owner._mesh, in_specs=(P(), P(AXIS), P(AXIS), P(), P()),
                out_specs=(P(AXIS), P(), P()), check_vma=False)(state, batch, weight, lr, key)
            nnx.update((model, optimizer), state)
            return loss, bad

        compiled = nnx.jit(program, donate_argnums=(0, 1), static_argnums=(6,))

        def arguments(batch, lr, key):
            """The program's arguments after the model and optimizer: the shards as one global
            batch, this rank's gradient weight, and the replicated rate and key."""
            weight = np.array([self.world.gradient_weight], np.float32)
            return ({k: self._to_global(v) for k, v in batch.items()}, self._to_global(weight),
                    self._replicate(lr), self._replicate(key), bool(self.communicate))

        def step(model, optimizer, batch, lr, key):
            """The update on this rank's prepared shard; (its own loss, the flag)."""
            loss, bad = compiled(model, optimizer, *arguments(batch, lr, key))
            return loss.addressable_data(0)[0], bad.addressable_data(0)

        # measure_memory and measure_flops lower the update as they would a jitted one
        step.lower = lambda model, optimizer, batch, lr, key: compiled.lower(
            model, optimizer, *arguments(batch, lr, key))
        return step

    # -- this rank's own copy, for what takes no step --------------------------------------------
    @contextlib.contextmanager
    def _local_copy(self):
        graphdef, state = nnx.split(self.native)
        local = jax.tree.map(lambda a: a.addressable_data(0), state)
        shared, self.native = self.native, nnx.merge(graphdef, local)
        try:
            yield
        finally:
            self.native = shared

    def _replica_view(self):
        return self._local_copy()

    def _inference_function(self, names):
        """Through ``nnx.jit``: each call is on a new local copy of the replicated tree, which
        a held split would take for a changed tree and compile anew."""
        key = ("replica values",) + tuple(names)
        if key not in self._jitted:
            compiled = nnx.jit(_values_of(names))
            self._jitted[key] = lambda batch: compiled(self.native, batch)
        return self._jitted[key]

    def _predict(self, prepared):
        with self._local_copy():
            return Model._predict(self, prepared)

    def _values(self, prepared, names):
        with self._local_copy():
            return Model._values(self, prepared, names)

    def _loss_and_gradients(self, prepared):
        with self._local_copy():
            return Model._loss_and_gradients(self, prepared)

    def _program_gradients(self, prepared):
        with self._local_copy():
            return Model._program_gradients(self, prepared)
