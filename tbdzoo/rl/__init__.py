"""Training an actor-critic from an environment, on any backend (docs/programs.md).

``train_a2c`` is A3C's synchronous, seeded mode (A2C): the learners' environments step in
lockstep, and their rollouts make one update through the backend's ``train_step``.
"""
from ..models.a3c.rollouts import sample_actions, update_batch
from .a2c import train_a2c
from .async_learners import train_a3c
from .record import RunResult

__all__ = ["train_a2c", "train_a3c", "RunResult", "sample_actions", "update_batch"]
