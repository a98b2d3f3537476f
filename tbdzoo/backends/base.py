"""The interface every backend's model offers, and the parts of it that are the same everywhere.

A backend subclasses :class:`BackendModel` and implements the underscored methods, all in
canonical NumPy at the boundary:

  _build(weights)                 create ``self.native`` holding ``weights`` (canonical dict)
  _prepare(batch)                 NumPy batch -> whatever the native step consumes
  _train_step(prepared, lr)       one optimizer step; returns the loss as a float
  _predict(prepared)              inference-mode output of the graph's output node, NumPy
  _loss_and_gradients(prepared)   training-mode loss and canonical gradients, no update
  _get_weights()                  canonical dict of every parameter and statistic
  _set_weights(weights)           assign a validated canonical dict

The optimizers every backend implements are defined once (tbdzoo/backends/common/optimizers.py)
so that three steps on any backend give the same trajectory. :func:`check_buildable` is the one
construction check, run by in-process models, worker-backed ones (before the worker starts) and
the worker itself.
"""
import importlib
import time
from collections import OrderedDict

import numpy as np

from .. import schedules, weights as weights_io
from ..spec import initial_weights
from .common import op_support, optimizers

OPTIMIZERS = optimizers.NAMES  # their formulas: tbdzoo/backends/common/optimizers.py


def check_buildable(model_def, hparams, backend):
    """The spec of ``model_def`` under ``hparams``, once every check that needs no framework
    has passed: the optimizer and schedule exist, and ``backend`` implements every op."""
    spec = model_def.build_graph(hparams)
    optimizers.check(hparams)
    schedules.check(hparams)
    op_support.check(spec, backend)
    return spec


class Prepared(object):
    """A batch already converted for one backend, so timed steps measure only the step."""

    __slots__ = ("backend", "native", "items")

    def __init__(self, backend, native, items):
        self.backend, self.native, self.items = backend, native, items


class BackendModel(object):
    backend = None
    # The values of the execution options (tbdzoo/models/registry.py) this backend honours.
    OPTIONS = {"precision": ("fp32",), "execution": ("default",),
               "memory_format": ("auto", "channels_first")}

    def __init__(self, model_def, hparams, seed=0, device=None):
        self.device = self._resolve_device(device)
        self.model_def = model_def
        self.name = model_def.name
        self.hparams = hparams
        self.seed = seed
        self.spec = check_buildable(model_def, hparams, self.backend)
        self._check_options(hparams)
        self.step_count = 0
        self.native = None
        from ..profiling.profile import resident_bytes
        self.rss_before_build = resident_bytes()
        start = time.perf_counter()
        self._build(initial_weights(self.spec, seed))
        self.build_seconds = time.perf_counter() - start

    def __repr__(self):
        return "<tbdzoo {} on {} ({} config, {:,} parameters)>".format(
            self.name, self.backend, self.hparams["config"], self.spec.trainable_count())

    # -- data -----------------------------------------------------------------------
    def synthetic_batch(self, seed=0, batch_size=None):
        """NumPy arrays keyed by the spec's input names, canonical layouts."""
        return self.model_def.synthetic_batch(self.hparams, batch_size or self.hparams["batch_size"],
                                              seed)

    def prepare_batch(self, batch):
        if isinstance(batch, Prepared):
            if batch.backend != self.backend:
                raise ValueError("batch was prepared for {}, not {}".format(batch.backend,
                                                                           self.backend))
            return batch
        self._check_batch(batch)
        return Prepared(self.backend, self._prepare(batch), self.model_def.items(self.hparams, batch))

    def _check_batch(self, batch):
        for inp in self.spec.inputs.values():
            if inp.name not in batch:
                raise ValueError("batch lacks {!r}; the model takes {}".format(
                    inp.name, ", ".join(self.spec.inputs)))
            shape = tuple(np.shape(batch[inp.name])[1:])
            if shape != inp.shape:
                raise ValueError("batch[{!r}] has per-example shape {}, expected {}".format(
                    inp.name, shape, inp.shape))

    # -- training and inference ------------------------------------------------------
    def learning_rate(self):
        return schedules.learning_rate(self.hparams, self.step_count)

    def train_step(self, batch, sync=True):
        """One optimizer step with the scheduled learning rate; returns the loss (a float).

        ``sync=False`` lets a backend with an asynchronous device queue the step and return
        None without waiting (timed loops sync once per repeat; see :meth:`synchronize`).
        """
        prepared, lr = self.prepare_batch(batch), self.learning_rate()
        if not sync and hasattr(self, "_train_step_async"):
            self._train_step_async(prepared, lr)
            self.step_count += 1
            return None
        loss = self._train_step(prepared, lr)
        self.step_count += 1
        return float(loss)

    def synchronize(self):
        """Wait until every queued step has finished (a no-op on synchronous backends)."""

    def train_steps(self, batch, steps):
        """``steps`` optimizer steps on one batch; returns their losses."""
        prepared = self.prepare_batch(batch)
        return [self.train_step(prepared) for _ in range(steps)]

    def predict(self, batch):
        return np.asarray(self._predict(self.prepare_batch(batch)))

    def loss_and_gradients(self, batch):
        """Training-mode loss and per-parameter gradients (canonical), without a step."""
        loss, grads = self._loss_and_gradients(self.prepare_batch(batch))
        return float(loss), OrderedDict((k, np.asarray(grads[k])) for k in self.trainable_names())

    def trainable_names(self):
        return [n for n, p in self.spec.params().items() if p.trainable]

    # -- weights ------------------------------------------------------------------------
    def get_weights(self):
        return self._get_weights()

    def set_weights(self, weights):
        self._set_weights(weights_io.check(self.spec, weights))

    def save_weights(self, path):
        weights_io.save(path, self.spec, self.get_weights())

    def load_weights(self, path):
        self._set_weights(weights_io.load(path, self.spec))

    # -- measuring -------------------------------------------------------------------------
    @property
    def framework(self):
        from .environments import framework_of
        return framework_of(self.backend)

    def framework_version(self):
        return getattr(importlib.import_module(self.framework), "__version__", None)

    def measure_memory(self, prepared):
        """Measured memory categories in bytes (docs/records.md), for the ones this framework
        can report; the profiler fills the rest from the spec. Default: none."""
        return {}

    def close(self):
        """Release what the model holds; a worker-backed model stops its process."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- for subclasses -------------------------------------------------------------------
    def _check_options(self, hparams):
        from ..errors import UnsupportedOptionError
        for option, allowed in sorted(self.OPTIONS.items()):
            if hparams[option] not in allowed:
                raise UnsupportedOptionError(
                    "{} {!r} is not available on backend {} (on {}); it supports: {}".format(
                        option, hparams[option], self.backend, self.device, ", ".join(allowed)))

    def _resolve_device(self, device):
        """The device string ('cpu', 'cuda:0'); backends with accelerators override this."""
        if device not in (None, "cpu"):
            from ..errors import UnsupportedOptionError
            raise UnsupportedOptionError("backend {} runs on the CPU only here; device {!r} "
                                         "is not available".format(self.backend, device))
        return "cpu"

    def _build(self, weights):
        raise NotImplementedError

    def _prepare(self, batch):
        raise NotImplementedError

    def _train_step(self, prepared, lr):
        raise NotImplementedError

    def _predict(self, prepared):
        raise NotImplementedError

    def _loss_and_gradients(self, prepared):
        raise NotImplementedError

    def _get_weights(self):
        raise NotImplementedError

    def _set_weights(self, weights):
        raise NotImplementedError
