"""CNTK: one learner thread per CNTK worker process (docs/a3c.md).

CNTK 2.7 runs in its own interpreter (CPython 3.6, tbdzoo/backends/remote.py) and Gymnasium
needs this one, so each learner is a thread of the main process driving its own CNTK worker
(tbdzoo/rl/async_learners/workers.py).
"""
from ...rl.async_learners.workers import train_with_workers


def train(job):
    return train_with_workers(job, "cntk", "CNTK")
