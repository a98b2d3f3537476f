"""Shared fixtures. A backend whose environment is missing fails the run in CI (CI=true) and
is skipped, with the reason, only on a developer's machine."""
import os
import subprocess
import sys

import pytest

from tbdzoo.backends import environments, list_backends

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


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


@pytest.fixture(scope="session")
def main_python():
    return sys.executable
