"""Learner threads that each drive a worker process holding the learner's copy of the network
(the CNTK and JAX backends' asynchronous learners, docs/a3c.md).

The framework runs in its own interpreter (tbdzoo/backends/remote.py) and the environments run
here, so each learner is a thread of this process that steps its own environment and drives its
own worker. The shared parameters and the shared RMSProp's square averages are NumPy arrays of
this process; before each rollout the thread sends the shared parameters to its worker
(``set_weights``), acts through it (``predict``), receives the rollout's gradients
(``loss_and_gradients``) and applies them to the shared arrays, without a lock. The networks run
in the workers in parallel; the threads share this process's GIL only for the environment steps
and the NumPy update. A learner's CPU time is its thread's plus its worker's.
"""
import time

import numpy as np

from ...backends.registry import build
from ...models.a3c import NAME as A3C
from ..record import RunResult
from .common import (
    NumpyRMSProp,
    cpu_seconds,
    initial_weights,
    make_envs,
    numpy_learning,
    predictor,
    run_in_threads,
    run_learner,
    thread_counters,
)


def train_with_workers(job, backend, framework, **build_options):
    """Asynchronous A3C of ``job`` with one ``backend`` worker per learner (built isolated,
    with ``build_options``); ``framework`` names the workers in the result's ``how``."""
    initial = initial_weights(job)
    params = dict((n, v.copy()) for n, v in initial.items())
    square_averages = dict((n, np.zeros_like(v)) for n, v in initial.items())
    updates = np.zeros(job.learners, np.int64)
    optimizer = NumpyRMSProp(params, square_averages, updates, job.settings)
    counters = thread_counters(job.learners)
    copies = []
    try:
        for _ in range(job.learners):
            copies.append(build(A3C, backend=backend, config=job.config, seed=job.seed,
                                isolate=True, **build_options, **job.overrides))
        return _run(job, backend, framework, copies, initial, params, optimizer, counters)
    finally:
        for copy in copies:
            copy.close()


def _run(job, backend, framework, copies, initial, params, optimizer, counters):
    reports = [None] * job.learners

    def learner(index, barrier):
        local = copies[index]
        sync, learn = numpy_learning(local, params, optimizer, index)
        envs = make_envs(job.env_id, job.seed, index, job.window)
        barrier.wait()
        start = time.monotonic()
        cpu = cpu_seconds(thread=True) + cpu_seconds(pid=local.pid)
        returns = run_learner(index, predictor(local), sync, learn, envs, job.settings,
                              counters, job.stop, start,
                              np.random.default_rng(job.seed + index))
        used = cpu_seconds(thread=True) + cpu_seconds(pid=local.pid) - cpu
        reports[index] = (returns, used)
        envs.close()
    start = run_in_threads(job.learners, learner)
    result = RunResult(job.env_id, backend=backend, learners=job.learners, how=
                       "{} threads, each driving its own {} worker process".format(
                           job.learners, framework))
    for returns, _ in reports:
        result.episode_returns.extend(returns)
    result.finish(counters, start, [r[1] for r in reports])
    result.initial_weights = initial
    optimizer.record_state(result)
    return result
