"""Every backend against the PyTorch reference (docs/consistency.md).

One process writes the reference files; each backend then runs every case in ONE process in
its own environment (CNTK: CPython 3.6), and each case becomes a test here.
"""
import json
import os

import pytest

from tbdzoo import consistency
from tbdzoo.backends import environments

from conftest import require_backend, run_in_env

CASES = list(consistency.cases())
OTHER_BACKENDS = ["tensorflow", "mxnet", "cntk"]


@pytest.fixture(scope="session")
def reference_dir(tmp_path_factory, main_python):
    directory = str(tmp_path_factory.mktemp("reference"))
    proc = run_in_env(main_python, ["-m", "tbdzoo.consistency", "record", "--dir", directory])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return directory


_results = {}


def backend_results(backend, reference_dir, tmp_path_factory):
    """Run the backend's whole check once, in its environment; cache the per-case failures."""
    if backend not in _results:
        require_backend(backend)
        out = str(tmp_path_factory.mktemp("check") / "{}.json".format(backend))
        proc = run_in_env(environments.python_for(backend),
                          ["-m", "tbdzoo.consistency", "check", "--backend", backend,
                           "--dir", reference_dir, "--out", out])
        if not os.path.exists(out):
            pytest.fail("the {} check crashed (exit {}):\n{}".format(
                backend, proc.returncode, proc.stderr[-3000:]))
        with open(out) as f:
            _results[backend] = json.load(f)
    return _results[backend]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("backend", OTHER_BACKENDS)
def test_backend_matches_reference(backend, case, reference_dir, tmp_path_factory):
    failures = backend_results(backend, reference_dir, tmp_path_factory)[case]
    assert failures == [], "\n".join(failures)


def test_the_comparison_catches_a_wrong_backend(reference_dir):
    """The harness itself: a perturbed result must fail every tier it touches."""
    import numpy as np
    from tbdzoo.weights import load_arrays
    arrays = load_arrays(os.path.join(reference_dir, "resnet50.npz"))
    record = {k[len("record/"):]: v for k, v in arrays.items() if k.startswith("record/")}
    assert consistency.compare(record, dict(record)) == []
    bad = dict(record)
    bad["forward"] = record["forward"] * (1 + 1e-3)
    bad["grad/fc.weight"] = record["grad/fc.weight"][::-1].copy()
    bad["trajectory"] = record["trajectory"] + np.array([0, 0, 2e-3])
    failures = consistency.compare(record, bad)
    assert [f.split(":")[0] for f in failures] == ["forward", "grad/fc.weight", "trajectory"]
