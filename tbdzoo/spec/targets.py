"""Targets functions: the non-differentiable step of a training program (docs/programs.md).

A program's ``targets`` step names one of these by its registered name, so the program stays
plain JSON. The backend calls it once per update that reads a written input, before the step's
updates, as ``function(values, inputs, hparams, rng)``:

  values   a :class:`HostValues` mapping {read node name: NumPy array (N, ...)} from the
           forward pass; each value is fetched from the device when first read, and
           ``values.shape(name)`` gives its shape without fetching it, so a function that does
           its input-only work first (detection: the anchor targets) does it while the device
           still computes (``value_shape(values, name)`` takes plain dicts too)
  inputs   {batch input name: NumPy array (N, ...)} the step names in ``inputs``
  hparams  the model's hyperparameters
  rng      a :class:`StepRandomState`: a ``numpy.random.RandomState`` seeded from (model
           seed, step, step name, update), whose ``stream(purpose, index)`` gives more
           streams of the same step (detection: one per sampler and image)

and it returns {written input name: NumPy array (N,) + the input's shape}, or a
:class:`DeviceArray` of that shape where a kernel the backend lent left the value on its device
(``stack_written`` stacks the per-example values either way). Functions register
with :func:`register_targets`; the module that defines one must be imported by the module that
builds the graph, so the CNTK worker, which builds the graph itself, registers it too.
Valid Python 3.6.
"""
import hashlib
from collections import OrderedDict
from collections.abc import Mapping

import numpy as np

_REGISTRY = OrderedDict()


def register_targets(name):
    """Decorator: register ``function`` under ``name`` (a string a program can store)."""
    if not isinstance(name, str) or not name:
        raise ValueError("a targets function's name must be a non-empty string, not {!r}"
                         .format(name))

    def decorate(function):
        known = _REGISTRY.get(name)
        if known is not None and _qualified(known) != _qualified(function):
            raise ValueError("targets function {!r} is already registered by {}".format(
                name, _qualified(known)))
        _REGISTRY[name] = function
        return function
    return decorate


def _qualified(function):
    return "{}.{}".format(getattr(function, "__module__", "?"),
                          getattr(function, "__qualname__", repr(function)))


def get(name):
    """The function registered as ``name``; KeyError naming the known ones otherwise."""
    if name not in _REGISTRY:
        raise KeyError("no targets function {!r} is registered; known: {}. Register it with "
                       "@register_targets({!r}) in a module the model's graph builder imports"
                       .format(name, ", ".join(_REGISTRY) or "none", name))
    return _REGISTRY[name]


def names():
    return list(_REGISTRY)


class HostValues(Mapping):
    """The values a targets function reads, as NumPy, each fetched when first read (a device
    copy waits for the device; later reads reuse it). ``shape(name)`` never fetches."""

    def __init__(self, fetchers, shapes):
        self._fetchers = OrderedDict(fetchers)
        self._shapes = OrderedDict((n, tuple(int(d) for d in s)) for n, s in shapes)
        self._fetched = {}

    @classmethod
    def of_arrays(cls, arrays):
        """Values already on the host: {name: array}."""
        arrays = OrderedDict((n, np.asarray(v)) for n, v in arrays.items())
        return cls(((n, (lambda v=v: v)) for n, v in arrays.items()),
                   ((n, v.shape) for n, v in arrays.items()))

    def __getitem__(self, name):
        if name not in self._fetched:
            self._fetched[name] = np.asarray(self._fetchers[name]())
        return self._fetched[name]

    def __iter__(self):
        return iter(self._fetchers)

    def __len__(self):
        return len(self._fetchers)

    def shape(self, name):
        """``values[name].shape``, without fetching the value."""
        return self._shapes[name]


class DeviceArray:
    """A value a lent kernel wrote and left on the device that computed it: the backend owning
    that device takes ``native`` as it is, so the graph op that reads it never waits for a
    round trip through the host; NumPy sees a host copy, made on first use (``__array__``).
    A framework subclasses it with ``_host_copy`` and ``stack``."""

    def __init__(self, native, dtype):
        self.native = native
        self.dtype = np.dtype(dtype)
        self._host = None

    @property
    def shape(self):
        return tuple(int(d) for d in self.native.shape)

    @property
    def ndim(self):
        return len(self.shape)

    def __len__(self):
        return self.shape[0]

    def __array__(self, dtype=None, copy=None):
        if self._host is None:
            self._host = np.asarray(self._host_copy(), dtype=self.dtype)
        return self._host if dtype is None else self._host.astype(dtype, copy=False)

    def _host_copy(self):
        raise NotImplementedError

    @classmethod
    def stack(cls, arrays):
        """``np.stack`` of same-class arrays, on their device."""
        raise NotImplementedError


def stack_written(values):
    """``np.stack`` of a targets function's per-example values; DeviceArrays of one class stay
    on their device."""
    values = list(values)
    kinds = {type(v) for v in values}
    if len(kinds) == 1 and issubclass(kinds.pop(), DeviceArray):
        return type(values[0]).stack(values)
    return np.stack([np.asarray(v) for v in values])


def value_shape(values, name):
    """The shape of ``values[name]``, without fetching it from a HostValues (plain dicts of
    arrays, as tests and direct callers pass, work too)."""
    if isinstance(values, HostValues):
        return values.shape(name)
    return np.shape(values[name])


def seeded_rng(run_seed, step, purpose, index=0):
    """A RandomState seeded from (run seed, step, purpose, index): each purpose and index its
    own stream, so one sampler's draws never shift another's. RandomState's stream is frozen
    across NumPy versions, so the CNTK worker (NumPy 1.19) and the main environment draw the
    same numbers."""
    return np.random.RandomState(_seed_words(run_seed, step, purpose, index))


def _seed_words(run_seed, step, purpose, index):
    digest = hashlib.sha256("{}/{}".format(purpose, int(index)).encode("utf-8")).digest()
    words = [int(run_seed) & 0xFFFFFFFF, int(step) & 0xFFFFFFFF]
    return words + [int.from_bytes(digest[i:i + 4], "little") for i in range(0, 16, 4)]


class StepRandomState(np.random.RandomState):
    """The RandomState a targets function gets: seeded from (run seed, step, "targets/<step
    name>", update index), and :meth:`stream` for a function that needs several independent
    streams in one step (docs/detection.md: one per sampler and image)."""

    def __init__(self, run_seed, step, purpose, index=0):
        np.random.RandomState.__init__(self, _seed_words(run_seed, step, purpose, index))
        self.run_seed, self.step = int(run_seed), int(step)

    def stream(self, purpose, index=0):
        """``seeded_rng(run seed, step, purpose, index)``: the same for every update of the step."""
        return seeded_rng(self.run_seed, self.step, purpose, index)
