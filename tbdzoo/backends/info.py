"""What the shared code knows about each backend: the ``BackendInfo`` each backend folder
declares (``tbdzoo/backends/<name>/__init__.py`` defines ``BACKEND``) and the lookup by name.
Imports no framework and no other part of tbdzoo but its errors, so every layer may read it.
Valid Python 3.6 (the CNTK worker reads it)."""
import importlib

from ..errors import UnknownNameError

# The backend folders, in the order tables list them; each declares its BackendInfo as
# ``BACKEND`` in its __init__.py (named as its folder), which imports no framework.
BACKEND_NAMES = ["torch", "tensorflow", "mxnet", "cntk", "jax"]


class BackendInfo:
    """What the shared code knows about one backend, declared once in its folder
    (``tbdzoo/backends/<name>/__init__.py`` defines ``BACKEND``); the registry reads it, and
    nothing outside the folder names the backend to decide how it behaves.

    Reading a descriptor imports no framework: the modules it names are strings, imported by
    :meth:`load` when first needed (a name without dots lies in the backend's folder).

      name                   the backend's name, as ``build(..., backend=name)`` takes it
      framework              the module whose presence makes the backend buildable here
      imports                the top-level modules that only this folder imports (the
                             framework and its companions: torchvision, keras)
      environment            the environment that has the framework ("main" or "cntk";
                             tbdzoo/backends/environments.py)
      model                  the module defining the backend's ``Model``
      pipeline               the module of its input pipeline (tbdzoo/pipelines/__init__.py)
      feeds_from_here        False, or why its environment cannot decode images (a
                             sentence): then its pipeline runs in the calling process and
                             each batch goes to the worker as arrays, and its data-parallel
                             ranks, which run in that environment, read no image data sets
      async_learners         the module whose ``train(job)`` runs A3C's asynchronous learners
      async_learners_on_gpu  whether those learners may hold their copies on a GPU
      distributed_engine     the module of its data-parallel engine (tbdzoo/distributed/rank.py)
      broadcasts             whether its ranks can hand rank 0's stop decision to each other
                             (else a data-parallel run needs a step budget agreed in advance)
      gpu                    the module whose ``device_uuid(ordinal)`` names the framework's
                             CUDA device for the GPU sampler, or None when it names none
    """

    def __init__(self, name, framework, environment, imports=None, model="model",
                 pipeline="pipeline", feeds_from_here=False, async_learners="async_learners",
                 async_learners_on_gpu=False, distributed_engine="distributed", broadcasts=True,
                 gpu=None):
        self.name, self.framework, self.environment = name, framework, environment
        self.imports = tuple(imports) if imports else (framework,)
        self.model, self.pipeline, self.feeds_from_here = model, pipeline, feeds_from_here
        self.async_learners, self.async_learners_on_gpu = async_learners, async_learners_on_gpu
        self.distributed_engine, self.broadcasts, self.gpu = distributed_engine, broadcasts, gpu

    @property
    def package(self):
        return __name__.rsplit(".", 1)[0] + "." + self.name

    def module_path(self, field):
        """The dotted path of the module that ``field`` (e.g. "pipeline") names."""
        name = getattr(self, field)
        if name is None:
            raise ValueError("backend {} declares no {}".format(self.name, field))
        return name if "." in name else self.package + "." + name

    def load(self, field):
        """Import the module that ``field`` names (this may import the framework)."""
        return importlib.import_module(self.module_path(field))

    def __repr__(self):
        return "BackendInfo({!r})".format(self.name)


def check_backend(backend):
    """Raise UnknownNameError, listing the backends, unless ``backend`` is one of them."""
    if backend not in BACKEND_NAMES:
        raise UnknownNameError("backend", backend, BACKEND_NAMES)


def backend_info(backend):
    """The BackendInfo that ``tbdzoo/backends/<backend>/__init__.py`` declares."""
    check_backend(backend)
    return importlib.import_module(__package__ + "." + backend).BACKEND


def backend_infos():
    """Every backend's BackendInfo, in BACKEND_NAMES order."""
    return [backend_info(b) for b in BACKEND_NAMES]
