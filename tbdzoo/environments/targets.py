"""n-step discounted returns and advantages of a rollout, as in A3C's pseudo-code (Mnih et al.
2016), in NumPy so every backend's update reads the same targets. CPython 3.6 compatible."""
import numpy as np

from .errors import RolloutError


def returns(rewards, dones, bootstrap, gamma):
    """R_t = r_t + gamma * R_{t+1} * (1 - done_t), from R_T = bootstrap, over (T, n) arrays.

    ``dones[t, i]`` says the episode of environment i ended at step t, so the return stops
    there: no reward of the next episode and no bootstrap value leaks across the boundary.
    Accumulates in float64; returns float32 of shape (T, n).
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
    out = np.empty_like(rewards)
    running = bootstrap
    for t in range(rewards.shape[0] - 1, -1, -1):
        running = rewards[t] + gamma * running * ~dones[t]
        out[t] = running
    return out.astype(np.float32)


def advantages(rewards, dones, values, bootstrap, gamma):
    """R_t - V(s_t): the policy gradient's weight, treated as a constant by the update."""
    values = np.asarray(values, dtype=np.float64)
    targets = returns(rewards, dones, bootstrap, gamma)
    if values.shape != targets.shape:
        raise RolloutError(
            "values have shape {}, the rewards {}".format(values.shape, targets.shape))
    return (targets - values).astype(np.float32)
