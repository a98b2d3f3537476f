"""n-step discounted returns and advantages of a rollout, as in A3C's pseudo-code (Mnih et al.
2016), in NumPy so every backend's update reads the same targets. CPython 3.6 compatible."""
import numpy as np

from .errors import RolloutError


def returns(rewards, dones, bootstrap, gamma, truncated=None, truncation_values=None):
    """R_t = r_t + gamma * R_{t+1} * (1 - done_t), from R_T = bootstrap, over (T, n) arrays;
    where step t was truncated, R_t = r_t + gamma * truncation_values[t].

    ``dones[t, i]`` says the episode of environment i ended at step t, so the return stops
    there: no reward of the next episode and no bootstrap value leaks across the boundary.
    An episode that terminated has no future; one that a time limit cut (``truncated[t, i]``,
    a subset of ``dones``) still had one, which the value of its final observation,
    ``truncation_values[t, i]``, estimates (Pardo et al. 2018, *Time Limits in Reinforcement
    Learning*). Accumulates in float64; returns float32 of shape (T, n).
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    dones = np.asarray(dones, dtype=bool)
    bootstrap = np.asarray(bootstrap, dtype=np.float64)
    if rewards.ndim != 2 or dones.shape != rewards.shape or bootstrap.shape != rewards.shape[1:]:
        raise RolloutError(
            "returns needs rewards and dones of one shape (T, n) and bootstrap of shape (n,); "
            "got {}, {} and {}".format(rewards.shape, dones.shape, bootstrap.shape))
    if not 0.0 <= gamma <= 1.0:
        raise RolloutError("gamma={!r} must lie in [0, 1]".format(gamma))
    truncated, cut = _truncations(dones, truncated, truncation_values)
    out = np.empty_like(rewards)
    running = bootstrap
    for t in range(rewards.shape[0] - 1, -1, -1):
        running = rewards[t] + gamma * np.where(dones[t], np.where(truncated[t], cut[t], 0.0),
                                                running)
        out[t] = running
    return out.astype(np.float32)


def _truncations(dones, truncated, truncation_values):
    """(truncated, values) as float64-ready arrays of the dones' shape, checked."""
    if truncated is None:
        if truncation_values is not None:
            raise RolloutError("truncation_values without truncated: say which steps they "
                               "belong to")
        return np.zeros(dones.shape, bool), np.zeros(dones.shape)
    truncated = np.asarray(truncated, dtype=bool)
    if truncation_values is None:
        if truncated.any():
            raise RolloutError("truncated steps need truncation_values, the value of each "
                               "truncated episode's final observation")
        truncation_values = np.zeros(dones.shape)
    cut = np.asarray(truncation_values, dtype=np.float64)
    if truncated.shape != dones.shape or cut.shape != dones.shape:
        raise RolloutError("truncated and truncation_values must have the dones' shape {}; got "
                           "{} and {}".format(dones.shape, truncated.shape, cut.shape))
    if np.any(truncated & ~dones):
        raise RolloutError("a truncated step must also be done (an episode ends there)")
    return truncated, cut


def advantages(rewards, dones, values, bootstrap, gamma, truncated=None,
               truncation_values=None):
    """R_t - V(s_t): the policy gradient's weight, treated as a constant by the update."""
    values = np.asarray(values, dtype=np.float64)
    targets = returns(rewards, dones, bootstrap, gamma, truncated, truncation_values)
    if values.shape != targets.shape:
        raise RolloutError(
            "values have shape {}, the rewards {}".format(values.shape, targets.shape))
    return (targets - values).astype(np.float32)
