"""From a model's output to actions, and from a rollout to the update's batch, in NumPy: the
same arrays feed every backend."""
import numpy as np

from .environments import targets


def split_output(output, num_actions):
    """(logits (N, A), values (N,)) from the a3c graph's (N, A + 1) output."""
    output = np.asarray(output)
    if output.ndim != 2 or output.shape[1] != num_actions + 1:
        raise ValueError("the policy's output has shape {}; an actor-critic over {} actions "
                         "gives (N, {})".format(output.shape, num_actions, num_actions + 1))
    return output[:, :num_actions], output[:, num_actions]


def sample_actions(logits, rng):
    """One action per row drawn from softmax(logits) by ``rng`` (a numpy Generator): the inverse
    of the cumulative distribution at a uniform draw, so a seed fixes every action."""
    z = np.asarray(logits, np.float64)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    cdf = np.cumsum(p / p.sum(axis=1, keepdims=True), axis=1)
    u = rng.random((len(z), 1))
    return np.minimum((cdf < u).sum(axis=1), z.shape[1] - 1).astype(np.int64)


def observations_feed(observations):
    """The network's float32 input: Atari's uint8 bytes as they are (the graph scales them)."""
    return np.asarray(observations, np.float32)


def update_batch(rollout, gamma, reward_clip=0.0):
    """The a3c program's batch from a Rollout: its T x n steps flattened time-major, the
    actions taken, the n-step advantages (the value estimate a constant) and returns, which
    bootstrap from a truncated episode's final observation (docs/environments.md).
    ``reward_clip`` > 0 clips each reward to [-reward_clip, reward_clip] first."""
    rewards = rollout.rewards
    if reward_clip:
        rewards = np.clip(rewards, -reward_clip, reward_clip)
    returns = targets.returns(rewards, rollout.dones, rollout.bootstrap, gamma,
                              rollout.truncated, rollout.truncation_values)
    advantages = returns - rollout.values
    steps = rollout.t_max * rollout.num_envs
    obs = rollout.observations.reshape((steps,) + rollout.observations.shape[2:])
    return {"observations": observations_feed(obs),
            "actions": rollout.actions.reshape(steps).astype(np.int32),
            "advantages": advantages.reshape(steps).astype(np.float32),
            "returns": returns.reshape(steps, 1).astype(np.float32)}
