"""One environment with A3C's preprocessing (Mnih et al. 2016, after DQN's, Mnih et al. 2015):
docs/environments.md gives each value, its source, and why a default differs from Gymnasium's."""
import gymnasium as gym
from gymnasium.spaces import Discrete
from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

from .errors import EnvironmentOptionError, MissingDependencyError
from .names import DEFAULT, is_atari, resolve

# Atari options and their defaults; docs/environments.md says why each is what it is.
ATARI_OPTIONS = {
    "repeat_action_probability": 0.0,  # the paper's deterministic ALE; v5's own default is 0.25
    "terminal_on_life_loss": False,
    "noop_max": 30,
    "frame_skip": 4,
    "screen_size": 84,
    "stack": 4,
    "full_action_space": False,  # the game's minimal action set (6 for Pong), as in the paper
}


class SeedOnFirstReset(gym.Wrapper):
    """Makes ``make(name, seed)`` reproducible from its first ``reset()``, as if that reset had
    been given the seed; later resets continue the environment's own seeded generator."""

    def __init__(self, env, seed):
        super().__init__(env)
        self._seed = seed
        if seed is not None:
            env.action_space.seed(seed)

    def reset(self, *, seed=None, options=None):
        first, self._seed = self._seed, None
        return self.env.reset(seed=first if seed is None else seed, options=options)


def make(name=DEFAULT, seed=None, **options):
    """A preprocessed Gymnasium environment: an Atari game gives uint8 observations of
    (stack, 84, 84); another registered id (``CartPole-v1``) is returned as Gymnasium makes it.
    Only discrete action spaces are accepted (A3C's policy is a softmax over actions).
    ``max_episode_steps`` replaces a non-Atari environment's time limit (CartPole-v1: 500)."""
    env_id = resolve(name)
    if is_atari(env_id):
        env = _atari(env_id, _atari_options(options))
    else:
        limit = options.pop("max_episode_steps", None)
        if options:
            raise EnvironmentOptionError(
                "{} are options of Atari games, not of {}; fix: drop them".format(
                    sorted(options), env_id))
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                                  or limit < 1):
            raise EnvironmentOptionError(
                "max_episode_steps={!r} must be a positive integer".format(limit))
        env = gym.make(env_id) if limit is None else gym.make(env_id, max_episode_steps=limit)
    if not isinstance(env.action_space, Discrete):
        env.close()
        raise EnvironmentOptionError(
            "{} has actions {}, not a discrete set; A3C's softmax policy needs discrete actions; "
            "fix: pick an environment with a Discrete action space such as 'CartPole-v1'".format(
                env_id, env.action_space))
    return SeedOnFirstReset(env, seed)


def frames_per_step(env):
    """Emulator frames one agent step advances: the frame skip for Atari (4), 1 otherwise."""
    try:
        return int(env.get_wrapper_attr("frame_skip"))
    except AttributeError:
        return 1


def _atari_options(options):
    unknown = sorted(set(options) - set(ATARI_OPTIONS))
    if unknown:
        raise EnvironmentOptionError("unknown option(s) {}; known: {}; fix: drop or rename them"
                                     .format(unknown, ", ".join(sorted(ATARI_OPTIONS))))
    merged = dict(ATARI_OPTIONS, **options)
    p = merged["repeat_action_probability"]
    if not 0.0 <= p <= 1.0:
        raise EnvironmentOptionError(
            "repeat_action_probability={!r} is not a probability; fix: 0.0 (the paper) or 0.25 "
            "(ALE v5's sticky actions)".format(p))
    for key in ("frame_skip", "screen_size", "stack"):
        if not isinstance(merged[key], int) or merged[key] < 1:
            raise EnvironmentOptionError(
                "{}={!r} must be a positive integer".format(key, merged[key]))
    return merged


def _atari(env_id, o):
    try:
        import cv2  # noqa: F401  (AtariPreprocessing resizes with OpenCV)
    except ImportError:
        raise MissingDependencyError(
            "Atari preprocessing resizes frames with OpenCV, which is not installed; fix: "
            "pip install -r requirements/main.txt (it pins opencv-python-headless)") from None
    base = gym.make(env_id, frameskip=1, repeat_action_probability=o["repeat_action_probability"],
                    full_action_space=o["full_action_space"])
    env = AtariPreprocessing(base, noop_max=o["noop_max"], frame_skip=o["frame_skip"],
                             screen_size=o["screen_size"],
                             terminal_on_life_loss=o["terminal_on_life_loss"],
                             grayscale_obs=True, scale_obs=False)
    return FrameStackObservation(env, o["stack"])
