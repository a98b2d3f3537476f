"""MXNet: one process per learner on parameters in shared memory, seen as NumPy views
(docs/a3c.md).

The parent process holds the shared parameters and the shared RMSProp's square averages as
NumPy views of shared memory, and imports MXNet once before forking. Each learner is a forked
process with one engine thread that builds its own Gluon copy, copies the shared parameters
into it before each rollout (``set_weights``), takes the gradients with ``autograd`` on it
(``loss_and_gradients``) and applies them to the shared views with the NumPy RMSProp, without
a lock. Processes rather than threads: learner threads in one MXNet process share its engine
and interpreter, and measured against processes they used far less CPU for about the same cost
per frame (docs/a3c.md); a process per learner gives each its own, as a PyTorch learner has.
"""
import importlib
import multiprocessing
import os

import numpy as np

from ...rl.async_learners.common import (
    NumpyRMSProp,
    initial_weights,
    learn_in_process,
    make_envs,
    numpy_learning,
    predictor,
    reported_to_parent,
    run_processes,
    shared_arrays,
    shared_counters,
)
from ...rl.record import RunResult


def train(job):
    # Imported once here, before the fork: each child would otherwise spend seconds importing
    # MXNet; its fork handlers stop the engine before a fork and start a fresh one in the child.
    for name in ("MXNET_CPU_WORKER_NTHREADS", "OMP_NUM_THREADS"):
        os.environ.setdefault(name, "1")   # read at MXNet's first import
    importlib.import_module("tbdzoo.backends.mxnet.framework")
    ctx = multiprocessing.get_context("fork")
    initial = initial_weights(job)
    params = shared_arrays(initial, ctx)
    square_averages = shared_arrays(dict((n, np.zeros_like(v)) for n, v in initial.items()), ctx)
    updates = np.frombuffer(ctx.RawArray("q", job.learners), np.int64)
    counters = shared_counters(job.learners, ctx)
    barrier, queue = ctx.Barrier(job.learners + 1), ctx.SimpleQueue()
    optimizer = NumpyRMSProp(params, square_averages, updates, job.settings)
    workers = [ctx.Process(target=_learner, args=(job, index, params, optimizer, counters,
                                                  barrier, queue), daemon=True)
               for index in range(job.learners)]
    start, reports = run_processes(workers, barrier, queue)
    result = RunResult(job.env_id, backend="mxnet", learners=job.learners, how=
                         "{} processes (fork), parameters in shared memory".format(job.learners))
    for _, returns, _ in reports:
        result.episode_returns.extend(returns)
    result.finish(counters, start, [r[2] for r in reports])
    result.initial_weights = initial
    optimizer.record_state(result)
    return result


def _learner(job, index, params, optimizer, counters, barrier, queue):
    with reported_to_parent(index, barrier, queue):
        local = job.build_native(device="cpu")
        sync, learn = numpy_learning(local, params, optimizer, index)
        envs = make_envs(job.env_id, job.seed, index, job.window)
        learn_in_process(job, index, predictor(local), sync, learn, envs, counters, barrier,
                         queue)
