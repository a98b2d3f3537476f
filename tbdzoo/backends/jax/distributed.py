"""Data-parallel training on the jax backend (through ``jax.distributed``) is not built yet:
every entry point of the engine (tbdzoo/distributed/agent.py, rank.py) refuses with an
UnsupportedOptionError naming the backends that have it. Imports no framework."""
from ...errors import UnsupportedOptionError

ENGINE = "jax.distributed"
LOCAL_RANK_VARIABLE = "TBDZOO_LOCAL_RANK"


def _not_built(*args, **kwargs):
    raise UnsupportedOptionError(
        "data-parallel training on the jax backend is not built yet; run it on backend "
        "torch, tensorflow, mxnet or cntk (docs/distributed.md)")


check = helpers = rank_launcher = rank_environment = init = finalize = communication = \
    model_class = _not_built
