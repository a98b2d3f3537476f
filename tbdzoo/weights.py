"""The canonical checkpoint: an ``.npz`` of float32 arrays in canonical layouts plus a JSON
manifest (spec hash, layout, dtype, tensor list) stored inside it.

Loading never unpickles (``allow_pickle=False``) and validates everything before anything is
assigned, so a bad file leaves the model as it was.
"""
import json
import os
import zipfile
from collections import OrderedDict
from typing import Any, Dict, Mapping, Tuple, Union

import numpy as np

from .errors import WeightsError

PathLike = Union[str, bytes, "os.PathLike"]  # path_of's rule
Arrays = Dict[str, np.ndarray]

FORMAT = "tbdzoo-weights"
FORMAT_VERSION = 1
LAYOUT = "canonical-v1"  # see tbdzoo/spec/ops.py for what each layout is
_MANIFEST_KEY = "__manifest__"


def check(graph: Any, weights: Mapping[str, Any]) -> Arrays:
    """Raise WeightsError naming every missing, extra or mis-shaped tensor; return float32 copies.
    ``weights`` is a dict of canonical name -> array, as get_weights returns."""
    if isinstance(weights, (str, bytes)) or hasattr(weights, "__fspath__"):
        raise WeightsError("set_weights takes a dict of canonical name -> array, not the path "
                           "{!r}; read a weights file with load_weights(path)".format(
                               os.fspath(weights) if hasattr(weights, "__fspath__") else weights))
    if not (hasattr(weights, "keys") and hasattr(weights, "__getitem__")):
        raise WeightsError("weights must be a dict of canonical name -> array (as get_weights "
                           "returns) for model {!r}, with {} tensors such as {!r}; got {}; "
                           "nothing was loaded".format(graph.name, len(graph.params()),
                                                       next(iter(graph.params())),
                                                       _described(weights)))
    expected = graph.params()
    missing = [n for n in expected if n not in weights]
    extra = [n for n in weights if n not in expected]
    wrong = ["{} has shape {} but the model needs {}".format(
        n, tuple(np.shape(weights[n])), expected[n].shape)
        for n in expected if n in weights and tuple(np.shape(weights[n])) != expected[n].shape]
    problems = []
    if missing:
        problems.append("missing: " + ", ".join(missing))
    if extra:
        problems.append("not in the model: " + ", ".join(extra))
    if wrong:
        problems.append("; ".join(wrong))
    if problems:
        raise WeightsError("weights do not match model {!r}; nothing was loaded. {}".format(
            graph.name, ". ".join(problems)))
    out = OrderedDict()
    for n in expected:
        try:
            value = np.asarray(weights[n])
        except Exception as e:  # a framework's device tensor, say
            raise WeightsError("tensor {} is a {}, which NumPy cannot read ({}); give NumPy "
                               "arrays; nothing was loaded".format(n, type(weights[n]).__name__,
                                                                  e)) from e
        if not np.issubdtype(value.dtype, np.floating):
            raise WeightsError("tensor {} has dtype {}, expected a float; nothing was loaded".format(
                n, value.dtype))
        out[n] = np.ascontiguousarray(value, dtype=np.float32)
    return out


def _described(value):
    """A short description of a value given where weights were expected."""
    if value is None:
        return "None"
    if isinstance(value, (list, tuple)):
        return "a {} of {} item(s)".format(type(value).__name__, len(value))
    if isinstance(value, np.ndarray):
        return "an array of shape {}".format(value.shape)
    return "a {}".format(type(value).__name__)


def save(path: PathLike, graph: Any, weights: Mapping[str, Any]) -> None:
    """Write atomically: a crash mid-write never leaves a truncated checkpoint at ``path``."""
    weights = check(graph, weights)
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "layout": LAYOUT, "dtype": "float32",
        "model": graph.name, "spec_hash": graph.hash(),
        "tensors": [{"name": n, "shape": list(v.shape)} for n, v in weights.items()],
    }
    arrays = dict(weights)
    arrays[_MANIFEST_KEY] = np.frombuffer(json.dumps(manifest).encode("utf-8"), dtype=np.uint8)
    path = os.fspath(path)
    if not path.endswith(".npz"):
        raise WeightsError("weights files end in .npz (numpy would add it silently); got " + path)
    tmp = path + ".tmp.npz"
    np.savez(tmp, **arrays)
    os.replace(tmp, path)


def path_of(path: PathLike) -> str:
    """``path`` as a string, or WeightsError when it is not a path at all."""
    if not isinstance(path, (str, bytes)) and not hasattr(path, "__fspath__"):
        raise WeightsError("load_weights takes the path of a .npz weights file, not {}{}".format(
            _described(path), "; assign a dict of arrays with set_weights" if
            hasattr(path, "keys") else ""))
    path = os.fspath(path)
    return path.decode() if isinstance(path, bytes) else path


def read(path: PathLike) -> Tuple[Dict[str, Any], Arrays]:
    """Return (manifest, weights) from a file written by :func:`save`."""
    path = path_of(path)
    if not os.path.exists(path):
        raise WeightsError("no weights file at {}".format(path))
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = OrderedDict((k, data[k]) for k in data.files)
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
        raise WeightsError("{} is not a readable .npz weights file ({}: {})".format(
            path, type(e).__name__, e)) from e
    if _MANIFEST_KEY not in arrays:
        raise WeightsError("{} has no tbdzoo manifest; write it with save_weights".format(path))
    try:
        manifest = json.loads(arrays.pop(_MANIFEST_KEY).tobytes().decode("utf-8"))
    except ValueError as e:
        raise WeightsError("{}: the manifest is corrupt ({})".format(path, e)) from e
    if manifest.get("format") != FORMAT or manifest.get("layout") != LAYOUT:
        raise WeightsError("{}: format {!r} layout {!r}, expected {!r} {!r}".format(
            path, manifest.get("format"), manifest.get("layout"), FORMAT, LAYOUT))
    return manifest, arrays


def load(path: PathLike, graph: Any) -> Arrays:
    """Read and validate against ``graph``; the spec hash may differ (say, another dropout rate)
    as long as every tensor matches by name and shape."""
    manifest, arrays = read(path)
    if manifest.get("model") != graph.name:
        raise WeightsError("{} holds weights of model {!r}, not {!r}".format(
            path, manifest.get("model"), graph.name))
    return check(graph, arrays)


def save_arrays(path: PathLike, arrays: Mapping[str, Any]) -> None:
    """A plain array bundle (batches, gradients) for exchange between interpreters."""
    np.savez(os.fspath(path), **{k: np.asarray(v) for k, v in arrays.items()})


def load_arrays(path: PathLike) -> Arrays:
    with np.load(os.fspath(path), allow_pickle=False) as data:
        return OrderedDict((k, data[k]) for k in data.files)
