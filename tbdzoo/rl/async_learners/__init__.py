"""A3C proper: asynchronous actor-learners on shared parameters, on every backend (docs/a3c.md).

Each backend's learners live in its folder (the module its BackendInfo names as
``async_learners``: tbdzoo/backends/<fw>/async_learners.py), with the same entry point,
``train(job)``, each its framework's way: PyTorch with one process per learner on a model in
shared memory, TensorFlow with threads on one shared set of variables, MXNet with one process
per learner on NumPy views of shared memory, CNTK with one learner thread per worker process,
all updating the shared parameters with an RMSProp whose statistics are shared too, without
locks.
"""
from ...backends.info import backend_info, backend_infos
from ...backends.registry import build_native
from ...errors import UnsupportedOptionError
from ...models import get_model
from ...models.a3c import NAME as A3C
from .common import Settings, Stop, check_learners, checked_env


class Job:
    """One run's request, picklable, as every backend's ``train`` receives it."""

    def __init__(self, backend, config, overrides, hp, settings, stop, env_id, seed, window,
                 device):
        self.backend, self.config, self.overrides, self.hp = backend, config, overrides, hp
        self.settings, self.stop, self.env_id, self.seed = settings, stop, env_id, seed
        self.window, self.device = window, device

    @property
    def learners(self):
        return self.settings.learners

    def build_native(self, backend=None, device=None):
        """The learner's own copy (or the shared model): the job's a3c model, built here."""
        return build_native(A3C, backend or self.backend, config=self.config, seed=self.seed,
                            device=device, **self.overrides)


def train_a3c(backend="torch", config="cartpole", learners=None, frames=None, seconds=None,
              seed=0, env=None, device=None, window=100, **overrides):
    """Train the a3c model with ``learners`` (default: the config's) asynchronous
    actor-learners on ``backend`` until ``frames`` frames of all learners together (skipped
    frames counted) or ``seconds``, whichever comes first. Learner i's environment is seeded
    ``seed + i``; the learners' interleaving is the operating system's, so runs are not
    repeatable (``tbdzoo.rl.train_a2c`` is the seeded mode). ``device`` is the PyTorch
    learners' device (default 'cpu'). Returns a RunResult (tbdzoo/rl/record.py)."""
    info = backend_info(backend)  # UnknownNameError for a backend that is not one
    if device not in (None, "cpu") and not info.async_learners_on_gpu:
        raise UnsupportedOptionError(
            "device {!r}: asynchronous learners on {} run on the CPU; fix: drop device, or use "
            "backend {}, whose learners' copies can be on a GPU".format(
                device, backend, " or ".join(b.name for b in backend_infos()
                                             if b.async_learners_on_gpu)))
    hp = get_model(A3C).hparams(config, **overrides)
    check_learners(hp["learners"] if learners is None else learners)
    learners = hp["learners"] if learners is None else learners
    stop = Stop(frames, seconds)
    env_id, frames_per_step = checked_env(hp, env or hp["env"])
    job = Job(backend, config, dict(overrides), hp, Settings(hp, learners, frames_per_step), stop,
              env_id, seed, window, device)
    return info.load("async_learners").train(job)


__all__ = ["train_a3c", "check_learners"]
