"""TensorFlow's engine for data-parallel training (docs/distributed.md):
MultiWorkerMirroredStrategy configured by TF_CONFIG, ring collectives on the CPU and NCCL on
GPUs, driving tbdzoo's own compiled step (Keras' fit is broken under this strategy in
TensorFlow 2.21). Gradients are all-reduced in the replica context before clipping."""
import functools
import json

import tensorflow as tf

from ...errors import UnsupportedOptionError
from .model import Model

ENGINE = "MultiWorkerMirroredStrategy"
_STRATEGY = []  # the one strategy of this process, made by init() before any TensorFlow op


# -- launch side ---------------------------------------------------------------------------------
def communication(node):
    return "nccl" if node.device == "cuda" else "ring"


def check(node):
    if node.bn_mode != "replica":
        raise UnsupportedOptionError(
            "--bn-mode {!r} is not available on backend tensorflow: tbdzoo's BatchNorm computes "
            "its own moments, which are not all-reduced yet; use --bn-mode replica"
            .format(node.bn_mode))


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
def init(world):
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


def model_class():
    return DistributedModel


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

    def _train_step_async(self, prepared, lr):
        self._sync_weight()
        return self._steps[self.communicate](prepared.native, tf.constant(lr, tf.float32))

    def _update(self, phase_index, native, lr):
        self._sync_weight()
        return self._phase_steps[self.communicate][phase_index](native, tf.constant(lr, tf.float32))

    def synchronize(self):
        """sync_devices needs every worker's eager context, which a multi-worker strategy's
        does not set up; reading a variable copies it to the host after the queued update
        that writes it (one op per compiled step) has run."""
        self._trainable[0].numpy()

    def _reduce_gradients(self, grads):
        if not self._reducing:
            return grads
        from .optimizers import dense
        context = tf.distribute.get_replica_context()
        weighted = [dense(g) * self._weight for g in grads]
        return context.all_reduce(tf.distribute.ReduceOp.SUM, weighted)
