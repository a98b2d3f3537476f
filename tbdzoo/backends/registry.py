"""``build``: a model definition plus a backend gives a native model or a worker-backed one."""
import os
import sys
from collections import OrderedDict
from typing import Any, Dict, List, Optional

from ..errors import BackendUnavailableError
from ..models import get_model
from . import environments
from .base import BackendModel
from .info import backend_info, backend_infos, check_backend
from .remote import RemoteModel


def build(name: str, backend: str = "torch", config: str = "paper", seed: int = 0, isolate: bool = False,
          device: Optional[str] = None, **overrides: Any) -> BackendModel:
    """Build model ``name`` on ``backend`` with the ``config``'s hyperparameters.

    The model is native (a ``keras.Model``, Gluon ``HybridBlock``, ``cntk.Function`` or
    ``torch.nn.Module`` as ``.native``) when this interpreter has the framework; otherwise, or
    with ``isolate=True``, it runs in a worker process in the backend's environment.
    ``device`` is 'cpu' or 'cuda:N'; by default the backend's best available device.
    """
    check_backend(backend)
    model_def = get_model(name)
    hparams = model_def.hparams(config, **overrides)
    if isolate or not environments.importable_here(backend):
        return RemoteModel(model_def, hparams, seed, backend, device=device)
    return _native_class(backend)(model_def, hparams, seed, device=device)


def build_native(name: str, backend: str, config: str = "paper", seed: int = 0, device: Optional[str] = None,
                 **overrides: Any) -> BackendModel:
    """Build in this interpreter or fail saying which environment has the framework."""
    check_backend(backend)
    model_def = get_model(name)
    hparams = model_def.hparams(config, **overrides)
    return _native_class(backend)(model_def, hparams, seed, device=device)


def _native_class(backend):
    if not environments.importable_here(backend):
        raise BackendUnavailableError(
            "backend {!r} needs {}, which this interpreter ({}) cannot import; {}".format(
                backend, environments.framework_of(backend), sys.executable,
                environments.how_to_create(backend)))
    return backend_info(backend).load("model").Model


def list_backends() -> List[Dict[str, Any]]:
    """Each backend, where it runs from here and whether that environment is ready."""
    out = []
    for info in backend_infos():
        backend, framework, env = info.name, info.framework, info.environment
        here = environments.importable_here(backend)
        python = environments.python_for(backend)
        ready = here or os.path.exists(python)
        out.append(OrderedDict([
            ("name", backend), ("framework", framework), ("environment", env),
            ("ready", ready), ("runs", "in-process" if here else "worker"),
            ("python", python), ("fix", None if ready else environments.how_to_create(backend)),
        ]))
    return out
