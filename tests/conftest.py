"""Shared fixtures. A backend whose environment is missing fails the run in CI (CI=true) and
is skipped, with the reason, only on a developer's machine."""
import os
import subprocess
import sys

import pytest

from tbdzoo.backends import BACKEND_NAMES, environments, list_backends

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# -- markers (registered in setup.cfg; `pytest -m unit` is the quick run) ----------------------
# backend: the test builds or runs a model on a framework. A test is one when its module calls
#   require_framework, when it asks for a framework fixture, when its code (nested functions
#   and the module's fixtures it requests included) calls one of BACKEND_CALLS or names a
#   framework module, or when it or its parameters name a backend (`tbd run ... --backend B`).
# slow: the modules below, whose tests take tens of seconds to minutes each on a 2-core host
#   (`pytest --durations`): worker processes, several backends per test, or training runs.
# gpu: a test parametrised with a CUDA device or marked by hand; skipped without a GPU.
# unit: everything else: no framework model, no GPU, seconds.
BACKEND_CALLS = {"require_backend", "require_framework", "build", "build_native", "run_in_env",
                 "random_weights"}
FRAMEWORK_NAMES = {"torch", "tensorflow", "tf", "keras", "mxnet", "mx", "cntk", "jax", "flax",
                   "optax", "nnx"}
FRAMEWORK_FIXTURES = {"one_torch_thread"}
SLOW_MODULES = {"test_a3c", "test_a3c_async", "test_atomic_steps", "test_bad_batches",
                "test_consistency", "test_distributed", "test_distributed_cntk", "test_distributed_data",
                "test_distributed_models", "test_distributed_mxnet", "test_gan_task", "test_training",
                "test_detection_task", "test_worker", "test_report", "test_pipelines",
                "test_datasets_make"}
SLOW_TIMEOUT = 1800  # seconds; setup.cfg's `timeout` (600) for the rest, UNIT_TIMEOUT for unit
UNIT_TIMEOUT = 120
_FRAMEWORK_MODULES = set()  # test modules that called require_framework at import


def _names_used(code):
    """The global and attribute names and the string constants of ``code`` and the functions
    defined in it."""
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _names_used(const)
        elif isinstance(const, str):
            names.add(const)
        elif isinstance(const, (tuple, frozenset)):
            names.update(c for c in const if isinstance(c, str))
    return names


def _param_strings(value):
    if isinstance(value, str):
        return {value}
    if isinstance(value, (list, tuple, set, frozenset)):
        return set().union(*(_param_strings(v) for v in value)) if value else set()
    if isinstance(value, dict):
        return _param_strings(list(value.keys()) + list(value.values()))
    return set()


def _is_backend_test(item):
    module = item.module
    if module.__name__ in _FRAMEWORK_MODULES or FRAMEWORK_FIXTURES & set(item.fixturenames):
        return True
    codes = [item.function.__code__]
    for name in item.fixturenames:  # the module's own fixtures: what the test runs before it
        fixture = getattr(module, name, None)
        wrapped = getattr(fixture, "__wrapped__", fixture)
        if callable(wrapped) and hasattr(wrapped, "__code__"):
            codes.append(wrapped.__code__)
    used = set().union(*(_names_used(c) for c in codes))
    params = getattr(getattr(item, "callspec", None), "params", {})
    used |= _param_strings(list(params.values()))
    return bool(used & (BACKEND_CALLS | FRAMEWORK_NAMES | set(BACKEND_NAMES)))


def _wants_gpu(item):
    params = getattr(getattr(item, "callspec", None), "params", {})
    return any(isinstance(v, str) and v.startswith("cuda") for v in params.values())


def pytest_collection_modifyitems(config, items):
    for item in items:
        if not isinstance(item, pytest.Function):
            continue
        if _wants_gpu(item):
            item.add_marker(pytest.mark.gpu)
        if item.module.__name__ in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
        backend = _is_backend_test(item)
        if backend:
            item.add_marker(pytest.mark.backend)
        if not backend and item.get_closest_marker("gpu") is None and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.unit)
        if item.get_closest_marker("timeout") is None:
            if item.get_closest_marker("slow") is not None:
                item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT))
            elif item.get_closest_marker("unit") is not None:
                item.add_marker(pytest.mark.timeout(UNIT_TIMEOUT))


def _cuda_available():
    import importlib.util
    if importlib.util.find_spec("torch") is None:
        return False
    import torch
    return torch.cuda.is_available()


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") is not None and not _cuda_available():
        pytest.skip("needs a CUDA GPU (PyTorch sees none)")


@pytest.fixture(autouse=True)
def environment_restored():
    """Each test starts from the session's environment: commands run in-process (``tbdzoo.rl``
    sets OMP_NUM_THREADS=1 for its frameworks) must not change what later tests' workers get."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def require_backend(name):
    info = {b["name"]: b for b in list_backends()}[name]
    if info["ready"]:
        return
    message = "backend {} is not ready: {}".format(name, info["fix"])
    if IN_CI:
        pytest.fail(message + " (CI must have every backend)")
    pytest.skip(message)


def run_in_env(python, args, timeout=1800):
    """Run ``python args`` with tbdzoo importable; return the completed process."""
    return subprocess.run([python] + list(args), env=environments.worker_environment(),
                          capture_output=True, timeout=timeout,
                          text=True)


def random_weights(model, seed=3):
    """Canonical weights drawn at random (positive variances), unlike any initial values, so a
    round trip or a layout conversion cannot pass by returning the initial weights."""
    from collections import OrderedDict

    import numpy as np
    rng = np.random.RandomState(seed)
    out = OrderedDict()
    for name, value in model.get_weights().items():
        noise = rng.standard_normal(value.shape).astype(np.float32)
        out[name] = np.abs(noise) + 0.5 if "running_var" in name else noise
    return out


def require_framework(module):
    """At the top of a backend's test module: skip without the framework, except in CI."""
    import importlib.util
    _FRAMEWORK_MODULES.add(sys._getframe(1).f_globals.get("__name__"))
    if importlib.util.find_spec(module) is not None:
        return
    message = "{} is not installed in this interpreter; create it with `make env-main`".format(module)
    if IN_CI:
        raise RuntimeError(message + " (CI must have every backend)")
    pytest.skip(message, allow_module_level=True)


@pytest.fixture(scope="module")
def one_torch_thread():
    """One PyTorch intra-op thread for a module of small models: on a loaded 2-core machine
    idle threads spinning beside the pipeline's make each small step many times slower (a
    proxy step takes 0.3-0.7 s instead of 0.08 s; docs/models.md)."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def main_python():
    return sys.executable
