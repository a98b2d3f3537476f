"""Where each backend's interpreter lives and how to tell whether it is ready; which
environment a backend needs is declared with it (its BackendInfo).

CNTK 2.7 exists only for CPython 3.6, so it gets an environment of its own; the other three
share the main one. ``make env`` creates both (see the README).
"""
import importlib.util
import os
import sys

SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ENV_COMMANDS = {"main": "make env-main", "cntk": "make env-cntk"}
ENV_VARIABLES = {"main": "TBDZOO_MAIN_PYTHON", "cntk": "TBDZOO_CNTK_PYTHON"}
_DEFAULT_PYTHON = {"main": ".venv/bin/python", "cntk": ".venv-cntk/bin/python"}


def framework_of(backend):
    """The framework module of ``backend`` (its BackendInfo's ``framework``)."""
    from .registry import backend_info
    return backend_info(backend).framework


def environment_of(backend):
    """The environment ``backend`` runs in (its BackendInfo's ``environment``)."""
    from .registry import backend_info
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


def how_to_create(backend):
    env = environment_of(backend)
    return "create it with `{}` in {} (or point {} at an interpreter that has {})".format(
        ENV_COMMANDS[env], SOURCE_ROOT, ENV_VARIABLES[env], framework_of(backend))


def worker_environment():
    """os.environ for a worker: tbdzoo importable from the source tree, unbuffered output,
    TensorFlow's C++ logging quietened unless TBDZOO_VERBOSE asks for the frameworks' messages
    (it travels to the worker, whose backend then leaves its banners on too)."""
    from .common.quiet import verbose
    env = dict(os.environ)
    env["PYTHONPATH"] = SOURCE_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    if not verbose():
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env
