"""Which environment a name means: an Atari game by its ROM name or ``ALE/<Game>-v5`` id, or a
registered Gymnasium id such as ``CartPole-v1``. Every Atari game resolves to its v5 id, so
the preprocessing in :mod:`.preprocessing` always wraps the same base environment."""
import difflib
import re

import ale_py
import gymnasium as gym
from ale_py import roms

from .errors import EnvironmentOptionError, UnknownEnvironmentError

gym.register_envs(ale_py)  # makes the ALE/<Game>-v5 ids known to gymnasium.make

DEFAULT = "ALE/Pong-v5"
# The seven games of the first DQN paper (Mnih et al. 2013): errors list them first.
FEATURED = ("pong", "breakout", "beam_rider", "enduro", "qbert", "seaquest", "space_invaders")


def _key(name):
    """'ALE/MsPacman-v5', 'MsPacman', 'ms_pacman' and 'mspacman' all give 'mspacman'."""
    name = name.lower()
    if name.startswith("ale/"):
        name = name[len("ale/"):]
    return re.sub(r"-v\d+$", "", name).replace("_", "").replace("-", "")


def atari_games():
    """ROM names (as ale_py lists them) that have a single-player ``ALE/<Game>-v5`` id."""
    registered = {_key(i): i for i in gym.registry if i.startswith("ALE/") and i.endswith("-v5")}
    return {rom: registered[_key(rom)] for rom in roms.get_all_rom_ids() if _key(rom) in registered}


def is_atari(env_id):
    """Whether a registered id is an ALE game (whatever its version)."""
    entry = gym.spec(env_id).entry_point
    return isinstance(entry, str) and entry.startswith("ale_py")


def _listed(games):
    """Game names for an error: the featured ones first, then the rest in order."""
    first = [g for g in FEATURED if g in games]
    return first + sorted(set(games) - set(first))


def _version(env_id):
    found = re.search(r"-v(\d+)$", env_id)
    return int(found.group(1)) if found else -1


def resolve(name=DEFAULT):
    """The registered Gymnasium id that ``name`` means; raises UnknownEnvironmentError."""
    if not isinstance(name, str) or not name:
        raise UnknownEnvironmentError(name, _listed(atari_games()), [])
    games = atari_games()
    by_key = {_key(rom): env_id for rom, env_id in games.items()}
    older_atari_id = name in gym.registry and not name.startswith("ALE/")
    if _key(name) in by_key and not older_atari_id:
        return by_key[_key(name)]
    if name in gym.registry:
        if is_atari(name):  # Pong-v4, PongNoFrameskip-v4: older ids with other defaults
            v5 = by_key.get(_key(name).replace("noframeskip", ""), DEFAULT)
            raise EnvironmentOptionError(
                "{!r} is an older Atari id with its own frame skip and sticky actions; Atari games "
                "are built from their v5 id with the preprocessing of docs/environments.md; "
                "fix: pass {!r}".format(name, v5))
        return name
    latest = {}
    for env_id in gym.registry:
        if not is_atari(env_id):
            latest.setdefault(_key(env_id), []).append(env_id)
    if _key(name) in latest:  # 'cartpole' -> 'CartPole-v1', the highest version
        return max(latest[_key(name)], key=_version)
    close = difflib.get_close_matches(name.lower(), list(games) + list(gym.registry), n=3)
    raise UnknownEnvironmentError(name, _listed(games), close)
