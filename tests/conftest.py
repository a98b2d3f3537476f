"""Shared fixtures. A backend whose environment is missing fails the run in CI (CI=true) and
is skipped, with the reason, only on a developer's machine."""
import os
import subprocess
import sys

import pytest

from tbdzoo.backends import environments, list_backends

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


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
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                          universal_newlines=True)


def random_weights(model, seed=3):
    """Canonical weights drawn at random (positive variances), unlike any initial values, so a
    round trip or a layout conversion cannot pass by returning the initial weights."""
    import numpy as np
    from collections import OrderedDict
    rng = np.random.RandomState(seed)
    out = OrderedDict()
    for name, value in model.get_weights().items():
        noise = rng.standard_normal(value.shape).astype(np.float32)
        out[name] = np.abs(noise) + 0.5 if "running_var" in name else noise
    return out


def require_framework(module):
    """At the top of a backend's test module: skip without the framework, except in CI."""
    import importlib.util
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
