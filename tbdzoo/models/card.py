"""The parts of a model card besides its graph and configs: how it trains to a target, how
the benchmark suite runs it on a CPU, its cross-framework consistency case, its image input
and its measured sizes. Each model's package fills them in (``register_model(...,
training=Training(...), ...)``); the shared code reads them from ``get_model(name)`` and
never from a table keyed by the model's name. Valid Python 3.6 (the CNTK worker imports it).
"""
import collections
import importlib

__all__ = ["Metric", "Training", "Benchmark", "Consistency", "ImageInput", "Measured",
           "SHARDING"]

Metric = collections.namedtuple("Metric", "name low high higher_is_better what")

# How a data-parallel run to a target splits the data between its ranks, by the kind a
# card's ``Training.data_parallel`` names.
SHARDING = {
    "image": "strided: rank r reads positions r, r + W, ... of each epoch's seeded order",
    "batch slices": "contiguous: rank r trains on rows [r B/W, (r+1) B/W) of the global batch",
}


def load(path):
    """The object ``"package.module:attribute"`` names, its module imported on first use."""
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


class Training:
    """How ``tbd train`` trains the model to a held-out target (docs/training.md).

    ``task``: ``"module:Class"`` of the task that feeds and evaluates it (None: the model
    trains without a data folder, through ``runner``, ``"module:function"``); ``metrics``:
    its Metric tuple, the first the default's; ``target`` and ``eval_every``: what a run
    uses when none is given; ``base_config`` and ``proxy``: the config and the overrides
    that make it converge in minutes on a 2-core CPU; ``data_parallel``: None, or the
    SHARDING kind its task reads a rank's share by.
    """

    def __init__(self, metrics, target, eval_every, proxy, base_config="paper", task=None,
                 runner=None, data_parallel=None):
        if (task is None) == (runner is None):
            raise ValueError("a training card names a task class or a runner, one of the two")
        if data_parallel is not None and data_parallel not in SHARDING:
            raise ValueError("data_parallel is None or one of {}, not {!r}".format(
                sorted(SHARDING), data_parallel))
        self.metrics, self.target, self.eval_every = tuple(metrics), target, eval_every
        self.proxy, self.base_config = dict(proxy), base_config
        self.task, self.runner, self.data_parallel = task, runner, data_parallel

    def task_class(self):
        return None if self.task is None else load(self.task)

    def run(self):
        return load(self.runner)

    @property
    def data_command(self):
        """The ``tbd data make`` command that writes its proxy data (None without a task)."""
        task = self.task_class()
        return None if task is None else task.data_command

    @property
    def sharding(self):
        return None if self.data_parallel is None else SHARDING[self.data_parallel]


class Benchmark:
    """What the suite sets when it runs the paper config on a CPU (tbdzoo/suite.py): the
    batch, and other hyperparameters where a smaller batch is not enough."""

    def __init__(self, cpu_batch_size=None, cpu_overrides=None):
        self.cpu_batch_size = cpu_batch_size
        self.cpu_overrides = dict(cpu_overrides or {})


class Consistency:
    """The model's cross-framework consistency case (tbdzoo/consistency.py): config
    ``overrides`` on top of tiny, the weights' ``seed``, ``tolerances`` that replace the
    shared ones per group, ``backend_overrides`` per backend, and ``replays_targets`` (the
    targets step runs once, on the reference, and every backend trains on its targets)."""

    def __init__(self, overrides=None, seed=0, tolerances=None, backend_overrides=None,
                 replays_targets=False):
        self.overrides, self.seed = dict(overrides or {}), seed
        self.tolerances = dict(tolerances or {})
        self.backend_overrides = dict(backend_overrides or {})
        self.replays_targets = replays_targets


class ImageInput:
    """A model fed by the image pipelines (tbdzoo/pipelines/): per-channel ``mean`` and
    ``std`` of its input on the [0, 1] scale (a config's own ``mean`` and ``std`` win)."""

    def __init__(self, mean, std):
        self.mean, self.std = tuple(mean), tuple(std)


class Measured:
    """Sizes of the ``config`` graph: trainable parameters and forward FLOPs per example
    (tbdzoo/profiling/flops.py); tests/test_model_cards.py recomputes them from the graph."""

    def __init__(self, parameters, flops_per_example, config="paper"):
        self.parameters, self.flops_per_example = parameters, flops_per_example
        self.config = config
