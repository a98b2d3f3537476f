"""The profiler: accounting invariants, the record, and failure paths of runs and suites."""
import gc
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from collections import OrderedDict

import pytest

import tbdzoo
from conftest import require_backend
from tbdzoo import suite
from tbdzoo.backends.torch import cuda_memory
from tbdzoo.profiling import flops, memory, resident
from tbdzoo.profiling.cpu import CpuMeter
from tbdzoo.profiling.profile import classify, failed_record, profile, run_record
from tbdzoo.profiling.report import check_schema
from tbdzoo.profiling.timing import summarize

RECORD_KEYS = {"schema", "model", "backend", "config", "status", "throughput", "step_time", "cpu",
               "gpu", "flops", "memory", "env", "command", "timestamp"}


def _storages(tensors):
    """{data pointer: bytes} of the distinct storages under ``tensors``."""
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}


def _one_step(model):
    prepared = model.prepare_batch(model.synthetic_batch())
    model.train_step(prepared)
    return prepared


@pytest.mark.parametrize("name,overrides,slots", [
    ("resnet50", {}, 1),                    # SGD with momentum: one buffer per parameter
    ("resnet50", {"momentum": 0.0}, 0),     # plain SGD keeps nothing between steps
    ("transformer", {}, 2),                 # Adam: first and second moments
])
def test_analytic_weights_gradients_and_optimizer_state_match_pytorchs_tensors(name, overrides, slots):
    """The spec's figures against the tensors PyTorch really holds after a step: weights are
    every tensor of the model's state (BatchNorm running statistics included), gradients one
    per trainable parameter, optimizer state what torch.optim keeps."""
    torch = pytest.importorskip("torch")
    m = tbdzoo.build(name, backend="torch", config="tiny", device="cpu", **overrides)
    _one_step(m)
    a = memory.analytic(m.spec, m.hparams, m.hparams["batch_size"], 0)
    # BatchNorm's int64 step counters are no weights of the spec
    state = [t for t in m.native.state_dict().values() if t.is_floating_point()]
    held = [v for s in m.optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()]
    params = [p for p in m.native.parameters()]
    assert a["weights"] == sum(_storages(state).values())
    assert a["gradients"] == sum(p.grad.nbytes for p in params)
    assert a["optimizer_state"] == sum(_storages(held).values())
    assert len(held) == slots * len(params)
    if name == "resnet50":  # running statistics are state, not trainable: weights > gradients
        assert a["weights"] > a["gradients"]


@pytest.mark.parametrize("overrides", [{}, {"mode": "wgan", "optimizer": "rmsprop"}])
def test_memory_by_network_splits_the_wgan_totals_and_matches_pytorch(overrides):
    """Per network, the analytic weights, gradients and optimizer state add up to the model's
    and equal what PyTorch holds for that network; its feature maps are its own update's."""
    pytest.importorskip("torch")
    m = tbdzoo.build("wgan", backend="torch", config="tiny", device="cpu", **overrides)
    prepared = _one_step(m)
    batch = m.hparams["batch_size"]
    analytic = memory.by_group(m.spec, batch)
    total = memory.analytic(m.spec, m.hparams, batch, 0)
    assert list(analytic) == ["generator", "critic"]
    for category in ("weights", "gradients", "optimizer_state"):
        assert sum(g[category] for g in analytic.values()) == total[category]
    measured = m.measure_memory(prepared)["by_group"]
    for group in analytic:
        for category in ("weights", "gradients", "optimizer_state"):
            assert measured[group][category] == analytic[group][category], (group, category)
    # The critic's update runs the critic three times (real, generated, interpolated), the
    # generator's once: the critic's update keeps more.
    assert measured["critic"]["feature_maps"] > measured["generator"]["feature_maps"] > 0
    assert max(g["feature_maps"] for g in analytic.values()) == total["feature_maps"]


def test_memory_by_network_is_absent_for_one_network():
    model_def = tbdzoo.models.get_model("inception_v3")
    assert memory.by_group(model_def.build_graph(model_def.hparams("tiny")), 2) is None


@pytest.mark.parametrize("backend", ["tensorflow", "mxnet"])
@pytest.mark.parametrize("name,overrides", [("resnet50", {}), ("resnet50", {"momentum": 0.0}),
                                            ("transformer", {})])
def test_weights_and_optimizer_state_mean_the_same_on_tensorflow_and_mxnet(backend, name, overrides):
    """Read off each framework's own variables and arrays: the model's whole state and the
    optimizer's slots, equal to the analytic figures (MXNet also keeps its gradient buffers)."""
    require_backend(backend)
    m = tbdzoo.build(name, backend=backend, config="tiny", device="cpu", **overrides)
    measured = m.measure_memory(m.prepare_batch(m.synthetic_batch()))
    a = memory.analytic(m.spec, m.hparams, m.hparams["batch_size"], 0)
    assert measured["weights"] == a["weights"] and measured["optimizer_state"] == a["optimizer_state"]
    assert measured.get("gradients", a["gradients"]) == a["gradients"]


def test_analytic_feature_maps_against_what_autograd_saves():
    """ResNet-50 (tiny, fp32) on PyTorch: the analytic feature maps against the storages the
    saved-tensor hooks see in a real step, each storage once, without parameters and batch.
    Within 10%: the analytic model leaves out small saved tensors (BatchNorm's per-channel
    mean and inverse deviation, max pooling's int64 indices, the loss's probabilities)."""
    torch = pytest.importorskip("torch")
    m = tbdzoo.build("resnet50", backend="torch", config="tiny", device="cpu")
    prepared = m.prepare_batch(m.synthetic_batch())
    excluded = set(_storages(list(m.native.state_dict().values()) + list(prepared.native.values())))
    seen = []

    def pack(t):
        seen.append((t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        m.train_step(prepared)
    kept = [(ptr, n) for ptr, n in seen if ptr not in excluded]
    once = sum(dict(kept).values())
    assert sum(n for _, n in kept) > once  # a ReLU's output is saved again by the next conv
    analytic = memory.analytic(m.spec, m.hparams, m.hparams["batch_size"], 0)["feature_maps"]
    assert abs(analytic - once) / once < 0.10
    assert m.measure_memory(prepared)["feature_maps"] == once


def _recurrent_graph(op, **attrs):
    """x (5, 2) -> dense 3 -> op (units 4) -> dense 6 -> cross-entropy, padded length 5."""
    from tbdzoo.spec import Graph
    g = Graph("hand/" + op)
    x = g.add("in", "dense", g.input("x", (5, 2)), units=3)
    r = g.add("rnn", op, [x, g.input("x_lengths", (), dtype="int32")], units=4, **attrs)
    g.set_output(g.add("out", "dense", r, units=6))
    g.input("labels", (5,), dtype="int32", role="target")
    g.set_loss("softmax_cross_entropy", logits="out", labels="labels")
    return g


@pytest.mark.parametrize("op,attrs,per_example", [
    # dense 'in' keeps nothing it reads (x is the batch); the LSTM keeps its input (5 x 3 = 15)
    # and per step, layer and direction the gates i f g o and c (5 x 4 = 20) and h (4): 2 layers
    # x 2 directions x 5 steps x (20 + 4) = 480, the last layer's h being the output (5, 8);
    # dense 'out' keeps that output (counted once); the loss keeps the logits (5 x 6 = 30).
    ("lstm", dict(num_layers=2, bidirectional=True), 15 + 2 * 2 * 5 * (20 + 4) + 30),
    # one GRU layer, both directions summed: r z n and U_n h + b_hn (4 x 4) and h (4) per step
    # and direction, 2 x 5 x 20 = 200; the sum (5, 4) is a new tensor, which dense 'out' keeps.
    ("gru", dict(bidirectional=True, merge="sum"), 15 + 2 * 5 * (16 + 4) + 5 * 4 + 30),
])
def test_fused_recurrent_layers_keep_their_gates_and_states(op, attrs, per_example):
    g = _recurrent_graph(op, **attrs)
    assert memory.feature_map_elements(g, 3) == 3 * per_example
    assert memory.analytic(g, {"optimizer": "sgd"}, 3, 0)["feature_maps"] == 4 * 3 * per_example


def test_additive_attention_keeps_its_tanh_and_weights():
    from tbdzoo.spec import Graph
    g = Graph("hand/additive")
    q = g.add("q", "dense", g.input("a", (4, 2)), units=3)                   # (4, 3): 12
    m = g.add("m", "dense", g.input("b", (5, 2)), units=2)                   # (5, 2): 10
    c = g.add("attn", "additive_attention", [q, m, g.input("b_lengths", (), dtype="int32")],
              units=6)                                                       # (4, 2): 8
    both = g.add("both", "concat", [c, q], axis=1)                           # (4, 5): 20
    g.set_output(g.add("out", "dense", both, units=3))                       # (4, 3): 12
    g.input("labels", (4,), dtype="int32", role="target")
    g.set_loss("softmax_cross_entropy", logits="out", labels="labels")
    # attention keeps q and m, tanh over 4 x 5 pairs of 6 units (120) and the 4 x 5 weights;
    # concat keeps nothing; dense 'out' keeps the concatenation; the loss the logits
    assert memory.feature_map_elements(g, 2) == 2 * (12 + 10 + 4 * 5 * 6 + 4 * 5 + 20 + 12)


def test_bf16_weight_copies_are_not_feature_maps():
    """Under bf16 autocast a convolution or dense layer saves a bf16 cast of its weight; those
    are recorded as ``weight_copies`` (2 bytes per weight of every conv and dense layer), and
    the feature maps hold the same activations as without them."""
    pytest.importorskip("torch")
    m = tbdzoo.build("resnet50", backend="torch", config="tiny", device="cpu", precision="bf16")
    measured = m.measure_memory(m.prepare_batch(m.synthetic_batch()))
    cast = [p for n, p in m.spec.params().items() if n.endswith(".weight") and len(p.shape) > 1]
    assert measured["weight_copies"] == 2 * sum(p.size for p in cast)
    fp32 = tbdzoo.build("resnet50", backend="torch", config="tiny", device="cpu")
    assert measured["feature_maps"] < fp32.measure_memory(
        fp32.prepare_batch(fp32.synthetic_batch()))["feature_maps"]
    assert tbdzoo.build("resnet50", backend="torch", config="tiny", device="cpu").measure_memory(
        fp32.prepare_batch(fp32.synthetic_batch()))["weight_copies"] == 0


def test_feature_maps_dominate_resnet50_at_the_paper_batch():
    """TBD's finding: at batch 32, feature maps are the largest part of training memory."""
    md = tbdzoo.get_model("resnet50")
    hp = md.hparams()
    a = memory.analytic(md.build_graph(hp), hp, 32, 32 * 3 * 224 * 224 * 4)
    assert a["feature_maps"] == max(a.values())
    assert a["feature_maps"] / sum(a.values()) > 0.7


def test_breakdown_derives_runtime_and_workspace_and_never_goes_negative():
    analytic = {"weights": 10, "gradients": 10, "optimizer_state": 10, "feature_maps": 50, "input_batch": 5}
    b = memory.breakdown(analytic, {"feature_maps": 60, "weight_copies": 3}, peak=200, steady=85,
                         peak_scope="profile")
    assert b["feature_maps"] == {"bytes": 60, "source": "measured"}
    assert b["weights"]["source"] == "analytic"
    assert b["framework_runtime"] == {"bytes": 50, "source": "derived"}  # 85 - 10 - 10 - 10 - 5
    assert b["workspace"] == {"bytes": 55, "source": "derived"}  # 200 - 30 - 60 - 5 - 50
    assert b["peak"] == {"bytes": 200, "source": "measured", "scope": "profile"}
    assert b["weight_copies"] == {"bytes": 3, "source": "measured"}
    assert list(b)[:len(memory.CATEGORIES)] == list(memory.CATEGORIES)
    assert memory.breakdown(analytic, {}, peak=50, steady=10)["workspace"]["bytes"] == 0
    assert memory.breakdown(analytic, {}, peak=50, steady=10)["framework_runtime"]["bytes"] == 0
    no_peak = memory.breakdown(analytic, {}, peak=None)
    assert no_peak["peak"]["bytes"] is None and no_peak["framework_runtime"]["bytes"] is None


def test_a_compiled_programs_peak_leaves_the_host_runtime_out_of_the_workspace():
    """JAX's peak is the XLA program's device buffers: the host's runtime is no part of it."""
    analytic = {"weights": 10, "gradients": 10, "optimizer_state": 10, "feature_maps": 50, "input_batch": 5}
    b = memory.breakdown(analytic, {"weights": 12, "xla_temporaries": 90, "device_peak": None},
                         peak=200, steady=85, peak_scope=memory.XLA_PROGRAM)
    assert b["framework_runtime"] == {"bytes": 48, "source": "derived"}  # 85 - 12 - 10 - 10 - 5
    assert b["workspace"] == {"bytes": 113, "source": "derived"}  # 200 - 12 - 10 - 10 - 50 - 5
    assert b["peak"]["scope"] == "xla_program"
    assert b["xla_temporaries"] == {"bytes": 90, "source": "measured"} and "device_peak" not in b


def _trace(live_before, events, allocator_peak):
    return {"live_before": live_before, "max_memory_allocated": allocator_peak,
            "events": [{"action": a, "addr": addr, "size": size} for a, addr, size in events]}


def test_cuda_peak_attribution_replays_a_synthetic_trace():
    """Weights live before the step; feature maps and a scratch block come and go; the peak is
    the moment the gradient is allocated while the feature map is still alive."""
    trace = _trace({0x1000: 100}, [
        ("alloc", 0x2000, 200),            # feature map
        ("alloc", 0x3000, 50),             # scratch, freed again: 350 live
        ("free_requested", 0x3000, 50),
        ("free_completed", 0x3000, 50),    # the counters dropped at free_requested already
        ("alloc", 0x4000, 120),            # gradient: 420 live, the peak
        ("alloc", 0x5000, 30),             # scratch at the peak too: 450
        ("free_requested", 0x2000, 200),   # backward frees the feature map: 250
        ("alloc", 0x6000, 100),            # later: 350, below the peak
    ], allocator_peak=452)
    claims = OrderedDict([("weights", [0x1000]), ("gradients", [0x4000 + 8]),  # a pointer inside
                          ("feature_maps", [0x2000, 0x6000]), ("optimizer_state", [0x1000])])
    out = cuda_memory.peak_attribution(trace, claims)
    assert out["replayed_peak"] == 450 and out["unattributed"] == 2
    assert (out["weights"], out["gradients"], out["feature_maps"], out["workspace"]) == (100, 120, 200, 30)
    assert out["optimizer_state"] == 0  # a block goes to the first category that claims it
    assert sum(out[k] for k in ("weights", "gradients", "feature_maps", "optimizer_state",
                                "workspace")) == out["replayed_peak"]


def test_cuda_peak_attribution_keeps_the_first_moment_of_the_peak():
    """Two equal highs: the blocks of the first are the ones attributed."""
    trace = _trace({}, [("alloc", 0x1000, 300), ("free_requested", 0x1000, 300),
                        ("alloc", 0x2000, 300), ("free_requested", 0x2000, 300)], allocator_peak=300)
    claims = OrderedDict([("weights", []), ("feature_maps", [0x2000])])
    out = cuda_memory.peak_attribution(trace, claims)
    assert out["replayed_peak"] == 300 and out["workspace"] == 300 and out["feature_maps"] == 0


def test_breakdown_on_a_gpu_uses_the_blocks_live_at_the_peak():
    analytic = {"weights": 10, "gradients": 10, "optimizer_state": 10, "feature_maps": 50, "input_batch": 5}
    trace = _trace({0x1000: 100}, [("alloc", 0x2000, 200), ("alloc", 0x3000, 30)], allocator_peak=340)
    claims = OrderedDict([("weights", [0x1000]), ("optimizer_state", []), ("input_batch", []),
                          ("gradients", []), ("feature_maps", [0x2000])])
    measured = {"weights": 100, "feature_maps": 200, "weight_copies": 7,
                "at_peak": cuda_memory.peak_attribution(trace, claims)}
    b = memory.breakdown(analytic, measured, peak=340, peak_scope="step")
    assert [b[k]["bytes"] for k in memory.CATEGORIES] == [100, 0, 0, 200, 0, None, 30]
    assert b["unattributed"]["bytes"] == 10 and b["peak"]["scope"] == "step"
    assert b["tensors"] == {"weights": 100, "feature_maps": 200}
    assert b["weight_copies"] == {"bytes": 7, "source": "measured"}


def test_a_second_profile_does_not_inherit_the_first_ones_peak():
    """A large model, then a small one in the same process: the small one's peak is its own.
    Where the high-water mark cannot be reset, the record says its peak is the process's."""
    pytest.importorskip("torch")
    large = tbdzoo.build("resnet50", backend="torch", config="tiny", device="cpu", batch_size=64)
    first = profile(large, steps=1, warmup=1, repeats=1, samplers=False)["memory"]
    mark = resident.high_water_bytes()
    del large
    gc.collect()  # the first model is gone before the second is built
    resident.release_free_heap()
    small = tbdzoo.build("probe/conv2d", backend="torch", device="cpu")
    second = profile(small, steps=1, warmup=1, repeats=1, samplers=False)["memory"]
    assert first["peak"]["scope"] == second["peak"]["scope"] == "profile"
    carried = mark - small.rss_before_build  # what a mark left unreset would charge it
    assert carried > 2 * 2 ** 20 and first["feature_maps"]["bytes"] > 16 * 2 ** 20
    assert second["peak"]["bytes"] < carried / 4


def test_where_the_high_water_mark_cannot_be_reset_the_peak_says_so(monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setattr(resident, "reset_high_water", lambda: False)
    m = tbdzoo.build("probe/conv2d", backend="torch", device="cpu")
    peak = profile(m, steps=1, warmup=1, repeats=1, samplers=False)["memory"]["peak"]
    # the process's lifetime peak less its size before the build: earlier tests in this process
    # may have freed more than this model holds, so only the scope and a figure are certain
    assert peak["scope"] == "process" and peak["bytes"] is not None and peak["bytes"] >= 0


def test_resident_high_water_mark_resets_on_linux():
    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("no /proc/self/clear_refs on this system")
    import mmap
    # fresh pages from the kernel, released on close: a bytearray may reuse heap pages that an
    # earlier test in this process left resident, and then raises no high-water mark
    held = mmap.mmap(-1, 64 * 2 ** 20)
    for i in range(0, len(held), 4096):
        held[i] = 1
    held.close()
    before = resident.high_water_bytes()
    assert resident.reset_high_water()
    assert resident.high_water_bytes() < before - 32 * 2 ** 20


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
    assert set(r) >= RECORD_KEYS and r["status"] == "ok" and r["schema"] == "tbdzoo.run/1"
    mem, a = r["memory"], r["memory"]["analytic"]
    for key in ("weights", "gradients", "optimizer_state", "feature_maps", "input_batch"):
        assert mem[key]["source"] == "measured"
    for key in ("weights", "gradients", "optimizer_state"):  # analytic and measured agree
        assert mem[key]["bytes"] == a[key]
    assert 0.9 < mem["feature_maps"]["bytes"] / a["feature_maps"] < 1.1  # the analytic model is close
    assert mem["peak"]["bytes"] > 0 and mem["peak"]["scope"] == "profile"
    assert mem["framework_runtime"]["source"] == mem["workspace"]["source"] == "derived"
    assert mem["weight_copies"]["bytes"] == 0  # fp32: nothing cast
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


def test_a_worker_dead_before_its_first_request_is_reported_with_its_stderr(tmp_path, monkeypatch):
    """The race behind a flaky crash report: the worker dies before the build request is
    written, so the write breaks the pipe; the error still names the signal and the stderr."""
    from tbdzoo.backends import remote
    real_popen = remote.subprocess.Popen

    def popen_then_wait(*args, **kwargs):
        process = real_popen(*args, **kwargs)
        os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)  # dead, not yet reaped
        real_poll = process.poll
        calls = []

        def poll():  # the first look misses the death, as a look just before it would
            calls.append(1)
            return None if len(calls) == 1 else real_poll()
        process.poll = poll
        return process
    monkeypatch.setattr(remote.subprocess, "Popen", popen_then_wait)
    monkeypatch.setenv("TBDZOO_CNTK_PYTHON", _fake_python(tmp_path, "echo 'Illegal instruction' >&2; kill -4 $$"))
    r = suite.run_one("resnet50", "cntk", config="tiny")
    assert r["status"] == "error" and "Illegal instruction" in r["error"]
    assert "exit code -4" in r["error"]


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


def test_one_cpu_meter_counts_this_process_or_its_whole_tree():
    """CpuMeter() reads this process alone (a profile's "cpu"); CpuMeter(tree=True) adds the
    children, live and reaped (a data-fed run's "cpu": a DataLoader's workers), each under
    its own keys in the records' order."""
    alone, tree = CpuMeter(), CpuMeter(tree=True)
    alone.start()
    tree.start()
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\n"
    subprocess.run([sys.executable, "-c", burn], check=True)
    a, t = alone.stop(), tree.stop()
    assert list(a) == ["cores", "process_cores_busy", "process_utilization", "system_per_core",
                       "source"]
    assert list(t) == ["cores", "process_tree_cores_busy", "process_tree_utilization",
                       "system_per_core", "source"]
    # the child's 0.4 s of CPU shows in the tree's reading and not in the process's own
    assert t["process_tree_cores_busy"] > a["process_cores_busy"] + 0.2
    assert t["process_tree_utilization"] == pytest.approx(t["process_tree_cores_busy"] / t["cores"])


def test_every_run_record_starts_and_ends_the_same_way():
    """run_record builds the records of tbd run and tbd bench: a profile's, a failed run's and
    an asynchronous A3C run's differ only in the figures between the head and the tail."""
    head = ["schema", "model", "backend", "config", "status", "error", "batch_size"]
    tail = ["env", "command", "timestamp"]
    ok = run_record("a3c", "torch", "paper", "ok", None, None,
                    [("device", "cpu"), ("throughput", {"value": 5.0, "unit": "frames/s"})],
                    command="tbd bench a3c")
    assert list(ok) == head + ["device", "throughput"] + tail
    assert ok["command"] == "tbd bench a3c" and ok["env"]["tbdzoo"] == tbdzoo.__version__
    failed = failed_record("resnet50", "torch", "paper", 8, "CUDA out of memory", "tbd run")
    assert list(failed) == head + tail
    assert (failed["status"], failed["error"], failed["batch_size"]) == (
        "oom", "CUDA out of memory", 8)
    for record in (ok, failed):
        check_schema(record, "here")   # what tbd report reads
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", record["timestamp"])
