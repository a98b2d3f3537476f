"""Environments and rollouts for A3C, framework-free: NumPy arrays out (docs/environments.md).

The rollout file, returns and statistics need only NumPy and load in the CNTK worker
(CPython 3.6); ``make``, ``VectorEnv`` and ``collect`` import Gymnasium and ALE when first
used, in the main process, where the environments always run.
"""
import importlib

from .errors import EnvironmentOptionError, MissingDependencyError, RolloutError, UnknownEnvironmentError
from .rollout import Rollout
from .stats import EpisodeStats
from .targets import advantages, returns

_LAZY = {"make": "preprocessing", "frames_per_step": "preprocessing",
         "ATARI_OPTIONS": "preprocessing", "VectorEnv": "vector", "collect": "collector",
         "resolve": "names", "atari_games": "names", "DEFAULT": "names"}

__all__ = ["make", "VectorEnv", "collect", "Rollout", "returns", "advantages", "EpisodeStats",
           "frames_per_step", "resolve", "atari_games", "ATARI_OPTIONS", "DEFAULT",
           "UnknownEnvironmentError", "EnvironmentOptionError", "MissingDependencyError",
           "RolloutError"]


def __getattr__(name):  # PEP 562: Gymnasium is imported only when one of these is asked for
    if name not in _LAZY:
        raise AttributeError("module {!r} has no attribute {!r}".format(__name__, name))
    return getattr(importlib.import_module("." + _LAZY[name], __name__), name)
