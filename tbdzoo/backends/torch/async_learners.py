"""PyTorch: one process per learner on a model in shared memory (docs/a3c.md).

The shared model's parameters are moved to shared memory (``share_memory_()``), and so are the
shared RMSProp's square averages and the learners' counters. Each learner process builds its
own copy, copies the shared parameters into it before each rollout, backpropagates on it,
points the shared parameters' ``.grad`` at its gradients and steps the shared RMSProp, all
without locks, with one intra-op thread (``torch.set_num_threads(1)``).

Processes start by **fork** on the CPU: a child inherits the shared tensors and the imported
modules, so 16 learners start in milliseconds instead of each re-importing PyTorch (seconds
each); a learner's model is small and single-threaded, so nothing inherited is contended.
With ``device='cuda'`` they start by **spawn**, since CUDA cannot be re-initialised in a
forked child; the shared parameters stay in host shared memory and each learner's copy on the
GPU.
"""
import torch
import torch.multiprocessing as mp

from ...rl.async_learners.common import Counters, learn_in_process, make_envs, reported_to_parent, run_processes
from ...rl.record import RunResult
from .optimizers import RMSProp, set_learning_rate


class SharedRMSprop:
    """The backend's RMSProp (tbdzoo/backends/torch/optimizers.py) without momentum, centring
    or decay, v = alpha v + (1 - alpha) g^2, w -= lr g / sqrt(v + eps) (epsilon inside the
    root, docs/optimizers.md), with its square averages in shared memory as the paper's shared
    statistics, applied in place with no lock. ``updates[i]`` counts learner i's steps in the
    same shared state."""

    def __init__(self, params, settings, learners=None, square_averages=None, updates=None):
        self.params = list(params)
        self.optimizer = RMSProp(self.params, lr=settings.lr, alpha=settings.alpha,
                                 eps=settings.eps, momentum=0.0, centered=False,
                                 weight_decay=0.0)
        self.square_averages = self.optimizer.share_square_averages(square_averages)
        self.updates = updates if updates is not None else \
            torch.zeros(learners, dtype=torch.int64).share_memory_()

    def step(self, learner, lr):
        set_learning_rate(self.optimizer, lr)
        self.optimizer.step()
        self.updates[learner] += 1


def train(job):
    device = job.device or "cpu"
    shared = job.build_native(device="cpu")
    shared.native.share_memory()
    params = shared.native.leaves(shared.trainable_names())
    optimizer = SharedRMSprop(params, job.settings, job.learners)
    counts = torch.zeros((3, job.learners), dtype=torch.float64).share_memory_()
    initial = shared.get_weights()
    ctx = mp.get_context("spawn" if device.startswith("cuda") else "fork")
    barrier, queue = ctx.Barrier(job.learners + 1), ctx.SimpleQueue()
    workers = [ctx.Process(target=_learner, args=(job, index, params, optimizer.square_averages,
                                                  optimizer.updates, counts, barrier, queue,
                                                  device), daemon=True)
               for index in range(job.learners)]
    start, reports = run_processes(workers, barrier, queue)
    counters = Counters(*counts.numpy())
    result = RunResult(job.env_id, backend="torch", learners=job.learners, how=
                         "{} processes ({}), model in shared memory".format(
                             job.learners, ctx.get_start_method()))
    for _, returns, _ in reports:
        result.episode_returns.extend(returns)
    result.finish(counters, start, [r[2] for r in reports])
    result.initial_weights, result.weights = initial, shared.get_weights()
    names = shared.trainable_names()
    result.square_averages = dict((n, shared.native.canonical(n, v).numpy().copy())
                                  for n, v in zip(names, optimizer.square_averages))
    result.optimizer_updates = [int(u) for u in optimizer.updates]
    return result


def _learner(job, index, params, square_averages, updates, counts, barrier, queue, device):
    with reported_to_parent(index, barrier, queue):
        torch.set_num_threads(1)
        local = job.build_native(device=device)
        local.native.train()
        mine = local.native.leaves(local.trainable_names())
        objective = local._objectives[0]
        optimizer = SharedRMSprop(params, job.settings, square_averages=square_averages,
                                  updates=updates)
        counters = Counters(*counts.numpy())
        envs = make_envs(job.env_id, job.seed, index, job.window)
        clip, output = job.settings.clip, local.spec.output

        def predict(observations):
            # straight to the network: the a3c graph has no layer whose behaviour depends on
            # training or inference mode (no dropout, no BatchNorm), so the copy stays in
            # training mode, and each agent step skips the uniform API's batch checks
            with torch.inference_mode():
                values = local.native.values(
                    {"observations": torch.from_numpy(observations).to(device)}, (output,))
                return values[output].float().cpu().numpy()

        def sync():
            with torch.no_grad():
                for m, s in zip(mine, params):
                    m.copy_(s, non_blocking=True)

        def learn(batch, lr):
            (_, native), = local.prepare_batch(batch).native
            grads = torch.autograd.grad(objective(native), mine)
            if clip:
                norm = torch.linalg.vector_norm(torch.stack(
                    [torch.linalg.vector_norm(g) for g in grads]))
                torch._foreach_mul_(grads, torch.clamp(clip / (norm + 1e-6), max=1.0))
            for s, g in zip(params, grads):
                s.grad = g.to("cpu")
            optimizer.step(index, lr)
            for s in params:
                s.grad = None
        learn_in_process(job, index, predict, sync, learn, envs, counters, barrier, queue)
