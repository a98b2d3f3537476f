"""The cross-framework grid (benchmarks/cross_framework.py) on the CPU: each run a real `tbd run`
of the tiny config on the PyTorch and JAX backends, appended at once, a cut grid resumed without
running again what it holds, and the tables built from the records. No timing asserts."""
import json

import pytest

from benchmarks import cross_framework
from conftest import require_backend

pytestmark = pytest.mark.backend

ARGS = ["--config", "tiny", "--device", "cpu", "--models", "resnet50", "--precisions", "fp32",
        "--processes", "1", "--warmup", "1", "--steps", "1", "--repeats", "2",
        "--min-repeat-seconds", "0"]


def _records(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_the_grid_records_both_backends_resumes_and_tabulates(tmp_path, capsys):
    require_backend("jax")
    out = str(tmp_path / "grid.jsonl")
    assert cross_framework.main(ARGS + ["--out", out]) == 0
    records = _records(out)
    assert [(r["backend"], r["status"], r["pass"]) for r in records] == \
        [("torch", "ok", 1), ("jax", "ok", 1)]
    assert all(r["step_time"]["n"] == 2 and r["model"] == "resnet50" for r in records)
    assert cross_framework.main(ARGS + ["--out", out]) == 0      # nothing left to run
    assert len(_records(out)) == 2
    capsys.readouterr()
    assert cross_framework.main(["--summary", out]) == 0
    table = capsys.readouterr().out
    row = next(line for line in table.splitlines() if line.startswith("| resnet50 | fp32 |"))
    assert "x** (" in row and "1 / 1" in row


def test_an_unknown_model_names_the_known_ones():
    with pytest.raises(SystemExit):
        cross_framework.parse(["--models", "resnet", "--out", "x"])


def test_the_sweep_runs_each_batch_size_once_and_resumes(tmp_path):
    out = str(tmp_path / "sweep.jsonl")
    args = ARGS[:6] + ["--backends", "torch", "--precisions", "fp32", "--warmup", "1", "--steps",
                       "1", "--repeats", "1", "--min-repeat-seconds", "0", "--sweep",
                       "--out", out]
    assert cross_framework.main(args) == 0
    records = _records(out)
    assert [r["batch_size"] for r in records] == list(cross_framework.SWEEP["resnet50"])
    assert all(r["status"] == "ok" and r["sweep"] for r in records)
    assert "--out benchmarks/results/sweep.jsonl" in records[0]["command"]
    assert cross_framework.main(args) == 0      # nothing left to run
    assert len(_records(out)) == len(records)
