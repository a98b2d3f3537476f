"""Training an actor-critic from an environment, on any backend (docs/programs.md).

``train_a2c`` is A3C's synchronous, seeded mode (A2C): the learners' environments step in
lockstep, and their rollouts make one update through the backend's ``train_step``.
"""
from ..models.a3c.rollouts import sample_actions, update_batch
from .a2c import A2CResult, train_a2c
from .async_learners import AsyncResult, train_a3c

__all__ = ["train_a2c", "A2CResult", "train_a3c", "AsyncResult", "sample_actions",
           "update_batch"]
