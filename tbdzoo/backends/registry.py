"""``build``: a model definition plus a backend gives a native model or a worker-backed one."""
import importlib
import os
import sys
from collections import OrderedDict

from ..errors import BackendUnavailableError, UnknownNameError
from ..models import get_model
from . import environments

# The backend folders, in the order tables list them; each declares its BackendInfo as
# ``BACKEND`` in its __init__.py (named as its folder), which imports no framework.
BACKEND_NAMES = ["torch", "tensorflow", "mxnet", "cntk"]


def _check_backend(backend):
    if backend not in BACKEND_NAMES:
        raise UnknownNameError("backend", backend, BACKEND_NAMES)


def backend_info(backend):
    """The BackendInfo that ``tbdzoo/backends/<backend>/__init__.py`` declares."""
    _check_backend(backend)
    return importlib.import_module(__package__ + "." + backend).BACKEND


def backend_infos():
    """Every backend's BackendInfo, in BACKEND_NAMES order."""
    return [backend_info(b) for b in BACKEND_NAMES]


def build(name, backend="torch", config="paper", seed=0, isolate=False, device=None, **overrides):
    """Build model ``name`` on ``backend`` with the ``config``'s hyperparameters.

    The model is native (a ``keras.Model``, Gluon ``HybridBlock``, ``cntk.Function`` or
    ``torch.nn.Module`` as ``.native``) when this interpreter has the framework; otherwise, or
    with ``isolate=True``, it runs in a worker process in the backend's environment.
    ``device`` is 'cpu' or 'cuda:N'; by default the backend's best available device.
    """
    _check_backend(backend)
    model_def = get_model(name)
    hparams = model_def.hparams(config, **overrides)
    if isolate or not environments.importable_here(backend):
        from .remote import RemoteModel
        return RemoteModel(model_def, hparams, seed, backend, device=device)
    return _native_class(backend)(model_def, hparams, seed, device=device)


def build_native(name, backend, config="paper", seed=0, device=None, **overrides):
    """Build in this interpreter or fail saying which environment has the framework."""
    _check_backend(backend)
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


def list_backends():
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
