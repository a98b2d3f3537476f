"""Where each backend's interpreter lives and how to tell whether it is ready; which
environment a backend needs is declared with it (its BackendInfo).

CNTK 2.7 exists only for CPython 3.6, and JAX's wheels need NumPy 2 while MXNet pins NumPy 1, so
each gets an environment of its own; the other three share the main one. ``make env`` creates
all three (see the README).
"""
import functools
import glob
import importlib.util
import os
import subprocess
import sys

from .common.quiet import verbose
from .info import backend_info

SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ENV_COMMANDS = {"main": "make env-main", "cntk": "make env-cntk", "jax": "make env-jax"}
ENV_VARIABLES = {"main": "TBDZOO_MAIN_PYTHON", "cntk": "TBDZOO_CNTK_PYTHON",
                 "jax": "TBDZOO_JAX_PYTHON"}
_DEFAULT_PYTHON = {"main": ".venv/bin/python", "cntk": ".venv-cntk/bin/python",
                   "jax": ".venv-jax/bin/python"}


def framework_of(backend):
    """The framework module of ``backend`` (its BackendInfo's ``framework``)."""
    return backend_info(backend).framework


def environment_of(backend):
    """The environment ``backend`` runs in (its BackendInfo's ``environment``)."""
    return backend_info(backend).environment


def importable_here(backend):
    """True when this interpreter can import the backend's framework (checked without importing)."""
    return importlib.util.find_spec(framework_of(backend)) is not None


def python_of(environment):
    """The interpreter of an environment: the variable if set, else the one ``make env`` made."""
    return os.environ.get(ENV_VARIABLES[environment]) or os.path.join(
        SOURCE_ROOT, _DEFAULT_PYTHON[environment])


def python_for(backend):
    if importable_here(backend):
        return sys.executable
    return python_of(environment_of(backend))


# The interpreter each environment needs, for an installed tbdzoo (no Makefile to run).
ENV_INSTALLS = {"main": "CPython 3.11 with `pip install 'tbdzoo[torch,tensorflow,mxnet]'`",
                "cntk": "CPython 3.6 with `pip install 'tbdzoo[cntk]'`",
                "jax": "CPython 3.11 with `pip install 'tbdzoo[jax]'`"}


def is_checkout():
    """Whether tbdzoo runs from its source tree (with the Makefile that creates environments),
    rather than from an installed copy."""
    return os.path.exists(os.path.join(SOURCE_ROOT, "Makefile"))


def how_to_create(backend):
    env = environment_of(backend)
    if not is_checkout():
        return "make an interpreter for it ({}) and point {} at it".format(
            ENV_INSTALLS[env], ENV_VARIABLES[env])
    return "create it with `{}` in {} (or point {} at an interpreter that has {})".format(
        ENV_COMMANDS[env], SOURCE_ROOT, ENV_VARIABLES[env], framework_of(backend))


def worker_environment():
    """os.environ for a worker: tbdzoo importable from the source tree, unbuffered output,
    TensorFlow's C++ logging quietened unless TBDZOO_VERBOSE asks for the frameworks' messages
    (it travels to the worker, whose backend then leaves its banners on too)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = SOURCE_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    if not verbose():
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


# The device a backend's model picks when none is named, asked of the backend's own class in
# its own environment (as a run's worker would build it), so this process imports no framework.
_DEVICE_PROBE = ("import sys\n"
                 "from tbdzoo.backends.registry import _native_class\n"
                 "model = _native_class(sys.argv[1])\n"
                 "print(model._resolve_device(model.__new__(model), None))\n")


def machine_has_gpu():
    """Whether any GPU device node exists; without one no framework can pick a GPU."""
    return bool(glob.glob("/dev/nvidia[0-9]*") or os.path.exists("/dev/dxg"))


@functools.lru_cache(maxsize=None)
def default_device(backend):
    """'cpu' or 'cuda:N': where ``backend`` runs when no device is named; None when its
    environment cannot say (the run itself then reports why)."""
    return ask_device(backend) if machine_has_gpu() else "cpu"


def ask_device(backend):
    """The backend's own choice of device, asked in its environment (importing its framework
    there takes seconds, so :func:`default_device` asks only on a machine with a GPU)."""
    try:
        proc = subprocess.run([python_for(backend), "-c", _DEVICE_PROBE, backend],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600,
                              env=worker_environment(), universal_newlines=True)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = proc.stdout.split()
    return lines[-1] if proc.returncode == 0 and lines else None


def on_gpu(backend, device=None):
    """Whether a run of ``backend`` on ``device`` (None: the backend's choice) uses a GPU."""
    return (device or default_device(backend) or "cpu").startswith("cuda")
