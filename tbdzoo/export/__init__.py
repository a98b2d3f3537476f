"""Standalone source of a model for one framework: ``tbdzoo.export`` and ``tbd export``.

The file written imports only its framework and NumPy, defines the model as that framework's
users write one (a class per block kind, built from the framework's own layers), and loads
tbdzoo's canonical weights file (``.npz``, tbdzoo/weights.py) next to it. The classes come
from the spec's tree of blocks (tbdzoo/spec/tree.py) through plan.py; what each layer and op
is in a framework comes from that backend's ``source.py``.
"""
import importlib
import importlib.util
import os
from typing import Any, List, Optional, Tuple

from .. import weights as _weights
from ..backends.info import BACKEND_NAMES
from ..backends.registry import build
from ..errors import TbdError, UnknownNameError
from ..models import get_model
from ..version import __version__
from ..weights import PathLike
from .plan import make_plan


class ExportError(TbdError, ValueError):
    """A model or path that export cannot write source for."""


def writers() -> List[str]:
    """The backends export can write source for (those whose folder has a source.py)."""
    out = []
    for name in BACKEND_NAMES:
        if importlib.util.find_spec("tbdzoo.backends.{}.source".format(name)) is not None:
            out.append(name)
    return out


def _emitter(backend):
    if backend not in BACKEND_NAMES:
        raise UnknownNameError("backend", backend, BACKEND_NAMES)
    known = writers()
    if backend not in known:
        raise ExportError("export cannot write {} source yet; it writes source for: {}".format(
            backend, ", ".join(known)))
    return importlib.import_module("tbdzoo.backends.{}.source".format(backend))


def _graph(model, config):
    """(graph, model name, config name) of a model name or a built model."""
    if isinstance(model, str):
        model_def = get_model(model)   # UnknownNameError for an unknown name
        return model_def.build_graph(model_def.hparams(config or "paper")), model, \
            config or "paper"
    spec = getattr(model, "spec", None)
    if spec is None or not hasattr(model, "get_weights"):
        raise ExportError("export takes a model name (one of tbdzoo.list_models()) or a model "
                          "tbdzoo.build made, not {}".format(type(model).__name__))
    name = getattr(getattr(model, "model_def", None), "name", spec.name)
    return spec, name, config or getattr(model, "config", None) or "custom"


def _initial_weights(model, backend, config, seed):
    """The canonical weights of a built model, or of the model ``model`` names, built."""
    if not isinstance(model, str):
        return model.get_weights()
    built = build(model, backend=backend, config=config, seed=seed)
    try:
        return built.get_weights()
    finally:
        built.close()


def export(model: Any, backend: str, path: PathLike, config: Optional[str] = None,
           weights: Optional[PathLike] = None, seed: int = 0) -> Tuple[str, str]:
    """Write ``model`` (a name, or a model from :func:`tbdzoo.build`) as ``backend`` source at
    ``path`` (a file, or a folder that gets ``<model>_<backend>.py``), and its weights as
    tbdzoo's ``.npz`` beside it (``<source name>.npz``). A name is built with ``config``
    (default 'paper') and ``seed``; ``weights``, a tbdzoo weights file of that model (say, a
    trained one), replaces the model's own. Returns (source path, weights path)."""
    emitter = _emitter(backend)
    if not isinstance(path, (str, bytes)) and not hasattr(path, "__fspath__"):
        raise ExportError("path must be a file or folder path, not {}".format(type(path).__name__))
    path = os.fspath(path)
    graph, name, config_name = _graph(model, config)
    plan = make_plan(graph, emitter)   # what the writer cannot write is refused here
    text = emitter.write(plan, name, config_name, __version__)
    if os.path.isdir(path):
        path = os.path.join(path, "{}_{}{}".format(name, backend, emitter.EXTENSION))
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ExportError("cannot write {}: folder {} does not exist; create it first".format(
            path, folder))
    weights_path = os.path.splitext(path)[0] + ".npz"
    if weights is not None:
        arrays = _weights.load(weights, graph)   # WeightsError naming what does not fit
    else:
        arrays = _initial_weights(model, backend, config_name, seed)
    try:
        with open(path, "w") as f:
            f.write(text)
        _weights.save(weights_path, graph, arrays)
    except OSError as e:
        raise ExportError("cannot write {}: {}; choose a folder you can write to".format(
            e.filename or path, e.strerror or e)) from e
    return path, weights_path


__all__ = ["export", "writers", "ExportError", "make_plan"]
