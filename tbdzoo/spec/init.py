"""Initial values in NumPy, seeded from (global seed, parameter name).

Every backend loads these values, so initial weights are identical everywhere, and adding or
renaming one parameter leaves the others' values unchanged.
"""
import hashlib
from collections import OrderedDict

import numpy as np


def _rng(seed, name):
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return np.random.RandomState([int(seed) & 0xFFFFFFFF] + [
        int.from_bytes(digest[i:i + 4], "little") for i in range(0, 16, 4)])


def _fans(shape):
    if len(shape) == 1:
        return shape[0], shape[0]
    receptive = 1
    for d in shape[2:]:
        receptive *= d
    return shape[1] * receptive, shape[0] * receptive  # canonical (out, in, ...) layouts


def initial_value(param, seed):
    return _value(param.name, param.shape, tuple(param.init), seed)


def _value(name, shape, init, seed):
    kind, args = init[0], init[1:]
    if kind == "shifted":  # ("shifted", c, inner): inner's value plus c (an LSTM forget bias)
        return (_value(name, shape, tuple(args[1]), seed) + np.float32(args[0])).astype(np.float32)
    if kind == "zeros":
        return np.zeros(shape, np.float32)
    if kind == "ones":
        return np.ones(shape, np.float32)
    if kind == "constant":
        return np.full(shape, args[0], np.float32)
    rng = _rng(seed, name)
    fan_in, fan_out = _fans(shape)
    if kind == "he_normal":
        fan = fan_out if args and args[0] == "fan_out" else fan_in
        value = rng.normal(0.0, (2.0 / fan) ** 0.5, shape)
    elif kind == "uniform":
        value = rng.uniform(-args[0], args[0], shape)
    elif kind == "xavier_uniform":
        bound = (6.0 / (fan_in + fan_out)) ** 0.5
        value = rng.uniform(-bound, bound, shape)
    elif kind == "normal":
        value = rng.normal(0.0, args[0], shape)
    else:
        raise ValueError("parameter {}: unknown initialiser {!r}".format(name, kind))
    return value.astype(np.float32)


def initial_weights(graph, seed=0):
    """Canonical name -> float32 array for every parameter and statistic of the graph."""
    return OrderedDict((name, initial_value(p, seed)) for name, p in graph.params().items())
