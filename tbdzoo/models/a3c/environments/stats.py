"""Episode statistics: the mean return over the last K finished episodes, the measure of
Gymnasium's CartPole-v1 target (475 over 100 episodes) and of the paper's Atari scores."""
import collections

import numpy as np


class EpisodeStats:
    """Keeps the returns and lengths of the last ``window`` finished episodes."""

    def __init__(self, window=100):
        if not isinstance(window, int) or window < 1:
            raise ValueError("window={!r} must be a positive integer".format(window))
        self.window = window
        self.count = 0  # every episode ever added
        self._returns = collections.deque(maxlen=window)
        self._lengths = collections.deque(maxlen=window)

    def add(self, returns, lengths=None):
        """Adds finished episodes, e.g. a rollout's ``episode_returns`` and ``episode_lengths``."""
        returns = np.asarray(returns, dtype=np.float64).reshape(-1)
        lengths = np.zeros(returns.shape, np.int64) if lengths is None else np.asarray(lengths)
        if lengths.shape != returns.shape:
            raise ValueError("{} returns but {} lengths".format(returns.shape, lengths.shape))
        self._returns.extend(returns.tolist())
        self._lengths.extend(lengths.astype(np.int64).tolist())
        self.count += returns.shape[0]

    def mean_return(self):
        """Mean return of the last ``window`` episodes; NaN before the first one ends."""
        return float(np.mean(self._returns)) if self._returns else float("nan")

    def mean_length(self):
        return float(np.mean(self._lengths)) if self._lengths else float("nan")

    def solved(self, target):
        """True once a full window of episodes averages at least ``target``."""
        return len(self._returns) == self.window and self.mean_return() >= target
