"""Models in worker processes: the same methods, and failures that surface instead of hanging."""
import os
import signal
import stat
import time

import numpy as np
import pytest

import tbdzoo
from tbdzoo.backends.remote import RemoteModel
from tbdzoo.errors import WeightsError, WorkerError


def _fake_python(tmp_path, body):
    path = tmp_path / "python"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_a_worker_model_matches_the_in_process_one(tmp_path):
    local = tbdzoo.build("transformer", backend="torch", config="tiny", dropout=0.0)
    with tbdzoo.build("transformer", backend="torch", config="tiny", dropout=0.0, isolate=True) as remote:
        assert remote.native.pid != os.getpid() and "SpecModule" in repr(remote.native)
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


def test_a_worker_killed_mid_session_raises_not_hangs():
    m = tbdzoo.build("resnet50", backend="torch", config="tiny", isolate=True)
    os.kill(m.native.pid, signal.SIGKILL)
    m.native.process.wait()
    with pytest.raises(WorkerError, match="not running.*exit code -9"):
        m.predict(m.synthetic_batch())
    m.close()
    m.close()  # closing twice is harmless


def test_errors_inside_the_worker_keep_their_traceback():
    with tbdzoo.build("resnet50", backend="torch", config="tiny", isolate=True) as m:
        with pytest.raises(ValueError, match="unknown worker method"):
            m._call("no_such_method")
        with pytest.raises(WorkerError, match="(?s)FileNotFoundError.*Traceback.*load_arrays"):
            m._call("prepare", key="x", path="/nonexistent/batch.npz")
        assert m.predict(m.synthetic_batch()).shape == (4, 10)  # still serving
