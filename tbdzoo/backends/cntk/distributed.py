"""CNTK's engine for data-parallel training (docs/distributed.md):
``data_parallel_distributed_learner`` over MPI, every rank started by one ``mpiexec`` (Debian's
Open MPI, the library CNTK loads). The distributed learner sums the ranks' gradients before
its wrapped learner (tbdzoo's optimizer) sees them, so each rank's Trainer minimises
w_r x its shard's loss: the gradient it contributes is then w_r g_r, and the sum the global
batch's. BatchNorm per replica only. Valid Python 3.6: the CNTK environment runs it.
"""
from . import framework  # noqa: F401  (first: CNTK imported quietly)

# isort: split
import os
import shutil

import cntk as C
import numpy as np
from cntk.train.distributed import Communicator, data_parallel_distributed_learner

from ...errors import BackendUnavailableError, UnsupportedOptionError
from .model import Model

ENGINE = "data_parallel_distributed_learner"
LOCAL_RANK_VARIABLE = "OMPI_COMM_WORLD_LOCAL_RANK"
QUANTIZATION_BITS = 32  # exact gradients; 1-bit SGD is a feature of CNTK's GPU build
_COMMUNICATOR = []  # the distributed learners' communicator, for the final barrier


# -- launch side ---------------------------------------------------------------------------------
def communication(node):
    return "mpi"


def check(node):
    if node.bn_mode != "replica":
        raise UnsupportedOptionError(
            "--bn-mode {} is not available on CNTK's data_parallel_distributed_learner: it "
            "reduces gradients after the backward pass and cannot all-reduce BatchNorm's "
            "moments inside the forward pass; use --bn-mode replica (or the torch or "
            "tensorflow backend)".format(node.bn_mode))
    if node.nnodes > 1:
        raise UnsupportedOptionError(
            "CNTK's distributed runs start every rank with one mpiexec on this host, and "
            "tbdzoo supervises ranks on this host only; use --nnodes 1 (or the torch, "
            "tensorflow or mxnet backend across hosts)")
    if node.device != "cpu":
        raise UnsupportedOptionError("the CNTK backend runs on the CPU only here; use --device cpu")
    if shutil.which("mpiexec") is None:
        raise BackendUnavailableError(
            "CNTK's distributed runs need mpiexec, which is missing; install Debian's "
            "openmpi-bin (`make env-cntk` does, as root)")


def rank_environment(world):
    return {}  # mpiexec starts the ranks (rank_launcher); each reads OMPI_COMM_WORLD_*


def helpers(node):
    return []


def rank_launcher(node, argv):
    """One mpiexec for every rank of this host: oversubscribed (a rank per process, not per
    core) and unbound (the launcher sets the threads per rank)."""
    command = ["mpiexec", "-n", str(node.world_size), "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        command.append("--allow-run-as-root")
    if node.interface:
        command += ["--mca", "btl_tcp_if_include", node.interface,
                    "--mca", "oob_tcp_if_include", node.interface]
    return command + list(argv)


# -- rank side -----------------------------------------------------------------------------------
def init(world):
    """MPI assigns the ranks: shards follow Communicator.rank()."""
    size = Communicator.num_workers()
    if size != world.size:
        raise RuntimeError("MPI started {} ranks, the run needs {}".format(size, world.size))
    return world.with_rank(Communicator.rank())


def finalize(world):
    """A barrier through the distributed learners' communicator, then MPI's end."""
    if _COMMUNICATOR:
        _COMMUNICATOR[0].barrier()
    del _COMMUNICATOR[:]
    Communicator.finalize()


def model_class():
    return DistributedModel


class DistributedModel(Model):
    """The CNTK model as one replica of ``world``. Every Trainer the backend builds (one, or
    one per phase of a training program) minimises w_r x its loss through a
    data_parallel_distributed_learner around its learner; a second Trainer over the same
    learner and loss, unscaled, takes the steps without communication."""

    def __init__(self, model_def, hparams, seed=0, device=None, world=None):
        self.world = world
        self.communicate = True
        self._weight = C.constant(world.gradient_weight, shape=(), dtype=np.float32)
        self._weight_value = world.gradient_weight
        self._local = []  # the Trainers without communication, in the order they were built
        Model.__init__(self, model_def, hparams, seed, device=device)

    def _reduce_gradients(self, trainer_arguments):
        """(model, (loss, metric), learners) of a Trainer -> the distributed Trainer's: the
        model also outputs the unscaled loss (the step reports it), the loss is w_r x it,
        and each learner is wrapped in the distributed learner."""
        model, (loss, metric), learners = trainer_arguments
        self._local.append(C.Trainer(model, (loss, metric), learners))
        outputs = list(model.outputs)
        if loss.output.uid not in set(o.uid for o in outputs):
            outputs.append(loss.output)
        wrapped = [data_parallel_distributed_learner(l, num_quantization_bits=QUANTIZATION_BITS)
                   for l in learners]
        if wrapped and not _COMMUNICATOR:
            _COMMUNICATOR.append(wrapped[0].communicator())
        return C.combine(outputs), (loss * self._weight, metric), wrapped

    def _sync_weight(self):
        if self._weight_value != self.world.gradient_weight:
            self._weight_value = self.world.gradient_weight
            self._weight.value = np.array(self._weight_value, np.float32)

    def _train_step(self, prepared, lr):
        self._sync_weight()
        if self.communicate:
            return Model._train_step(self, prepared, lr)
        distributed, self._trainer = self._trainer, self._local[0]
        try:
            return Model._train_step(self, prepared, lr)
        finally:
            self._trainer = distributed

    def _update(self, phase_index, native, lr):
        self._sync_weight()
        if self.communicate:
            return Model._update(self, phase_index, native, lr)
        distributed, self._trainers = self._trainers, self._local
        try:
            return Model._update(self, phase_index, native, lr)
        finally:
            self._trainers = distributed
