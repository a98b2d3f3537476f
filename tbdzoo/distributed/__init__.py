"""Data-parallel training on each framework's own engine (docs/distributed.md).

The launcher and agent here know no framework; each backend's engine is
``tbdzoo/backends/<backend>/distributed.py``. Valid Python 3.6: CNTK's ranks import it.
"""
from .runs import run, train
from .world import BN_MODES, Node, World, batch_sizes, shard

__all__ = ["run", "train", "Node", "World", "BN_MODES", "batch_sizes", "shard"]
