"""What every backend's asynchronous learners share: the settings read from the a3c config,
the learner count check, the per-learner counters, one learner's loop, the NumPy shared
RMSProp and CPU accounting (docs/a3c.md; the result: tbdzoo/rl/record.py).

A learner repeats: copy the shared parameters into its own copy, act ``t_max`` steps in its
own environment, compute the n-step returns in NumPy (tbdzoo.models.a3c.rollouts.update_batch), take
the gradients on its copy and apply them to the shared parameters through the shared RMSProp,
without locks (Mnih et al. 2016, Algorithm S3). The learning rate anneals linearly to 0 with
the frames all learners have taken together.
"""
import contextlib
import math
import threading
import time
from collections import OrderedDict

import numpy as np

from ...backends.base import check_buildable
from ...errors import HyperparameterError
from ...models import get_model
from ...models.a3c import NAME as A3C
from ...models.a3c import environments
from ...models.a3c.rollouts import observations_feed, sample_actions, split_output, update_batch
from ...spec.init import initial_weights as spec_weights
from ..a2c import check_environment


def check_learners(learners):
    """Raise HyperparameterError unless ``learners`` is an integer >= 1."""
    if isinstance(learners, bool) or not isinstance(learners, (int, np.integer)) or learners < 1:
        raise HyperparameterError(
            "learners={!r}: asynchronous A3C needs at least one actor-learner; fix: learners >= 1 "
            "(the paper: 16)".format(learners))
    return int(learners)


class Settings:
    """The update's hyperparameters, the same on every backend: t_max, gamma, reward clip,
    the shared RMSProp's alpha and epsilon (inside the root, docs/optimizers.md), the initial
    learning rate, the global-norm clip and the frames over which the rate anneals to 0."""

    def __init__(self, hp, learners, frames_per_step):
        self.learners = check_learners(learners)
        self.t_max, self.gamma, self.reward_clip = hp["t_max"], hp["gamma"], hp["reward_clip"]
        self.num_actions = hp["num_actions"]
        self.lr, self.alpha, self.eps = float(hp["lr"]), float(hp["alpha"]), float(hp["eps"])
        self.clip = float(hp["grad_clip_norm"] or 0.0)
        # The config anneals over ``anneal_steps`` synchronous updates of learners x t_max
        # agent steps; the same number of frames here, counted over all learners.
        self.anneal_frames = int(hp["anneal_steps"]) * hp["learners"] * hp["t_max"] * \
            frames_per_step
        self.linear = hp["lr_schedule"] == "linear"

    def learning_rate(self, frames):
        if not self.linear:
            return self.lr
        return self.lr * max(0.0, 1.0 - float(frames) / self.anneal_frames)


def clip_scale(grads, clip):
    """The factor that scales ``grads`` (NumPy arrays) to global norm ``clip`` at most."""
    if not clip:
        return 1.0
    norm = math.sqrt(sum(float(np.vdot(g, g)) for g in grads))
    return min(1.0, clip / (norm + 1e-6))


class NumpyRMSProp:
    """RMSProp over NumPy arrays that every learner updates in place, without a lock:
    v = alpha v + (1 - alpha) g^2, w -= lr g / sqrt(v + eps). ``params`` and
    ``square_averages`` map names to the shared arrays (views of shared memory across
    processes, plain arrays across threads); ``updates[i]`` counts learner i's steps."""

    def __init__(self, params, square_averages, updates, settings):
        self.params, self.square_averages = params, square_averages
        self.updates, self.settings = updates, settings

    def step(self, learner, grads, lr):
        s = self.settings
        scale = clip_scale(list(grads.values()), s.clip)
        for name, g in grads.items():
            g = np.asarray(g, np.float32)
            if scale != 1.0:
                g = g * np.float32(scale)
            v = self.square_averages[name]
            v *= s.alpha
            v += (1.0 - s.alpha) * g * g
            self.params[name] -= lr * g / np.sqrt(v + s.eps)
        self.updates[learner] += 1

    def record_state(self, result):
        """The shared state as the run ends, copied into ``result`` (a RunResult): the weights,
        the square averages and each learner's count of updates."""
        result.weights = dict((n, v.copy()) for n, v in self.params.items())
        result.square_averages = dict((n, v.copy()) for n, v in self.square_averages.items())
        result.optimizer_updates = [int(u) for u in self.updates]


class Counters:
    """Each learner's frames and updates in its own slot (so no increment is lost without a
    lock), the time all learners start from and their own finishing times."""

    def __init__(self, frames, updates, finished):
        self.frames, self.updates, self.finished = frames, updates, finished

    def total_frames(self):
        return int(np.sum(self.frames))


def cpu_seconds(thread=False, pid=None):
    """User + system CPU seconds of this process (all its threads), of this thread only
    (``thread=True``: psutil's per-thread times, matched by native id) or of process ``pid``."""
    import psutil
    if thread:
        ident = threading.get_native_id()
        for t in psutil.Process().threads():
            if t.id == ident:
                return t.user_time + t.system_time
        return float("nan")
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def learner_error(index, error):
    """The error a learner's failure is raised as in the parent, naming the learner."""
    return RuntimeError("learner {}: {}: {}".format(index, type(error).__name__, error))


@contextlib.contextmanager
def reported_to_parent(index, barrier, queue):
    """In a learner process: a failure breaks the barrier (no learner waits for this one) and
    goes to the parent on ``queue``, which raises it (``run_processes``)."""
    try:
        yield
    except BaseException as e:
        barrier.abort()
        queue.put(learner_error(index, e))
        raise


def learn_in_process(job, index, predict, sync, learn, envs, counters, barrier, queue):
    """A learner process's run once its copy is ready: released with the others, it learns
    until ``job.stop`` and reports (index, episode returns, its CPU seconds) on ``queue``."""
    barrier.wait(timeout=600)
    start, cpu = time.monotonic(), cpu_seconds()
    returns = run_learner(index, predict, sync, learn, envs, job.settings, counters, job.stop,
                          start, np.random.default_rng(job.seed + index))
    queue.put((index, returns, cpu_seconds() - cpu))
    envs.close()


def run_in_threads(learners, learner):
    """Run ``learner(index, barrier)`` in one thread per learner; each waits on ``barrier``
    when ready, and all are released together. Returns that common start time once every
    thread has finished; the first learner's error is raised (a failing learner breaks the
    barrier, so no thread waits for it forever)."""
    barrier = threading.Barrier(learners + 1)
    errors = []

    def body(index):
        try:
            learner(index, barrier)
        except BaseException as e:  # noqa: BLE001  (handed to the main thread, which raises it)
            errors.append(learner_error(index, e))
            barrier.abort()
    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(learners)]
    for t in threads:
        t.start()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        pass
    start = time.monotonic()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return start


def run_processes(workers, barrier, queue):
    """Start the learner processes, release them together once every one has reached
    ``barrier``, and return the common start time and their reports (sorted by learner). A
    learner that fails before the barrier breaks it, and its error is raised; every process is
    joined, or terminated after a minute."""
    for w in workers:
        w.start()
    try:
        try:
            barrier.wait(timeout=600)
        except threading.BrokenBarrierError:
            receive(queue, workers)   # raises the learner's error
            raise
        start = time.monotonic()
        return start, sorted(receive(queue, workers) for _ in workers)
    finally:
        for w in workers:
            w.join(timeout=60)
            if w.is_alive():
                w.terminate()


class Stop:
    """When a learner stops: after ``frames`` frames of all learners together or ``seconds``
    after the start, whichever comes first."""

    def __init__(self, frames=None, seconds=None):
        if frames is None and seconds is None:
            raise ValueError("train_a3c needs a stopping rule: frames or seconds")
        if (frames is not None and frames < 1) or (seconds is not None and seconds <= 0):
            raise ValueError("frames={!r}, seconds={!r}: a stopping rule must be positive"
                             .format(frames, seconds))
        self.frames, self.seconds = frames, seconds

    def reached(self, counters, start):
        return (self.frames is not None and counters.total_frames() >= self.frames) or \
            (self.seconds is not None and time.monotonic() - start >= self.seconds)


def make_envs(env_id, seed, learner, window):
    """Learner ``learner``'s own environment, seeded ``seed + learner``."""
    return environments.VectorEnv(env_id, n=1, seed=seed + learner, window=window)


def run_learner(index, predict, sync, learn, envs, settings, counters, stop, start, rng):
    """One actor-learner until ``stop``; returns its finished episodes' returns.

    ``predict(observations)`` is the learner's own copy's forward pass (float32 observations
    to the (n, A + 1) policy logits and values); ``sync()`` copies the shared parameters into
    the copy; ``learn(batch, lr)`` takes the gradients on the copy and applies them to the
    shared parameters.
    """
    num_actions = settings.num_actions

    def policy(observations):
        logits, values = split_output(predict(observations_feed(observations)), num_actions)
        return sample_actions(logits, rng), values

    returns = []
    while not stop.reached(counters, start):
        sync()
        rollout = environments.collect(envs, policy, settings.t_max)
        learn(update_batch(rollout, settings.gamma, settings.reward_clip),
              settings.learning_rate(counters.total_frames()))
        counters.frames[index] += int(rollout.frames)
        counters.updates[index] += 1
        returns.extend(rollout.episode_returns.tolist())
    counters.finished[index] = time.monotonic()
    return returns


def checked_env(hp, env):
    """(env id, frames per agent step) after checking that ``env`` fits the network of
    hyperparameters ``hp``."""
    with environments.VectorEnv(env, n=1, seed=0) as envs:
        check_environment(_Hparams(hp), envs)
        return envs.id, envs.frames_per_step


class _Hparams:
    def __init__(self, hp):
        self.hparams = hp


def predictor(model):
    """A BackendModel's ``predict`` as run_learner calls it."""
    return lambda observations: model.predict({"observations": observations})


def numpy_learning(local, params, optimizer, index):
    """(sync, learn) for a learner whose copy is any BackendModel and whose shared parameters
    are NumPy arrays: the weights go in through ``set_weights``, the canonical gradients come
    out of ``loss_and_gradients`` and the shared NumPy RMSProp applies them."""
    def sync():
        local.set_weights(params)

    def learn(batch, lr):
        _, grads = local.loss_and_gradients(batch)
        optimizer.step(index, grads, lr)
    return sync, learn


def initial_weights(job):
    """The job's model's initial canonical weights (the same on every backend), built from the
    spec alone, so the parent process needs no framework."""
    spec = check_buildable(get_model(A3C), job.hp, job.backend)
    return spec_weights(spec, job.seed)


def shared_arrays(arrays, ctx):
    """name -> a float32 NumPy view of shared memory (``ctx.RawArray``) holding a copy of
    ``arrays[name]``: forked children see and write the same bytes, without a lock."""
    out = OrderedDict()
    for name, value in arrays.items():
        value = np.asarray(value, np.float32)
        view = np.frombuffer(ctx.RawArray("f", max(1, value.size)), np.float32)[:value.size]
        view = view.reshape(value.shape)
        view[...] = value
        out[name] = view
    return out


def shared_counters(learners, ctx):
    """Counters over one shared float64 block (frames, updates, finishing times)."""
    block = np.frombuffer(ctx.RawArray("d", 3 * learners), np.float64).reshape(3, learners)
    return Counters(*block)


def thread_counters(learners):
    return Counters(*np.zeros((3, learners)))


def receive(queue, workers):
    """The next learner's report from ``queue``; raises a learner's error, or names a learner
    process that died without reporting."""
    while True:
        if not queue.empty():
            report = queue.get()
            if isinstance(report, BaseException):
                raise report
            return report
        dead = [w for w in workers if w.exitcode not in (None, 0)]
        if dead:
            raise RuntimeError("learner process {} exited with code {} before reporting"
                               .format(dead[0].pid, dead[0].exitcode))
        time.sleep(0.01)
