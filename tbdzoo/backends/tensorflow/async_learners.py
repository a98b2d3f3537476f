"""TensorFlow: threads on one shared model (docs/a3c.md).

The shared model's ``tf.Variable`` set is the shared parameters, and one slot variable per
parameter holds the shared RMSProp's square average. Each learner thread has its own
environment and its own copy (a model of its own, built before the threads start, since
Keras names layers from one global counter); before each rollout one compiled function assigns
the shared variables to the copy, the copy's compiled gradient function runs, and the
learner's compiled update clips the gradients to the global norm and applies the backend's
RMSProp to the shared variables and slots. Nothing is locked: TensorFlow runs each call's
kernels outside the GIL, so the threads overlap in them.
"""
from . import framework  # noqa: F401  (first: TensorFlow imported as the backend needs it)

# isort: split
import functools
import time

import numpy as np
import tensorflow as tf

from ...rl.async_learners.common import Counters, cpu_seconds, make_envs, predictor, run_in_threads, run_learner
from ...rl.record import RunResult
from .optimizers import RMSProp


class SharedRMSprop:
    """The backend's RMSProp (tbdzoo/backends/tensorflow/optimizers.py) without momentum,
    centring or decay, v = alpha v + (1 - alpha) g^2, w -= lr g / sqrt(v + eps) after
    global-norm clipping: one per learner thread, all over the shared variables and one set of
    square averages (``slots``), each with its own momentum buffer (so no thread applies
    another's step); each learner's update is one ``tf.function``. ``updates[i]`` counts
    learner i's steps."""

    def __init__(self, variables, settings, learners):
        self.variables, self.settings = list(variables), settings
        spec = {"alpha": settings.alpha, "eps": settings.eps, "momentum": 0.0,
                "centered": False, "weight_decay": 0.0}
        first = RMSProp(self.variables, spec)
        self.slots = first.square
        optimizers = [first] + [RMSProp(self.variables, spec, square=self.slots)
                                for _ in range(learners - 1)]
        self._apply = [tf.function(functools.partial(self._update, o)) for o in optimizers]
        self.updates = np.zeros(learners, np.int64)

    def _update(self, optimizer, grads, lr):
        if self.settings.clip:
            grads, _ = tf.clip_by_global_norm(grads, self.settings.clip)
        optimizer.apply(grads, lr)

    def step(self, learner, grads, lr):
        self._apply[learner](list(grads), tf.constant(lr, tf.float32))
        self.updates[learner] += 1


def train(job):
    shared = job.build_native(device="cpu")
    names = shared._group_names["all"]
    variables = shared._group_variables["all"]
    optimizer = SharedRMSprop(variables, job.settings, job.learners)
    initial = shared.get_weights()
    copies = [_Copy(job.build_native(device="cpu"), variables) for _ in range(job.learners)]
    counters = Counters(np.zeros(job.learners), np.zeros(job.learners), np.zeros(job.learners))
    reports = [None] * job.learners

    def learner(index, barrier):
        copy = copies[index]
        envs = make_envs(job.env_id, job.seed, index, job.window)
        barrier.wait()
        start, cpu = time.monotonic(), cpu_seconds(thread=True)

        def learn(batch, lr):
            (_, native), = copy.model.prepare_batch(batch).native
            _, grads = copy.gradients(native)
            optimizer.step(index, grads, lr)
        returns = run_learner(index, predictor(copy.model), copy.sync, learn, envs,
                              job.settings, counters, job.stop, start,
                              np.random.default_rng(job.seed + index))
        reports[index] = (returns, cpu_seconds(thread=True) - cpu)
        envs.close()
    start = run_in_threads(job.learners, learner)
    result = RunResult(job.env_id, backend="tensorflow", learners=job.learners, how=
                         "{} threads on one shared model".format(job.learners))
    for returns, _ in reports:
        result.episode_returns.extend(returns)
    result.finish(counters, start, [r[1] for r in reports])
    result.initial_weights, result.weights = initial, shared.get_weights()
    result.square_averages = dict((n, shared.net.to_canonical(n, v.numpy()))
                                  for n, v in zip(names, optimizer.slots))
    result.optimizer_updates = [int(u) for u in optimizer.updates]
    return result


class _Copy:
    """A learner's own model, with a compiled copy of the shared variables into it."""

    def __init__(self, model, shared_variables):
        self.model = model
        self.gradients = model._gradient_fns[0]
        mine = model._group_variables["all"]

        @tf.function
        def sync():
            for m, s in zip(mine, shared_variables):
                m.assign(s)
        self._sync = sync

    def sync(self):
        self._sync()
