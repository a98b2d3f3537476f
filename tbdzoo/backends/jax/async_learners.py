"""A3C's asynchronous learners on the jax backend are not built yet: ``train`` refuses with an
UnsupportedOptionError naming the backends that have them (the synchronous mode,
``tbdzoo.rl.train_a2c``, runs on jax). Imports no framework."""
from ...errors import UnsupportedOptionError


def train(job):
    raise UnsupportedOptionError(
        "asynchronous A3C learners on the jax backend are not built yet; run train_a3c on "
        "backend torch, tensorflow, mxnet or cntk, or train_a2c on jax (docs/a3c.md)")
