"""JAX: one learner thread per JAX worker process (docs/a3c.md).

JAX runs in its own environment (.venv-jax, NumPy 2, tbdzoo/backends/remote.py) and Gymnasium
lives in the main one, so each learner is a thread of the main process driving its own JAX
worker, which holds the learner's network and its jitted programs, on the CPU
(tbdzoo/rl/async_learners/workers.py).
"""
from ...rl.async_learners.workers import train_with_workers


def train(job):
    return train_with_workers(job, "jax", "JAX", device="cpu")
