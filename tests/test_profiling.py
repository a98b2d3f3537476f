"""The profiler: accounting invariants, the record, and failure paths of runs and suites."""
import json
import os
import signal
import stat
import subprocess
import sys
import time

import pytest

import tbdzoo
from tbdzoo import suite
from tbdzoo.profiling import flops, memory
from tbdzoo.profiling.profile import classify, profile
from tbdzoo.profiling.timing import summarize

RECORD_KEYS = {"schema", "model", "backend", "config", "status", "throughput", "step_time", "cpu",
               "gpu", "flops", "memory", "env", "command", "timestamp"}


@pytest.mark.parametrize("name,slots", [("resnet50", 1), ("transformer", 2)])
def test_analytic_memory_invariants(name, slots):
    md = tbdzoo.get_model(name)
    hp = md.hparams()
    g = md.build_graph(hp)
    a = memory.analytic(g, hp, hp["batch_size"], 1234)
    assert a["weights"] == g.trainable_count() * 4
    assert a["gradients"] == a["weights"]
    assert a["optimizer_state"] == slots * a["weights"]
    assert a["input_batch"] == 1234
    assert a["feature_maps"] > 0


def test_feature_maps_dominate_resnet50_at_the_paper_batch():
    """TBD's finding: at batch 32, feature maps are the largest part of training memory."""
    md = tbdzoo.get_model("resnet50")
    hp = md.hparams()
    a = memory.analytic(md.build_graph(hp), hp, 32, 32 * 3 * 224 * 224 * 4)
    assert a["feature_maps"] == max(a.values())
    assert a["feature_maps"] / sum(a.values()) > 0.7


def test_breakdown_derives_workspace_and_never_goes_negative():
    analytic = {"weights": 10, "gradients": 10, "optimizer_state": 10, "feature_maps": 50, "input_batch": 5}
    b = memory.breakdown(analytic, {"feature_maps": 60}, peak=100)
    assert b["feature_maps"] == {"bytes": 60, "source": "measured"}
    assert b["weights"]["source"] == "analytic"
    assert b["workspace"] == {"bytes": 5, "source": "derived"}
    assert memory.breakdown(analytic, {}, peak=50)["workspace"]["bytes"] == 0
    assert memory.breakdown(analytic, {}, peak=None)["peak"]["bytes"] is None


def test_flops_peaks_are_overridable():
    """(Training-step FLOPs against a hand count: tests/test_flops.py.)"""
    md = tbdzoo.get_model("resnet50")
    g = md.build_graph(md.hparams())
    s = flops.summary(g, 32, 0.1, "NVIDIA H200", "bf16")
    assert s["peak_per_s"] == 989.4e12 and s["utilization"] == pytest.approx(s["achieved_per_s"] / 989.4e12)
    assert flops.summary(g, 32, 0.1, None, "fp32")["utilization"] is None
    assert flops.summary(g, 32, 0.1, None, "fp32", peak_override=1e12)["peak_per_s"] == 1e12


def test_summary_statistics():
    s = summarize([3.0, 1.0, 2.0, 10.0])
    assert (s["median"], s["min"], s["max"], s["n"]) == (2.5, 1.0, 10.0, 4)
    assert s["cv"] == pytest.approx((50 / 3) ** 0.5 / 4)  # sample standard deviation over the mean


def test_profile_record_in_process_measures_torch_memory():
    m = tbdzoo.build("resnet50", backend="torch", config="tiny", device="cpu")
    r = profile(m, steps=1, warmup=1, repeats=2)
    assert RECORD_KEYS <= set(r) and r["status"] == "ok" and r["schema"] == "tbdzoo.run/1"
    mem, a = r["memory"], r["memory"]["analytic"]
    for key in ("weights", "gradients", "optimizer_state", "feature_maps"):
        assert mem[key]["source"] == "measured"
    assert mem["weights"]["bytes"] == a["weights"] == mem["gradients"]["bytes"] == mem["optimizer_state"]["bytes"]
    assert 0.8 < mem["feature_maps"]["bytes"] / a["feature_maps"] < 1.25  # the analytic model is close
    assert mem["peak"]["bytes"] > 0 and mem["workspace"]["source"] == "derived"
    assert r["gpu"] is None and r["cpu"]["cores"] == os.cpu_count()
    assert 0 < r["cpu"]["process_cores_busy"] <= os.cpu_count() * 1.1
    assert r["throughput"]["unit"] == "images/s" and r["step_time"]["n"] == 2
    assert r["env"]["framework"] == "torch" and r["env"]["framework_version"]
    json.dumps(r)


@pytest.mark.parametrize("message,status", [
    ("CUDA out of memory. Tried to allocate 2.00 GiB", "oom"),
    ("ResourceExhaustedError: OOM when allocating tensor", "oom"),
    ("std::bad_alloc", "oom"),
    ("[12:00:01] src/storage/./pooled_storage_manager.h:160: cudaMalloc failed: out of memory", "oom"),
    ("ValueError: shapes do not match", "error"),
])
def test_failures_are_classified(message, status):
    assert classify(message) == status


def _fake_python(tmp_path, body):
    path = tmp_path / "python"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_a_crashing_worker_becomes_an_error_record(tmp_path, monkeypatch):
    monkeypatch.setenv("TBDZOO_CNTK_PYTHON", _fake_python(tmp_path, "echo 'Illegal instruction' >&2; kill -4 $$"))
    r = suite.run_one("resnet50", "cntk", config="tiny")
    assert r["status"] == "error" and "Illegal instruction" in r["error"]
    assert r["schema"] == "tbdzoo.run/1" and r["model"] == "resnet50"


def test_a_sweep_stops_at_the_memory_cap():
    seen = []
    records = suite.sweep("transformer", "torch", [2, 4, 8], config="tiny", warmup=1, steps=1,
                          repeats=1, memory_cap=64 * 2 ** 20, on_record=seen.append)
    assert [r["status"] for r in records] == ["oom"] and seen == records
    assert "memory cap" in records[0]["error"]


def test_a_sweep_records_ok_points_then_the_oom(monkeypatch):
    def fake_run(model, backend, batch_size, **options):
        status = "ok" if batch_size < 8 else "oom"
        return {"model": model, "backend": backend, "batch_size": batch_size, "status": status}
    records = suite.sweep("transformer", "torch", [16, 2, 4, 8], run=fake_run)
    assert [(r["batch_size"], r["status"]) for r in records] == [(2, "ok"), (4, "ok"), (8, "oom")]


def test_a_killed_suite_keeps_its_finished_records(tmp_path):
    out = tmp_path / "results.jsonl"
    cmd = [sys.executable, "-m", "tbdzoo.cli", "bench", "--config", "tiny", "--backends", "torch",
           "--models", "resnet50,transformer", "--steps", "1", "--repeats", "1", "-o", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if out.exists() and out.read_text().count("\n") >= 1:
            break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    lines = out.read_text().splitlines()
    assert len(lines) >= 1
    first = json.loads(lines[0])
    assert first["model"] == "resnet50" and first["status"] == "ok"
