"""A model that lives in a worker process, behind the same methods as a native one.

Used for CNTK from the main interpreter, and for any backend when a run must be isolated
(clean memory figures, a crash contained). A dead or silent worker raises WorkerError with the
tail of its stderr; it never hangs the caller past the call's timeout.
"""
import itertools
import json
import os
import selectors
import shutil
import subprocess
import tempfile
import time
from collections import OrderedDict

from .. import errors
from ..weights import load_arrays, save_arrays
from . import environments
from .base import BackendModel, Prepared, check_buildable

DEFAULT_TIMEOUT = 3600.0
_ERRORS = {name: getattr(errors, name) for name in (
    "UnknownNameError", "WeightsError", "BackendUnavailableError", "UnsupportedOptionError",
    "HyperparameterError")}
_ERRORS.update({"ValueError": ValueError, "KeyError": KeyError, "TypeError": TypeError})


def _error_class(name):
    """The class of an error raised in the worker: a known one, or any TbdError by its name."""
    cls = _ERRORS.get(name)
    if cls is None:
        cls = getattr(errors, name, None)
        if not (isinstance(cls, type) and issubclass(cls, errors.TbdError)):
            return None
    return cls


def _loss_value(value):
    """A float, or {objective: float} in program order for a program of several objectives."""
    if isinstance(value, dict):
        return OrderedDict((k, float(v)) for k, v in value.items())
    return float(value)


class WorkerHandle(object):
    """What ``model.native`` is for a model in a worker: its process and interpreter."""

    def __init__(self, process, python, native_type):
        self.process, self.python, self.native_type = process, python, native_type

    @property
    def pid(self):
        return self.process.pid

    def __repr__(self):
        return "<worker pid {} ({}) holding a {}>".format(self.pid, self.python, self.native_type)


class RemoteModel(BackendModel):
    def __init__(self, model_def, hparams, seed, backend, timeout=DEFAULT_TIMEOUT, device=None):
        self.backend = backend
        self.model_def, self.name, self.hparams, self.seed = model_def, model_def.name, hparams, seed
        self._process, self._dir = None, None
        self.spec = check_buildable(model_def, hparams, backend)  # refused before a worker starts
        self.step_count = 0
        self.timeout = timeout
        self._keys = itertools.count()
        python = environments.python_for(backend)
        if not os.path.exists(python):
            raise errors.BackendUnavailableError(
                "backend {!r} needs its environment, but {} does not exist; {}".format(
                    backend, python, environments.how_to_create(backend)))
        self._dir = tempfile.mkdtemp(prefix="tbdzoo-{}-".format(backend))
        # The worker writes its stderr to a file of its own; we only ever read that file.
        self._stderr_path = os.path.join(self._dir, "stderr.log")
        with open(self._stderr_path, "wb") as stderr:
            self._process = subprocess.Popen(
                [python, "-m", "tbdzoo.backends.worker"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=stderr, env=environments.worker_environment(),
                cwd=self._dir)
        overrides = {k: v for k, v in hparams.items()
                     if k not in ("model", "config") and model_def.configs[hparams["config"]].get(k) != v}
        try:
            built = self._call("build", model=model_def.name, backend=backend,
                               config=hparams["config"], seed=seed, overrides=overrides,
                               device=device)
        except BaseException:
            self.close()
            raise
        if built["spec_hash"] != self.spec.hash():
            self.close()
            raise errors.WorkerError("the worker built spec {} but this side built {}: the two "
                                     "tbdzoo sources differ".format(built["spec_hash"], self.spec.hash()))
        self.native = WorkerHandle(self._process, python, built["native_type"])
        self.device = built["device"]

    # -- plumbing -------------------------------------------------------------------------
    def _path(self, stem):
        return os.path.join(self._dir, "{}-{}.npz".format(stem, next(self._keys)))

    def _read_stderr(self, start=0):
        """(text, end offset) of the worker's stderr from byte ``start``."""
        try:
            with open(self._stderr_path, "rb") as f:
                f.seek(start)
                data = f.read()
        except OSError:
            return "", start
        return data.decode("utf-8", "replace"), start + len(data)

    def _stderr_tail(self, limit=4000):
        lines = [l for l in self._read_stderr()[0].splitlines()
                 if not l.startswith("tbdzoo-progress ")]
        return "\n".join(lines)[-limit:]

    def _call(self, method, timeout=None, progress=None, **args):
        if self._process is None or self._process.poll() is not None:
            raise errors.WorkerError("the {} worker is not running{}".format(
                self.backend, self._exit_note()))
        try:
            self._process.stdin.write((json.dumps({"method": method, "args": args}) + "\n").encode())
            self._process.stdin.flush()
        except OSError:  # BrokenPipeError: it died since the look above
            self._reap()
            raise errors.WorkerError("the {} worker died before {!r}{}".format(
                self.backend, method, self._exit_note()))
        line = self._read_reply(method, self.timeout if timeout is None else timeout, progress)
        reply = json.loads(line.decode())
        if reply["ok"]:
            return reply["result"]
        cls = _error_class(reply["error"])
        if cls is None:
            raise errors.WorkerError("{} in the {} worker during {!r}: {}\n{}".format(
                reply["error"], self.backend, method, reply["message"], reply["traceback"]))
        error = cls.__new__(cls)  # same class as on the worker's side, same message
        Exception.__init__(error, reply["message"])
        error.__dict__.update(reply.get("attributes") or {})
        raise error

    def _read_reply(self, method, timeout, progress=None):
        deadline = time.monotonic() + timeout
        seen = self._read_stderr()[1] if progress else 0
        with selectors.DefaultSelector() as sel:
            sel.register(self._process.stdout, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._process.kill()
                    self._process.wait()
                    raise errors.WorkerError("the {} worker did not answer {!r} within {:.0f} s and "
                                             "was stopped{}".format(self.backend, method, timeout,
                                                                    self._exit_note()))
                if progress:
                    seen = self._report_progress(seen, progress)
                if sel.select(min(left, 0.2 if progress else 1.0)):
                    line = self._process.stdout.readline()
                    if line:
                        if progress:  # the last steps' lines may have come with the reply
                            self._report_progress(seen, progress)
                        return line
                    self._process.wait()
                    raise errors.WorkerError("the {} worker exited during {!r}{}".format(
                        self.backend, method, self._exit_note()))

    def _report_progress(self, seen, progress):
        """Pass the worker's 'tbdzoo-progress DONE TOTAL' stderr lines to ``progress``."""
        text, end = self._read_stderr(seen)
        complete = text[:text.rfind("\n") + 1]  # a half-written line waits for the next look
        for line in complete.splitlines():
            if line.startswith("tbdzoo-progress "):
                done, total = line.split()[1:3]
                progress(int(done), int(total))
        return seen + len(complete.encode("utf-8"))

    def _reap(self, timeout=10):
        """Wait for a worker whose pipe broke, so its exit code and stderr are complete."""
        try:
            self._process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def _exit_note(self):
        code = self._process.poll() if self._process is not None else None
        tail = self._stderr_tail()
        note = " (exit code {})".format(code) if code is not None else ""
        return note + (". Its stderr ends with:\n" + tail if tail.strip() else "")

    def close(self):
        """Stop the worker and remove its files; safe to call twice."""
        if self._process is not None and self._process.poll() is None:
            try:
                self._call("shutdown", timeout=10)
            except errors.WorkerError:
                pass
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        for stream in (getattr(self._process, "stdin", None), getattr(self._process, "stdout", None)):
            if stream is not None:
                try:
                    stream.close()
                except OSError:  # a request still buffered for a dead worker cannot flush
                    pass
        if getattr(self, "_dir", None):
            shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if getattr(self, "_process", None) is not None:
                self.close()
        except Exception:
            pass

    # -- the model interface ---------------------------------------------------------------
    def prepare_batch(self, batch):
        if isinstance(batch, Prepared):
            return BackendModel.prepare_batch(self, batch)
        self._check_batch(batch)
        key, path = "b{}".format(next(self._keys)), self._path("batch")
        save_arrays(path, batch)
        self._call("prepare", key=key, path=path)
        os.remove(path)
        return Prepared(self.backend, key, self.model_def.items(self.hparams, batch))

    def _on_batch(self, method, batch, **args):
        """Call ``method`` on a batch; a batch prepared only for this call is forgotten after."""
        prepared = self.prepare_batch(batch)
        try:
            return self._call(method, key=prepared.native, **args)
        finally:
            if prepared is not batch and self._process.poll() is None:
                self._call("forget", key=prepared.native)

    def train_step(self, batch, sync=True):
        """Always synchronous: the reply carries the loss."""
        result = self._on_batch("train_step", batch)
        self.step_count = result["step_count"]
        return _loss_value(result["loss"])

    def train_steps(self, batch, steps):
        """``steps`` optimizer steps in one request; returns their losses."""
        result = self._on_batch("train_steps", batch, steps=int(steps))
        self.step_count = result["step_count"]
        return [_loss_value(x) for x in result["losses"]]

    def time_training(self, batch, warmup=1, steps=3, repeats=3, progress=None, timeout=None):
        """The measuring protocol run inside the worker (tbdzoo.profiling.timing);
        ``progress(done, total)`` follows its steps."""
        return self._on_batch("time_training", batch, timeout=timeout, progress=progress,
                              warmup=warmup, steps=steps, repeats=repeats)

    def profile_in_worker(self, batch=None, progress=None, timeout=None, **options):
        """tbdzoo.profiling.profile run inside the worker; returns its record."""
        if batch is None:
            return self._call("profile", timeout=timeout, progress=progress, **options)
        path = self._path("batch")
        save_arrays(path, batch)
        try:
            return self._call("profile", timeout=timeout, progress=progress, batch_path=path,
                              **options)
        finally:
            os.remove(path)

    def data_fed_in_worker(self, progress=None, timeout=None, **options):
        """tbdzoo.pipelines.measure.data_fed run inside the worker, where the backend's own
        input pipeline feeds the model; returns the record's "data" part."""
        return self._call("data_fed", timeout=timeout, progress=progress, **options)

    @property
    def pid(self):
        return self._process.pid

    def predict(self, batch):
        out = self._path("predict")
        inference = getattr(self.model_def, "inference", None) is not None
        if inference or (self.program is not None and not isinstance(batch, Prepared)):
            # a step's batch of a program is split by update; the output reads its own inputs
            if not inference:  # an inference hook checks its batch in the worker
                self._check_batch(batch, self._output_inputs())
            path = self._path("batch")
            save_arrays(path, batch)
            try:
                self._call("predict_arrays", path=path, out=out)
            finally:
                os.remove(path)
        else:
            self._on_batch("predict", batch, out=out)
        arrays = load_arrays(out)
        if "output" in arrays:
            return arrays["output"]
        return OrderedDict((k[len("output."):], v) for k, v in arrays.items())  # a dict

    def values(self, batch, names):
        """Graph values ``names`` in inference mode, computed in the worker."""
        path, out = self._path("batch"), self._path("values")
        save_arrays(path, batch)
        try:
            self._call("values", path=path, names=list(names), out=out)
        finally:
            os.remove(path)
        arrays = load_arrays(out)
        return OrderedDict((n, arrays[n]) for n in names)

    def loss_and_gradients(self, batch):
        out = self._path("grads")
        loss = self._on_batch("loss_and_gradients", batch, out=out)["loss"]
        grads = load_arrays(out)
        return _loss_value(loss), OrderedDict((k, grads[k]) for k in self.trainable_names())

    def step_targets(self, batch):
        """The targets step's written inputs for ``batch``, made in the worker."""
        path, out = self._path("batch"), self._path("targets")
        save_arrays(path, batch)
        try:
            self._call("step_targets", path=path, out=out)
        finally:
            os.remove(path)
        return load_arrays(out)

    def get_weights(self):
        out = self._path("weights")
        self._call("get_weights", out=out)
        return load_arrays(out)

    def set_weights(self, weights):
        from ..weights import check
        path = self._path("weights")
        save_arrays(path, check(self.spec, weights))
        self._call("set_weights", path=path)

    def save_weights(self, path):
        self._call("save_weights", path=os.path.abspath(os.fspath(path)))

    def load_weights(self, path):
        self._call("load_weights", path=os.path.abspath(os.fspath(path)))
