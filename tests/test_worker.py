"""Models in worker processes: the same methods, failures that surface instead of hanging, and
a worker that dies: the report of why, and the model used again after it."""
import json
import os
import signal
import stat
import time

import numpy as np
import pytest

import tbdzoo
from conftest import random_weights, require_backend
from tbdzoo import weights as weights_io
from tbdzoo.backends import remote, worker
from tbdzoo.backends.remote import RemoteModel
from tbdzoo.datasets.errors import DatasetError
from tbdzoo.errors import BatchError, NonFiniteStepError, WeightsError, WorkerError
from tbdzoo.spec import initial_weights

# What CNTK and TensorFlow print on import, whatever happens after: a report never shows it.
BANNERS = ("Selected CPU as the process wide default device", "Unsupported Linux distribution",
           "Missing optional dependency", "absl::InitializeLog", "oneDNN custom operations")


def _fake_python(tmp_path, body):
    path = tmp_path / "python"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_a_worker_model_matches_the_in_process_one(tmp_path):
    local = tbdzoo.build("transformer", backend="torch", config="tiny", dropout=0.0)
    with tbdzoo.build("transformer", backend="torch", config="tiny", dropout=0.0, isolate=True) as remote:
        assert remote.native.pid != os.getpid() and "Transformer" in repr(remote.native)
        batch = local.synthetic_batch()
        np.testing.assert_array_equal(remote.predict(batch), local.predict(batch))
        assert remote.train_step(batch) == local.train_step(batch)
        assert remote.step_count == 1
        remote.save_weights(tmp_path / "w.npz")
        local.load_weights(tmp_path / "w.npz")
        got = remote.get_weights()
        assert all((got[k] == v).all() for k, v in local.get_weights().items())
        with pytest.raises(WeightsError, match="missing: embed.weight"):  # same class crosses over
            remote.set_weights({k: v for k, v in got.items() if k != "embed.weight"})
        timing = remote.time_training(batch, warmup=1, steps=1, repeats=2)
        assert timing["step_time"]["n"] == 2 and timing["throughput"] > 0
        assert remote.step_count == 1  # time_training ran in the worker; the mirror is unchanged


def test_a_crashed_worker_surfaces_its_stderr(tmp_path, monkeypatch):
    monkeypatch.setenv("TBDZOO_CNTK_PYTHON", _fake_python(
        tmp_path, "echo 'libfoo.so: cannot open shared object file' >&2; exit 3"))
    start = time.monotonic()
    with pytest.raises(WorkerError, match="(?s)exit code 3.*libfoo.so: cannot open"):
        tbdzoo.build("resnet50", backend="cntk", config="tiny")
    assert time.monotonic() - start < 30


def test_a_silent_worker_is_stopped_at_the_timeout(tmp_path, monkeypatch):
    monkeypatch.setenv("TBDZOO_CNTK_PYTHON", _fake_python(tmp_path, "sleep 600"))
    md = tbdzoo.get_model("resnet50")
    start = time.monotonic()
    with pytest.raises(WorkerError, match="did not answer 'build' within 2 s"):
        RemoteModel(md, md.hparams("tiny"), 0, "cntk", timeout=2)
    assert time.monotonic() - start < 20


def _same(a, b):
    return sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)


def _killed(model, sig):
    os.kill(model.pid, sig)
    model.native.process.wait()


def test_a_killed_worker_is_reported_then_restarted_with_the_saved_weights(tmp_path):
    """A death found between requests is reported by the call that finds it (which is not
    sent); the next call starts a new worker holding the last weights this side knows."""
    m = tbdzoo.build("resnet50", backend="mxnet", config="tiny", isolate=True)
    batch = m.synthetic_batch()
    m.train_step(batch)
    m.save_weights(tmp_path / "w.npz")
    saved = weights_io.load(tmp_path / "w.npz", m.spec)
    prepared = m.prepare_batch(batch)
    m.train_step(prepared)
    (tmp_path / "w.npz").unlink()  # the model kept its own copy
    _killed(m, signal.SIGKILL)
    with pytest.raises(WorkerError) as caught:
        m.predict(batch)
    message = str(caught.value)
    assert "died of SIGKILL (exit code -9: killed, possibly by the out-of-memory killer)" in message
    assert "after its last request, train_step on a batch of 4 (images (4,3,64,64)" in message
    assert "was not sent" in message and "the 1 step after it is lost" in message
    assert "holding the weights saved to {} (step 1)".format(tmp_path / "w.npz") in message
    with pytest.warns(RuntimeWarning, match=r"holds the weights saved to .*w\.npz \(step 1\)"):
        assert _same(m.get_weights(), saved)
    assert m.step_count == 1 and m.restarts == 1
    with pytest.raises(WorkerError, match=r"prepare it again with model\.prepare_batch"):
        m.train_step(prepared)  # it lived in the dead worker
    assert np.isfinite(m.train_step(m.prepare_batch(batch))) and m.step_count == 2
    m.close()
    m.close()  # closing twice is harmless
    with pytest.raises(WorkerError, match="was closed"):
        m.predict(batch)


def test_errors_inside_the_worker_keep_their_traceback():
    local = tbdzoo.build("resnet50", backend="torch", config="tiny")
    bad = {"images": local.synthetic_batch()["images"]}  # no labels
    with pytest.raises(ValueError) as here:
        local.prepare_batch(bad)
    with tbdzoo.build("resnet50", backend="torch", config="tiny", isolate=True) as m:
        with pytest.raises(ValueError, match="unknown worker method"):
            m._call("no_such_method")
        with pytest.raises(WorkerError, match="(?s)FileNotFoundError.*Traceback.*load_arrays"):
            m._call("prepare", key="x", path="/nonexistent/batch.npz")
        # A batch the worker's own check refuses (sent past this side's) raises there what an
        # in-process model raises for it: the same class, message and attributes.
        path = m._path("bad")
        np.savez(path, **bad)
        with pytest.raises(type(here.value)) as there:
            m._call("prepare", key="bad", path=path)
        assert type(there.value) is type(here.value) and str(there.value) == str(here.value)
        assert vars(there.value).items() >= vars(here.value).items()
        assert "_check_batch" in there.value.worker_traceback
        assert m.predict(m.synthetic_batch()).shape == (4, 10)  # still serving


@pytest.mark.parametrize("error", [
    BatchError("batch['labels'][2] = 1000 is outside [0, 10)", input="labels", position=(2,),
               value=np.int64(1000), allowed="class ids in [0, 10)"),
    NonFiniteStepError("loss is nan at step 3", objective="loss", step=3),
    DatasetError("no such split 'x'"),  # a TbdError outside tbdzoo.errors
    KeyError("images"),
])
def test_tbdzoo_errors_cross_the_worker_boundary_with_their_attributes(error):
    try:
        raise error
    except type(error) as e:  # raised, so that the reply carries a traceback
        reply = worker.error_reply(e)
    got = remote._worker_exception(json.loads(json.dumps(reply)))
    assert type(got) is type(error) and str(got) == str(error) and got.args == error.args
    assert {k: v for k, v in vars(got).items() if k != "worker_traceback"} == vars(error)
    assert "raise error" in got.worker_traceback


def test_a_report_keeps_the_workers_own_lines_and_drops_framework_banners():
    cntk = os.path.join("site-packages", "cntk", "cntk_py_init.py")
    output = "\n".join([
        "/v/lib/python3.6/{}:56: UserWarning: Unsupported Linux distribution (x-12). CNTK "
        "supports Ubuntu 16.04 and above, only.".format(cntk),
        "  warnings.warn('Unsupported Linux distribution (%s-%s).' % (d, v))",
        "/v/lib/python3.6/{}:98: UserWarning: ".format(cntk),
        "",
        "#### Missing optional dependency (GPU-Specific) ####",
        "   CNTK may crash if the component that depends on those dependencies is loaded.",
        "  warnings.warn(WARNING_MSG_GPU_ONLY % ('GPU-Specific', 'https://...'))",
        "Selected CPU as the process wide default device.",
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        "I0000 00:00:1796307292.886870    6915 port.cc:153] oneDNN custom operations are on.",
        "tbdzoo-progress 1 10",
        "our own line",
        "/v/lib/python3.11/site-packages/mxnet/numpy/utils.py:37: DeprecationWarning: np.bool",
        "Fatal Python error: Segmentation fault",
        "Current thread 0x00007f (most recent call first):",
        '  File "/src/tbdzoo/backends/worker.py", line 53 in train_step',
        "Extension modules: numpy.core._multiarray_umath, torch._C (total: 2)",
    ])
    assert remote.worker_lines(output) == [
        "our own line", "Fatal Python error: Segmentation fault",
        "Current thread 0x00007f (most recent call first):",
        '  File "/src/tbdzoo/backends/worker.py", line 53 in train_step']
    assert remote.worker_lines(output, lines=1) == [
        '  File "/src/tbdzoo/backends/worker.py", line 53 in train_step']


def test_a_cntk_worker_that_dies_says_why_and_the_model_goes_on():
    """Deaths during and between requests, each reported with its signal, its request and the
    worker's own lines; after each, the model holds the documented weights and trains again."""
    require_backend("cntk")
    m = tbdzoo.build("resnet50", backend="cntk", config="tiny")
    assert isinstance(m, RemoteModel)
    batch = m.synthetic_batch()
    described = "a batch of 4 (images (4,3,64,64) float32, labels (4,) int32)"
    first = m.predict(batch)
    m.train_step(batch)

    # Between requests: nothing of its own to show, and the banner is not shown instead.
    _killed(m, signal.SIGKILL)
    with pytest.raises(WorkerError) as caught:
        m.train_step(batch)
    message = str(caught.value)
    assert "died of SIGKILL" in message and "out-of-memory killer" in message
    assert "after its last request, train_step on " + described in message
    assert "It printed no line of its own" in message
    assert not any(b in message for b in BANNERS)
    assert "holding the initial weights of seed 0 (step 0); the 1 step after it is lost" in message

    # A new worker that cannot start says so, and the call after it tries again.
    real, m._python = m._python, __file__  # not an interpreter
    with pytest.raises(WorkerError, match="died earlier, and a new one could not be started"):
        m.predict(batch)
    m._python = real
    with pytest.warns(RuntimeWarning, match=r"holds the initial weights of seed 0 \(step 0\)"):
        np.testing.assert_array_equal(m.predict(batch), first)
    assert _same(m.get_weights(), initial_weights(m.spec, 0)) and m.step_count == 0

    # During a request: the signal, the request and the Python stack the worker wrote.
    m.train_step(batch)
    kept = m.get_weights()
    m.train_step(batch)

    def crash(done, total):
        if done == 1:
            os.kill(m.pid, signal.SIGSEGV)
    with pytest.raises(WorkerError) as caught:
        m.time_training(batch, warmup=1, steps=1000, repeats=1, progress=crash, timeout=120)
    message = str(caught.value)
    assert "died of SIGSEGV (exit code -11: a segmentation fault" in message
    assert "while serving time_training (repeats=1, steps=1000, warmup=1) on " + described in message
    assert "| Fatal Python error: Segmentation fault" in message and "in time_training" in message
    assert not any(b in message for b in BANNERS)
    assert "holding the weights get_weights returned (step 1); the 1 step after" in message
    with pytest.warns(RuntimeWarning, match=r"returned \(step 1\), and the optimizer's state"):
        assert _same(m.get_weights(), kept)
    assert m.step_count == 1 and m.restarts == 2

    # Weights given to set_weights are what a new worker holds after the next death.
    given = random_weights(m)
    m.set_weights(given)
    _killed(m, signal.SIGFPE)
    with pytest.raises(WorkerError, match="died of SIGFPE .*arithmetic fault"):
        m.predict(batch)
    with pytest.warns(RuntimeWarning, match="holds the weights given to set_weights"):
        assert _same(m.get_weights(), given)
    assert np.isfinite(m.train_step(batch)) and m.step_count == 2
    m.close()
