"""Rollouts: t_max steps of a vector environment under a policy, as A3C's actors take them."""
import numpy as np

from .errors import RolloutError
from .rollout import Rollout


def collect(envs, policy_fn, t_max):
    """Runs ``t_max`` steps of ``envs`` (a VectorEnv) and returns a Rollout.

    ``policy_fn(observations)`` takes the (n, ...) observations and returns ``(actions,
    values)``: n integer actions and n value estimates. After the last step it is called once
    more on the next observations for the bootstrap values (its actions are then unused), and
    after a step where a time limit truncated an episode, once on the final observations for
    the values a truncated return bootstraps from.
    The environments keep their state, so consecutive calls continue the same episodes.
    """
    if isinstance(t_max, bool) or not isinstance(t_max, (int, np.integer)) or t_max < 1:
        raise RolloutError("t_max={!r} must be a positive integer (the paper: 5)".format(t_max))
    n = envs.num_envs
    obs = np.empty((t_max, n) + envs.observation_shape, envs.observation_dtype)
    actions = np.empty((t_max, n), np.int64)
    rewards = np.empty((t_max, n), np.float32)
    dones = np.empty((t_max, n), np.bool_)
    values = np.empty((t_max, n), np.float32)
    truncated = np.zeros((t_max, n), np.bool_)
    truncation_values = np.zeros((t_max, n), np.float32)
    envs.pop_finished()  # count only the episodes that end in this rollout
    frames = envs.frames
    for t in range(t_max):
        obs[t] = envs.observations
        actions[t], values[t] = _ask(policy_fn, envs.observations, n)
        _, rewards[t], dones[t] = envs.step(actions[t])
        truncated[t] = envs.truncated
        if truncated[t].any():
            _, final_values = _ask(policy_fn, envs.final_observations, n)
            truncation_values[t] = np.where(truncated[t], final_values, 0.0)
    _, bootstrap = _ask(policy_fn, envs.observations, n)
    episode_returns, episode_lengths = envs.pop_finished()
    return Rollout(observations=obs, actions=actions, rewards=rewards, dones=dones, values=values,
                   truncated=truncated, truncation_values=truncation_values,
                   bootstrap=bootstrap, next_observations=np.array(envs.observations),
                   episode_returns=episode_returns, episode_lengths=episode_lengths,
                   frames=envs.frames - frames)


def _ask(policy_fn, observations, n):
    answer = policy_fn(observations)
    if not isinstance(answer, (tuple, list)) or len(answer) != 2:
        raise RolloutError("policy_fn must return (actions, values); got {}".format(
            type(answer).__name__))
    actions, values = np.asarray(answer[0]), np.asarray(answer[1])
    if actions.shape != (n,) or not np.issubdtype(actions.dtype, np.integer):
        raise RolloutError("policy_fn's actions must be integers of shape ({},), one per "
                           "environment; got {} {}".format(n, actions.dtype, actions.shape))
    if values.shape != (n,) or not np.issubdtype(values.dtype, np.number):
        raise RolloutError("policy_fn's values must be numbers of shape ({},), one per "
                           "environment; got {} {}".format(n, values.dtype, values.shape))
    return actions, values.astype(np.float32)
