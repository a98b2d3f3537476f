"""tbdzoo: training benchmarks of DNN models, written once, on four frameworks."""
from .backends import build, list_backends
from .errors import BackendUnavailableError, TbdError, UnknownNameError, WeightsError, WorkerError
from .export import export
from .models import get_model, list_models
from .profiling.profile import profile
from .version import __version__

__all__ = ["build", "export", "list_models", "list_backends", "get_model", "profile", "TbdError", "UnknownNameError",
           "BackendUnavailableError", "WeightsError", "WorkerError", "__version__"]
