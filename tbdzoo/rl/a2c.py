"""A3C's synchronous, seeded mode (A2C): n learners' environments in lockstep, one update per
rollout of t_max steps, on any backend through its uniform API.

Acting is ``model.predict`` (the graph's policy-and-value output), learning is
``model.train_step`` on the batch ``update_batch`` makes from the rollout; returns and
advantages are NumPy. With the same seed two runs on one backend take the same actions and
reach the same weights; backends differ only by floating-point rounding, which a sampled
policy eventually amplifies into different episodes.
"""
import time

import numpy as np

from ..errors import TbdError
from ..models.a3c import NAME as A3C
from ..models.a3c import environments
from ..models.a3c.environments import EpisodeStats
from ..models.a3c.rollouts import observations_feed, sample_actions, split_output, update_batch
from .record import RunResult


class EnvironmentMismatchError(TbdError, ValueError):
    """An environment whose observations or actions the model was not built for."""


def check_environment(model, envs):
    """Raise EnvironmentMismatchError unless ``envs`` fits the network of ``model``."""
    hp = model.hparams
    shape = tuple(hp["observation_shape"])
    if tuple(envs.observation_shape) != shape:
        raise EnvironmentMismatchError(
            "{} gives observations of shape {}, but the a3c network takes {}; fix: build the "
            "model with observation_shape={} (and the network that fits it: 'mlp' for a vector, "
            "'atari' for frames)".format(envs.id, envs.observation_shape, shape,
                                         ",".join(str(d) for d in envs.observation_shape)))
    if envs.num_actions != hp["num_actions"]:
        raise EnvironmentMismatchError(
            "{} has {} actions, but the policy head has {}; fix: build the model with "
            "num_actions={}".format(envs.id, envs.num_actions, hp["num_actions"],
                                    envs.num_actions))


def train_a2c(model, env=None, seed=0, max_frames=None, max_updates=None, max_seconds=None,
              target_return=None, window=100, log_every=None, progress=None, monitor=None):
    """Train ``model`` (an a3c model built on any backend) on ``env`` (default: its
    config's ``env``) with ``model.hparams['learners']`` environments seeded seed, seed+1, ...

    Stops at the first of ``max_frames``, ``max_updates``, ``max_seconds`` or a mean return of
    at least ``target_return`` over the last ``window`` episodes. Every ``log_every`` updates
    ``progress`` (default: none; ``print`` works) receives a line of text and ``monitor`` the
    RunResult as it stands (tbdzoo/training reads its history). Returns a RunResult.
    """
    if max_frames is None and max_updates is None and max_seconds is None and \
            target_return is None:
        raise ValueError("train_a2c needs a stopping rule: max_frames, max_updates, "
                         "max_seconds or target_return")
    hp = model.hparams
    if hp.get("model") != A3C:
        raise ValueError("train_a2c trains the {} model, not {!r}".format(A3C, hp.get("model")))
    envs = environments.VectorEnv(env or hp["env"], n=hp["learners"], seed=seed, window=window)
    try:
        check_environment(model, envs)
        return _run(model, envs, hp, np.random.default_rng(seed), window, max_frames,
                    max_updates, max_seconds, target_return, log_every, progress, monitor)
    finally:
        envs.close()


def _run(model, envs, hp, rng, window, max_frames, max_updates, max_seconds, target_return,
         log_every, progress, monitor=None):
    result = RunResult(envs.id, window)
    stats = EpisodeStats(window)

    def policy(observations):
        logits, values = split_output(model.predict({"observations": observations_feed(
            observations)}), hp["num_actions"])
        return sample_actions(logits, rng), values

    start = time.perf_counter()
    while True:
        rollout = environments.collect(envs, policy, hp["t_max"])
        loss = model.train_step(update_batch(rollout, hp["gamma"], hp["reward_clip"]))
        result.losses.append(loss)
        result.updates += 1
        result.frames += int(rollout.frames)
        result.episode_returns.extend(rollout.episode_returns.tolist())
        stats.add(rollout.episode_returns, rollout.episode_lengths)
        result.seconds = time.perf_counter() - start
        solved = target_return is not None and stats.solved(target_return)
        if solved and result.solved_at is None:
            result.solved_at = (result.frames, result.seconds, result.updates)
        if log_every and result.updates % log_every == 0:
            result.history.append((result.frames, result.seconds, stats.mean_return()))
            if progress is not None:
                progress("update {:6d}  frames {:8d}  {:6.0f} frames/s  mean return {:7.1f} "
                         "({} episodes)".format(result.updates, result.frames,
                                                result.frames_per_second, stats.mean_return(),
                                                stats.count))
            if monitor is not None:
                monitor(result)
        if solved or (max_frames is not None and result.frames >= max_frames) or \
                (max_updates is not None and result.updates >= max_updates) or \
                (max_seconds is not None and result.seconds >= max_seconds):
            return result
