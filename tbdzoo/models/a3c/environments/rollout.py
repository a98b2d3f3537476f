"""A rollout: t_max steps of n environments as NumPy arrays, and its ``.npz`` file (no pickles),
so one recorded rollout feeds every backend's update, the CNTK worker's (CPython 3.6) too."""
import numpy as np

from .errors import RolloutError
from .targets import advantages, returns

# name -> (dtype, shape): "T" is t_max, "n" the number of environments, "k" finished episodes,
# "..." one observation's shape.
FIELDS = (
    ("observations", None, ("T", "n", "...")),  # what the policy saw before each action
    ("actions", np.int64, ("T", "n")),
    ("rewards", np.float32, ("T", "n")),  # the game's own rewards, unclipped
    ("dones", np.bool_, ("T", "n")),  # the episode ended at this step (terminated or truncated)
    ("truncated", np.bool_, ("T", "n")),  # ... cut by a time limit, not terminated
    ("truncation_values", np.float32, ("T", "n")),  # V(final observation) there, else 0
    ("values", np.float32, ("T", "n")),  # the policy's V(s_t)
    ("bootstrap", np.float32, ("n",)),  # V(s_T) of next_observations
    ("next_observations", None, ("n", "...")),  # where the next rollout starts
    ("episode_returns", np.float64, ("k",)),  # episodes that ended during the rollout
    ("episode_lengths", np.int64, ("k",)),  # in agent steps
    ("frames", np.int64, ()),  # emulator frames, skipped frames counted
)

# Fields that files written before truncations were told apart lack: no step was truncated.
OPTIONAL = ("truncated", "truncation_values")


class Rollout:
    """The arrays of one rollout, checked against each other; see FIELDS for each one."""

    def __init__(self, **arrays):
        names = [f[0] for f in FIELDS]
        if "truncation_values" not in arrays and np.any(arrays.get("truncated", False)):
            raise RolloutError("truncated steps but no truncation_values to bootstrap them "
                               "from; fix: pass the value of each truncated final observation")
        if "dones" in arrays:
            for name in OPTIONAL:
                if name not in arrays:
                    arrays[name] = np.zeros(np.shape(arrays["dones"]), dict(
                        (f[0], f[1]) for f in FIELDS)[name])
        if sorted(arrays) != sorted(names):
            raise RolloutError("a rollout has the arrays {}; got {}".format(names, sorted(arrays)))
        for name, dtype, _ in FIELDS:
            value = np.asarray(arrays[name])
            setattr(self, name, value if dtype is None else value.astype(dtype, copy=False))
        self._check()

    def _check(self):
        obs = self.observations
        if obs.ndim < 2:
            raise RolloutError("observations must be (T, n, ...); got shape {}".format(obs.shape))
        sizes = {"T": obs.shape[0], "n": obs.shape[1], "k": self.episode_returns.shape[0] if
                 self.episode_returns.ndim == 1 else -1}
        for name, _, dims in FIELDS:
            got = getattr(self, name).shape
            want = tuple(sizes[d] for d in dims if d != "...")
            if dims and dims[-1] == "...":
                want = want + obs.shape[2:]
            if got != want:
                raise RolloutError("{} has shape {}, expected {} for {}".format(
                    name, got, want, dict((d, sizes[d]) for d in ("T", "n", "k"))))
        if self.next_observations.dtype != obs.dtype:
            raise RolloutError("next_observations are {}, observations {}".format(
                self.next_observations.dtype, obs.dtype))

    @property
    def t_max(self):
        return self.observations.shape[0]

    @property
    def num_envs(self):
        return self.observations.shape[1]

    def returns(self, gamma):
        """n-step discounted returns, (T, n) float32: the value head's targets."""
        return returns(self.rewards, self.dones, self.bootstrap, gamma, self.truncated,
                       self.truncation_values)

    def advantages(self, gamma):
        """Returns minus the values, (T, n) float32: the policy gradient's weights."""
        return advantages(self.rewards, self.dones, self.values, self.bootstrap, gamma,
                          self.truncated, self.truncation_values)

    def arrays(self):
        """Every field by name, ``frames`` as a 0-d array."""
        return dict((name, getattr(self, name)) for name, _, _ in FIELDS)

    def save(self, path):
        """Writes an uncompressed ``.npz`` holding plain arrays only."""
        np.savez(path, **self.arrays())

    @classmethod
    def load(cls, path):
        """Reads a file written by :meth:`save`; refuses pickled objects."""
        with np.load(path, allow_pickle=False) as data:
            try:
                arrays = dict((name, data[name]) for name in data.files)
            except ValueError as e:  # an object array needs pickles
                raise RolloutError("{} holds pickled objects, not a rollout: {}".format(path, e)) from e
        return cls(**arrays)

    def __eq__(self, other):
        if not isinstance(other, Rollout):
            return NotImplemented
        return all(a.dtype == b.dtype and np.array_equal(a, b)
                   for a, b in zip(self.arrays().values(), other.arrays().values()))

    __hash__ = None

    def __repr__(self):
        return "Rollout(t_max={}, num_envs={}, observations {} {}, {} episodes, {} frames)".format(
            self.t_max, self.num_envs, self.observations.shape[2:], self.observations.dtype,
            len(self.episode_returns), int(self.frames))
