"""Errors of the environment side; free of gymnasium so the CNTK worker (CPython 3.6)
can import them with a recorded rollout."""
from ....errors import TbdError, UnknownNameError

SHOWN = 12  # how many known names an error lists before pointing at the full list


class UnknownEnvironmentError(UnknownNameError):
    """An environment name that is neither an Atari ROM nor a registered Gymnasium id."""

    def __init__(self, name, known, suggestions):
        self.kind, self.name, self.known = "environment", name, list(known)
        hint = ""
        if suggestions:
            hint = "did you mean {}? ".format(" or ".join(repr(s) for s in suggestions))
        more = len(self.known) - SHOWN
        message = ("unknown environment {!r}; {}known Atari games: {}{} (all of them: "
                   "ale_py.roms.get_all_rom_ids()), and classic control such as 'CartPole-v1'; "
                   "fix: pass a ROM name such as 'pong', an id such as 'ALE/Pong-v5', or an id "
                   "registered in gymnasium.registry").format(
                       name, hint, ", ".join(self.known[:SHOWN]),
                       " and {} more".format(more) if more > 0 else "")
        Exception.__init__(self, message)


class EnvironmentOptionError(TbdError, ValueError):
    """An option the environment cannot take: an unknown one, an Atari option for a
    non-Atari environment, a bad value, or an action space A3C's softmax policy cannot drive."""


class MissingDependencyError(TbdError, ImportError):
    """A library the preprocessing needs is not installed in this environment."""


class RolloutError(TbdError, ValueError):
    """A policy answered with arrays of the wrong shape or type, or a rollout file is not one."""
