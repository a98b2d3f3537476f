"""The hand-written Flax anchors of benchmarks/flax_handwritten.py: one process of the script in
the JAX environment (.venv-jax) at the tiny configs, one round. Both hand-written models hold
tbdzoo's initial weights, so without dropout their first loss is the JAX backend's, and both
train (the loss after a few steps on the batch is below the first)."""
import json

import numpy as np
import pytest

from conftest import require_backend, run_in_env
from tbdzoo.backends import environments

pytestmark = pytest.mark.backend


def test_both_flax_models_match_tbdzoos_first_loss_and_train(tmp_path):
    require_backend("jax")
    out = tmp_path / "process.json"
    proc = run_in_env(environments.python_of("jax"), [
        "-m", "benchmarks.flax_handwritten", "--tiny", "--no-dropout", "--rounds", "1",
        "--steps", "1", "--warmup", "0", "--process-out", str(out)], timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record = json.loads(out.read_text())
    assert record["environment"]["device"] == "cpu" and record["environment"]["flax"]
    cells = {c["model"]: c for c in record["cells"]}
    assert set(cells) == {"resnet50", "transformer"}, record["cells"]
    for name, cell in cells.items():
        assert "error" not in cell, cell
        first, last = cell["first_loss"], cell["details"]["last_loss"]
        assert np.isfinite(list(first.values()) + list(last.values())).all(), cell
        np.testing.assert_allclose(first["flax"], first["tbdzoo"], rtol=1e-5, err_msg=name)
        assert last["flax"] < first["flax"], (name, first, last)
        # the same formula: the two stay together over the steps, not just at the first
        np.testing.assert_allclose(last["flax"], last["tbdzoo"], rtol=1e-3, err_msg=name)
        assert all(len(t) == 1 and t[0] > 0 for t in cell["times"].values()), cell["times"]


def test_the_buffer_listing_reads_both_steps_temporaries(tmp_path):
    """benchmarks/jax_buffers.py: XLA's buffer assignment of tbdzoo's and the Flax step, each
    program's temporary allocation with values inside it (no value larger than it)."""
    require_backend("jax")
    out = tmp_path / "buffers.json"
    proc = run_in_env(environments.python_of("jax"), [
        "-m", "benchmarks.jax_buffers", "--models", "transformer", "--config", "tiny",
        "--device", "cpu", "--top", "3", "--out", str(out)], timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cell, = json.loads(out.read_text())["cells"]
    sides = {p["side"]: p for p in cell["programs"]}
    assert set(sides) == {"tbdzoo", "flax"}, cell["programs"]
    for prog in sides.values():
        assert prog["temporary_bytes"] > 0 and prog["values"] > 3
        assert len(prog["largest"]) == 3
        assert all(0 < v["bytes"] <= prog["temporary_bytes"] for v in prog["largest"])
