"""TensorFlow's engine for data-parallel training (docs/distributed.md):
MultiWorkerMirroredStrategy configured by TF_CONFIG, ring collectives on the CPU and NCCL on
GPUs, driving tbdzoo's own compiled step (Keras' fit is broken under this strategy in
TensorFlow 2.21). Gradients are all-reduced in the replica context before clipping; BatchNorm
per replica, or synchronised over the global batch (--bn-mode sync)."""
from . import framework  # noqa: F401  (first: TensorFlow imported as the backend needs it)

# isort: split
import functools
import json
import os

import tensorflow as tf

from ..common.engines import RANK_TIMEOUT_VARIABLE
from . import (
    ops,
)
from .adapters import CANONICAL, NHWC
from .adapters import to_layout as _to
from .model import Model
from .optimizers import dense

ENGINE = "MultiWorkerMirroredStrategy"
_STRATEGY = []  # the one strategy of this process, made by init() before any TensorFlow op


# -- launch side ---------------------------------------------------------------------------------
def communication(node):
    return "nccl" if node.device == "cuda" else "ring"


def check(node):
    """Both BatchNorm modes run here (world.BN_MODES)."""


def worker_address(node, rank):
    """The worker of rank r listens on master port + 1 + r on its node's host."""
    return "{}:{}".format(node.host_of(rank // node.nproc), node.master_port + 1 + rank)


def rank_environment(world):
    node = world.node
    cluster = {"worker": [worker_address(node, r) for r in range(world.size)]}
    env = {"TF_CONFIG": json.dumps({"cluster": cluster,
                                    "task": {"type": "worker", "index": world.rank}}),
           # each rank sees its own GPU only; none for a CPU run
           "CUDA_VISIBLE_DEVICES": str(world.local_rank) if node.device == "cuda" else ""}
    return env


def helpers(node):
    return []


def rank_launcher(node, argv):
    return None


# -- rank side -----------------------------------------------------------------------------------
def _configure_coordination(world):
    """The coordination service the strategy would start, but with --rank-timeout as its
    heartbeat timeout: its default (10 s) gives up on a worker that a busy host starves of CPU
    for that long, so a run would fail before the timeout tbdzoo states."""
    from tensorflow.python.distribute.collective_all_reduce_strategy import (
        coordination_config_pb2,  # the module the strategy itself configures it with
    )
    from tensorflow.python.eager import context
    seconds = float(os.environ.get(RANK_TIMEOUT_VARIABLE, 0) or 0)
    if not seconds or context.context().coordination_service is not None:
        return
    context.context().configure_coordination_service(
        service_type="standalone", service_leader="/job:worker/replica:0/task:0",
        heartbeat_timeout_in_ms=int(seconds * 1000),
        coordinated_jobs=[coordination_config_pb2.CoordinatedJob(name="worker",
                                                                 num_tasks=world.size)])


def init(world):
    _configure_coordination(world)
    implementation = (tf.distribute.experimental.CommunicationImplementation.NCCL
                      if world.node.device == "cuda" else
                      tf.distribute.experimental.CommunicationImplementation.RING)
    options = tf.distribute.experimental.CommunicationOptions(implementation=implementation)
    _STRATEGY.append(tf.distribute.MultiWorkerMirroredStrategy(communication_options=options))
    return world


def finalize(world):
    """A barrier (a one-number all-reduce) first: worker 0 runs the coordination service the
    others need until they are done."""
    if _STRATEGY:
        strategy = _STRATEGY[-1]
        strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.constant(1.0)),
                        axis=None)
    del _STRATEGY[:]


AGREEMENT = "the strategy's all-reduce (SUM) of rank 0's value and zeros"


def agree(world, value):
    """Rank 0's ``value`` (a number) on every rank: each worker contributes it on rank 0 and
    0 elsewhere to one all-reduce (the strategy has no broadcast of its own)."""
    strategy = _STRATEGY[-1]
    mine = float(value) if world.rank == 0 else 0.0
    total = strategy.reduce(tf.distribute.ReduceOp.SUM,
                            strategy.run(lambda: tf.constant(mine, tf.float64)), axis=None)
    return float(total.numpy())


def model_class():
    return DistributedModel


def _sync_moments(x, context):
    """Per-channel mean and biased variance of an NHWC ``x`` over every replica's batch, in
    two passes, and the global count; the replica context's all-reduce is differentiable."""
    count = tf.cast(tf.reduce_prod(tf.shape(x)[:-1]), x.dtype)
    total = context.all_reduce(tf.distribute.ReduceOp.SUM,
                               tf.concat([tf.reduce_sum(x, [0, 1, 2]), count[None]], 0))
    n = total[-1]
    mean = total[:-1] / n
    squares = context.all_reduce(tf.distribute.ReduceOp.SUM,
                                 tf.reduce_sum(tf.square(x - mean), [0, 1, 2]))
    return mean, squares / n, n


def _sync_batchnorm_nhwc(x, gamma, beta, running_mean, running_var, a, training, update):
    context = tf.distribute.get_replica_context()
    if (not training and running_mean is not None) or context is None:
        return ops.batchnorm(x, gamma, beta, running_mean, running_var, a, training, update)
    mean, var, n = _sync_moments(x, context)
    if update and running_mean is not None:
        m = a["momentum"]
        running_mean.assign((1.0 - m) * running_mean + m * tf.stop_gradient(mean))
        running_var.assign((1.0 - m) * running_var + m * tf.stop_gradient(var * n / (n - 1.0)))
    return (x - mean) * (gamma * tf.math.rsqrt(var + a["eps"])) + beta


def sync_batchnorm(args, p, a, training, update):
    """The native model's batchnorm adapter with the global batch's statistics (--bn-mode sync)."""
    stats = (p["gamma"], p["beta"], p.get("running_mean"), p.get("running_var"), a, training,
             update)
    tensor = args[0][0]
    if tensor.shape.rank == 4:
        return _sync_batchnorm_nhwc(_to(args[0], NHWC), *stats)
    rank = tensor.shape.rank  # channels are canonical axis 1: as The native model's own adapter
    moved = tf.transpose(tensor, [0] + list(range(2, rank)) + [1]) if rank > 2 else tensor
    shape = tf.shape(moved)
    y = _sync_batchnorm_nhwc(tf.reshape(moved, [shape[0], 1, -1, int(tensor.shape[1])]), *stats)
    y = tf.reshape(y, shape)
    return tf.transpose(y, [0, rank - 1] + list(range(1, rank - 1))) if rank > 2 else y


def sync_sequence_batchnorm(args, p, a, training, update):
    """The native model's sequence_batchnorm adapter with the statistics of every replica's valid
    steps (--bn-mode sync): the masked sums and the count of valid positions are all-reduced,
    the mean first, then the squared deviations from it. Padded positions give 0."""
    context = tf.distribute.get_replica_context()
    running_mean, running_var = p.get("running_mean"), p.get("running_var")
    if (not training and running_mean is not None) or context is None:
        return ops.sequence_batchnorm(_to(args[0], CANONICAL), args[1][0], p["gamma"], p["beta"],
                                      running_mean, running_var, a, training, update)
    x = _to(args[0], CANONICAL)
    mask = tf.sequence_mask(args[1][0], int(x.shape[1]), dtype=x.dtype)[:, :, None]
    total = context.all_reduce(tf.distribute.ReduceOp.SUM, tf.concat(
        [tf.reduce_sum(x * mask, axis=[0, 1]), tf.reduce_sum(mask)[None]], 0))
    n = total[-1]
    mean = total[:-1] / n
    var = context.all_reduce(tf.distribute.ReduceOp.SUM,
                             tf.reduce_sum(tf.square((x - mean) * mask), axis=[0, 1])) / n
    if update and running_mean is not None:
        m = a["momentum"]
        unbiased = var * n / tf.maximum(n - 1.0, 1.0)
        running_mean.assign((1.0 - m) * running_mean + m * tf.stop_gradient(mean))
        running_var.assign((1.0 - m) * running_var + m * tf.stop_gradient(unbiased))
    y = (x - mean) * (p["gamma"] * tf.math.rsqrt(var + a["eps"])) + p["beta"]
    return y * mask


class DistributedModel(Model):
    """The TensorFlow model as one replica of ``world``: variables made in the strategy's
    scope, every step run by ``strategy.run`` in a compiled function, and gradients summed
    across replicas, each weighted by its w_r, before clipping and the update."""

    def __init__(self, model_def, hparams, seed=0, device=None, world=None):
        self.world = world
        self.communicate = True
        self.strategy = _STRATEGY[-1]
        self._reducing = True
        Model.__init__(self, model_def, hparams, seed, device=device)

    def _build(self, weights):
        with self.strategy.scope():
            Model._build(self, weights)
        if self.world.bn_mode == "sync":  # before any step is traced
            self.net.set_adapters(batchnorm=sync_batchnorm,
                                  sequence_batchnorm=sync_sequence_batchnorm)
        # this rank's w_r, read by the compiled step; a plain variable: it differs per rank
        self._weight = tf.Variable(self.world.gradient_weight, trainable=False, dtype=tf.float32)
        if self.program is None:
            self._steps = {c: self._replicated(self._train, c) for c in (True, False)}
        else:
            self._phase_steps = {c: [self._replicated(functools.partial(self._phase_update, i), c)
                                     for i in range(len(self.program.phases))]
                                 for c in (True, False)}

    def _replicated(self, fn, communicate):
        """``fn`` run by the strategy in one compiled function; ``communicate`` is read while
        it is traced (it decides whether _reduce_gradients emits the all-reduce)."""
        strategy = self.strategy

        def step(*args):
            self._reducing = communicate
            try:
                out = strategy.run(fn, args=args)
            finally:
                self._reducing = True
            return strategy.experimental_local_results(out)[0]
        jit = self.hparams["execution"] == "compiled"
        return tf.function(step, jit_compile=jit, autograph=False)

    def _sync_weight(self):
        if float(self._weight.numpy()) != self.world.gradient_weight:
            self._weight.assign(self.world.gradient_weight)

    def _train_call(self, prepared, lr):
        self._sync_weight()
        return self._steps[self.communicate](prepared.native, tf.constant(lr, tf.float32))

    def _update_call(self, phase_index, native, lr):
        self._sync_weight()
        return self._phase_steps[self.communicate][phase_index](native, tf.constant(lr, tf.float32))

    def synchronize(self):
        """sync_devices needs every worker's eager context, which a multi-worker strategy's
        does not set up; reading a variable copies it to the host after the queued update
        that writes it (one op per compiled step) has run."""
        self._trainable[0].numpy()
        self._raise_deferred()

    def _reduce_gradients(self, grads):
        if not self._reducing:
            return grads
        context = tf.distribute.get_replica_context()
        weighted = [dense(g) * self._weight for g in grads]
        return context.all_reduce(tf.distribute.ReduceOp.SUM, weighted)
