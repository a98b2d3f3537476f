"""What a backend's distributed engine (backends/<fw>/distributed.py) and the launcher
(tbdzoo/distributed/) share: the helper processes an engine asks the node's agent to start,
and the variable through which a rank learns its --rank-timeout. Valid Python 3.6."""

RANK_TIMEOUT_VARIABLE = "TBDZOO_RANK_TIMEOUT"  # --rank-timeout, for an engine's own failure detector


class Helper:
    """A process an engine needs besides the ranks (MXNet's scheduler and servers)."""

    def __init__(self, name, argv, env=None):
        self.name, self.argv, self.env = name, list(argv), dict(env or {})
