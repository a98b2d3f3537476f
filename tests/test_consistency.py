"""Every backend, PyTorch included, against the NumPy reference (docs/consistency.md), through
`tbd consistency`.

The reference files are written once by ``tbd consistency record``; each backend then runs
every case from this process (CNTK through its worker), and each (backend, case) pair becomes
a test. The command itself is checked too: its tables, its exit status on a perturbed reference
and its refusal when no reference was recorded.
"""
import os

import numpy as np
import pytest

from conftest import require_backend
from tbdzoo import cli, consistency
from tbdzoo.weights import load_arrays, save_arrays

CASES = list(consistency.cases())
BACKENDS = ["torch", "tensorflow", "mxnet", "cntk", "jax"]


@pytest.fixture(scope="session")
def reference_dir(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("reference"))
    assert cli.main(["consistency", "record", "--dir", directory]) == 0
    assert sorted(os.listdir(directory)) == sorted(
        c.replace("/", "__") + ".npz" for c in CASES)
    return directory


_results = {}


def backend_rows(backend, case, reference_dir):
    """The backend's rows for every case, run once per backend and cached."""
    if backend not in _results:
        require_backend(backend)
        rows = {}
        for name, spec in consistency.cases().items():
            try:
                rows[name] = consistency.check_case(name, spec, backend, reference_dir)
            except Exception as e:  # noqa: BLE001  (one broken case must not hide the others)
                rows[name] = [consistency.Row("run", str(e), "", False,
                                              ["{}: {}".format(type(e).__name__, e)])]
        _results[backend] = rows
    return _results[backend][case]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_matches_reference(backend, case, reference_dir):
    rows = backend_rows(backend, case, reference_dir)
    failures = [f for row in rows for f in row.failures]
    assert failures == [], "\n".join(failures)
    quantities = [row.quantity for row in rows]
    for quantity in ("forward", "loss", "gradient directions", "first-step loss",
                     "later losses"):
        assert any(q.startswith(quantity) for q in quantities), quantity
    pairwise = any(q.startswith("torch gradients") for q in quantities)
    assert pairwise == (backend != "torch")


def test_every_model_is_a_case():
    from tbdzoo.models import list_models
    assert [m for m in list_models() if m not in CASES] == []


def _recorded(reference_dir, name):
    arrays = load_arrays(os.path.join(reference_dir, name.replace("/", "__") + ".npz"))
    record = {k[len("record/"):]: v for k, v in arrays.items() if k.startswith("record/")}
    record.pop("steps")
    return record


def _agreeing(record):
    """A reference side with a trajectory (three steps from the recorded losses) and the
    results of a backend that agrees with it exactly."""
    expected = dict(record)
    for key in [k for k in record if k == "loss" or k.startswith("loss/")]:
        expected["trajectory" + key[len("loss"):]] = record[key] * np.array([1.0, 0.9, 0.8])
    other = {k: v for k, v in expected.items() if not k.startswith("pairwise/")}
    other.update((k[len("pairwise/"):], v) for k, v in record.items()
                 if k.startswith("pairwise/"))
    other["derivative_norm"] = np.ones_like(record["derivative"])
    return expected, other


def test_the_comparison_catches_a_wrong_backend(reference_dir):
    """The harness itself: a perturbed result must fail every tier it touches, and a first-step
    loss 2e-5 off (relative) must fail on every case, whatever its own tolerance."""
    expected, other = _agreeing(_recorded(reference_dir, "resnet50"))
    rows = consistency.reference_rows(expected, other)
    assert [r.quantity for r in rows if not r.passed] == []
    bad = dict(other)
    bad["forward"] = other["forward"] * (1 + 1e-3)
    bad["derivative"] = other["derivative"] + np.array([0, 2e-3] + [0] * (len(
        other["derivative"]) - 2)) * np.abs(other["derivative"]).max()
    bad["grad/fc.weight"] = other["grad/fc.weight"][::-1].copy()
    bad["trajectory"] = other["trajectory"] + np.array([0, 0, 2e-3])
    failures = [f for r in consistency.reference_rows(expected, bad) for f in r.failures]
    assert [f.split(":")[0] for f in failures] == [
        "forward", "gradient direction 1", "later losses", "grad/fc.weight", "grad/fc.weight"]
    for name, case in consistency.cases().items():
        expected, other = _agreeing(_recorded(reference_dir, name))
        tolerances = consistency.tolerances_of(case)
        for key in [k for k in expected if k.startswith("trajectory")]:
            off = dict(other)
            off[key] = other[key] * np.array([1 + 2e-5, 1, 1])
            rows = consistency.reference_rows(expected, off, tolerances)
            assert [r.quantity for r in rows if not r.passed] == [
                "first-step loss" + key[len("trajectory"):]], name


def test_the_directions_catch_a_gradient_off_in_one_tensor(reference_dir):
    """A backend's gradient wrong in one tensor only (its first layer's, 1% too large) moves
    a direction that crosses that tensor beyond its tolerance, and no other."""
    case = consistency.cases()["probe/conv2d"]
    ref = consistency.reference_model(case)
    record = _recorded(reference_dir, "probe/conv2d")
    grads = {k[len("pairwise/grad/"):]: v for k, v in record.items()
             if k.startswith("pairwise/grad/")}
    dots, norms = consistency.projections(ref, grads)
    row = consistency._direction_row(record["derivative"], dots, norms,
                                     consistency.TOLERANCES["directions"])
    assert row.passed, row.failures
    first = next(iter(grads))
    wrong = dict(grads, **{first: grads[first] * 1.01})
    dots, norms = consistency.projections(ref, wrong)
    row = consistency._direction_row(record["derivative"], dots, norms,
                                     consistency.TOLERANCES["directions"])
    crossing = [i for i, (_, d) in enumerate(consistency.directions(ref)) if first in d]
    failed = [int(f.split(":")[0].split()[-1]) for f in row.failures]
    assert failed and set(failed) <= set(crossing)


def test_check_prints_a_table_per_case_and_a_summary(reference_dir, capsys):
    code = cli.main(["consistency", "check", "--dir", reference_dir,
                     "--cases", "probe/conv2d,probe/max*", "--backends", "mxnet"])
    out = capsys.readouterr().out
    assert code == 0, out
    for case in ("probe/conv2d", "probe/maxpool2d"):
        assert "{} on mxnet".format(case) in out
    for quantity in ("forward", "loss", "gradient directions (", "torch gradients (",
                     "torch gradient cosine", "first-step loss", "later losses", "PASS"):
        assert quantity in out
    assert "FAIL" not in out
    assert "PASS: 2 of 2 (case, backend) pairs passed" in out


def test_check_fails_on_a_perturbed_reference(reference_dir, tmp_path, capsys):
    """An edited reference (its loss 2e-5 higher, relative) fails the check: exit status 1,
    the row and the case marked FAIL."""
    directory = str(tmp_path)
    name = "probe__conv2d.npz"
    arrays = load_arrays(os.path.join(reference_dir, name))
    arrays["record/loss"] = arrays["record/loss"] * (1 + 2e-5)
    save_arrays(os.path.join(directory, name), arrays)
    code = cli.main(["consistency", "check", "--dir", directory, "--cases", "probe/conv2d",
                     "--backends", "mxnet"])
    out = capsys.readouterr().out
    assert code == 1
    line = next(l for l in out.splitlines() if l.split()[1:2] == ["loss"])
    assert "FAIL" in line and "2e-05 relative" in line
    assert "FAIL: 0 of 1 (case, backend) pairs passed" in out
    assert "failed: probe/conv2d on mxnet" in out


def test_check_without_a_reference_says_to_record_one(tmp_path, capsys):
    code = cli.main(["consistency", "check", "--dir", str(tmp_path), "--cases", "resnet50",
                     "--backends", "mxnet"])
    err = capsys.readouterr().err
    assert code == 2
    assert "no reference files in {}".format(tmp_path) in err
    assert "run `tbd consistency record --dir {} --cases resnet50` first".format(tmp_path) in err


def test_unknown_cases_and_backends_are_refused_by_name(tmp_path, capsys):
    assert cli.main(["consistency", "record", "--dir", str(tmp_path), "--cases", "resnet"]) == 2
    assert "unknown consistency case 'resnet'" in capsys.readouterr().err
    assert os.listdir(str(tmp_path)) == []
    assert cli.main(["consistency", "check", "--dir", str(tmp_path), "--backends", "theano"]) == 2
    assert "unknown backend 'theano'" in capsys.readouterr().err


def test_python_m_tbdzoo_consistency_is_the_tbd_command(capsys):
    assert consistency.main(["check", "--list", "--cases", "probe/conv2d*"]) == 0
    assert capsys.readouterr().out.split() == [c for c in CASES if c.startswith("probe/conv2d")]
