"""n environments stepped together in this process, seeded, with their episodes counted.

Built on Gymnasium's SyncVectorEnv in its same-step autoreset mode: an environment whose
episode ends is reset inside the same ``step``, which returns the new episode's first
observation with ``done`` set. Gymnasium 1.x's default (next-step) mode would instead spend the
following step on the reset, ignoring that step's action and reporting a zero reward, and every
rollout would have to mask those steps out. docs/environments.md says more.
"""
import functools

import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from .errors import EnvironmentOptionError, RolloutError
from .names import DEFAULT, resolve
from .preprocessing import frames_per_step, make
from .stats import EpisodeStats


class VectorEnv:
    """``n`` copies of ``make(name, seed + i, **options)`` that step in lockstep.

    Two instances built with the same arguments give identical observations for identical
    actions. ``frames`` counts emulator frames (agent steps times the frame skip).
    """

    def __init__(self, name=DEFAULT, n=1, seed=0, window=100, **options):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise EnvironmentOptionError("n={!r}: a vector environment needs at least one "
                                         "environment; fix: n >= 1".format(n))
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
            raise EnvironmentOptionError("seed={!r} must be an integer or None".format(seed))
        self.id = resolve(name)
        self.num_envs = int(n)
        self.seed = seed
        fns = [functools.partial(make, self.id, None if seed is None else int(seed) + i, **options)
               for i in range(self.num_envs)]
        self._vec = SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)
        self.frames_per_step = frames_per_step(self._vec.envs[0])
        space = self._vec.single_observation_space
        self.observation_shape, self.observation_dtype = tuple(space.shape), np.dtype(space.dtype)
        self.num_actions = int(self._vec.single_action_space.n)
        self.steps = 0  # agent steps of all environments together
        self.stats = EpisodeStats(window)
        self._return = np.zeros(self.num_envs, np.float64)
        self._length = np.zeros(self.num_envs, np.int64)
        self._finished = []
        self.observations, _ = self._vec.reset()
        self.terminated = np.zeros(self.num_envs, np.bool_)   # of the last step
        self.truncated = np.zeros(self.num_envs, np.bool_)    # cut by a time limit, not ended
        self.final_observations = self.observations           # see step()

    @property
    def frames(self):
        """Emulator frames stepped so far, skipped frames counted (x4 on Atari, x1 otherwise);
        the no-op frames of resets are not counted, as in the paper's frame counts."""
        return self.steps * self.frames_per_step

    def step(self, actions):
        """Applies one action per environment; returns (observations, rewards, dones).

        ``dones[i]`` marks the end of environment i's episode (terminated or truncated); its
        returned observation then already starts the next episode. The step also sets
        ``terminated`` and ``truncated`` (n,) bool (``truncated`` only where a time limit cut an
        episode that did not terminate at that step: its state still has a value) and
        ``final_observations``: the returned observations, but the last observation of each
        episode that ended, which a return bootstraps from after a truncation.
        """
        actions = self._checked(actions)
        obs, rewards, terminated, truncated, info = self._vec.step(actions)
        terminated = np.asarray(terminated, np.bool_)
        truncated = np.logical_and(truncated, ~terminated)
        dones = np.logical_or(terminated, truncated)
        final = obs
        if dones.any():
            final = np.array(obs)
            for i in np.flatnonzero(dones):
                final[i] = info["final_obs"][i]
        self.terminated, self.truncated, self.final_observations = terminated, truncated, final
        rewards = np.asarray(rewards, np.float32)
        self._return += rewards
        self._length += 1
        for i in np.flatnonzero(dones):
            self._finished.append((self._return[i], self._length[i]))
            self.stats.add([self._return[i]], [self._length[i]])
            self._return[i], self._length[i] = 0.0, 0
        self.steps += self.num_envs
        self.observations = obs
        return obs, rewards, dones

    def pop_finished(self):
        """(returns, lengths) of the episodes finished since the last call."""
        done, self._finished = self._finished, []
        return (np.array([d[0] for d in done], np.float64),
                np.array([d[1] for d in done], np.int64))

    def _checked(self, actions):
        actions = np.asarray(actions)
        if actions.shape != (self.num_envs,) or not np.issubdtype(actions.dtype, np.integer):
            raise RolloutError(
                "actions must be integers of shape ({},), one per environment; got {} {}".format(
                    self.num_envs, actions.dtype, actions.shape))
        if actions.min() < 0 or actions.max() >= self.num_actions:
            raise RolloutError("actions must lie in [0, {}) for {}; got {}".format(
                self.num_actions, self.id, actions.tolist()))
        return actions.astype(np.int64)

    def close(self):
        self._vec.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "VectorEnv({!r}, n={}, seed={!r})".format(self.id, self.num_envs, self.seed)
