"""A model that lives in a worker process, behind the same methods as a native one.

Used for CNTK from the main interpreter, and for any backend when a run must be isolated
(clean memory figures, a crash contained). A worker that dies or stops answering raises
WorkerError saying how it ended (the signal by name, or the exit code), the request it was
serving and its own last lines of output; the model's next call starts a new worker and
restores the last weights this side knows (docs/backends.md, "When a worker dies"). It never
hangs the caller past the call's timeout.
"""
import importlib
import itertools
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections import OrderedDict

import numpy as np

from .. import errors
from ..weights import check, load_arrays, path_of, save_arrays
from . import environments
from .base import BackendModel, Prepared, check_buildable

DEFAULT_TIMEOUT = 3600.0
# Errors raised in the worker that arrive as their own class: every TbdError subclass (found
# in the tbdzoo module the worker names, tbdzoo.errors by default), and these built-in ones.
# Anything else arrives as a WorkerError carrying the worker's traceback.
_ERRORS = {"ValueError": ValueError, "KeyError": KeyError, "TypeError": TypeError}

# How much of a worker's output a report reads (the tail of its log) and shows.
TAIL_BYTES = 64 * 1024
TAIL_LINES = 40
TAIL_LINE_CHARS = 400

# Lines a framework prints on import or start-up whatever happens: left out of a dead worker's
# report so that its own last lines show. Each pattern is searched for in one line.
_NOISE = [re.compile(p) for p in (
    r"^tbdzoo-progress \d+ \d+$",  # the worker's progress reports (parsed, not shown)
    r"^Selected (CPU|GPU) as the process wide default device",  # CNTK, on import
    r"^WARNING: All log messages before absl::InitializeLog\(\) is called",  # absl, TensorFlow
    r"oneDNN custom operations are on",  # TensorFlow's oneDNN notice (port.cc)
    r"cpu_feature_guard\.cc",  # TensorFlow: CPU instructions its binary was not built for
    r"This TensorFlow binary is optimized to use|rebuild TensorFlow with the appropriate compiler",
    r"Unable to register cu(DNN|FFT|BLAS) factory|computation placer already registered",  # TF
    r"Using Pooled \(Naive\) StorageManager",  # MXNet's choice of memory pool
    r"^Extension modules: ",  # faulthandler's list of loaded C extensions (Python 3.10+)
)]
# A Python warning raised in an installed package (CNTK's distribution and GPU banners, a
# framework's DeprecationWarning on import): its "file:line: XWarning: message" header, its
# further message lines and the "  source line" warnings.formatwarning ends it with.
_PACKAGE_WARNING = re.compile(r"[/\\](site|dist)-packages[/\\]\S+:\d+: \w*Warning: ")
_WARNING_SOURCE = re.compile(r"^  \S")
_WARNING_SPAN = 16  # the most message lines a banner is taken to have
_OWN_LINE = re.compile(r"^(Traceback |Fatal Python error|Current thread |Thread 0x)|:\d+: \w*Warning: ")

# What each signal usually means for a worker; any other is reported by its name alone.
_SIGNALS = {
    "SIGKILL": "killed, possibly by the out-of-memory killer",
    "SIGSEGV": "a segmentation fault: native code used memory it does not own",
    "SIGFPE": "an arithmetic fault in native code, such as an integer division by zero",
    "SIGABRT": "aborted by native code: a failed assertion or an uncaught C++ exception",
    "SIGBUS": "a bus error: a bad memory access, or shared memory (/dev/shm) full",
    "SIGILL": "an illegal instruction: native code built for another CPU",
    "SIGTERM": "terminated by another process",
    "SIGINT": "interrupted",
}


def _error_class(name, module="tbdzoo.errors"):
    """The class of an error raised in the worker, or None: reported as a WorkerError."""
    if name in _ERRORS:
        return _ERRORS[name]
    if module != "tbdzoo" and not module.startswith("tbdzoo."):
        return None
    try:
        cls = getattr(importlib.import_module(module), name, None)
    except Exception:  # noqa: BLE001  (a module only the worker's interpreter can import)
        return None
    return cls if isinstance(cls, type) and issubclass(cls, errors.TbdError) else None


def _decoded(value):
    """An error attribute as the worker sent it (worker._plain), with its tuples back."""
    if isinstance(value, dict):
        if list(value) == ["__tuple__"]:
            return tuple(_decoded(v) for v in value["__tuple__"])
        return dict((k, _decoded(v)) for k, v in value.items())
    if isinstance(value, list):
        return [_decoded(v) for v in value]
    return value


def _worker_exception(reply):
    """The exception a failed reply stands for: the worker's own class with its arguments
    and attributes (a BatchError's input and position, say), or a WorkerError."""
    cls = _error_class(reply["error"], reply.get("module") or "tbdzoo.errors")
    if cls is None:
        return None
    error = cls.__new__(cls)  # same class as on the worker's side, same message
    Exception.__init__(error, *_decoded(reply.get("args") or [reply["message"]]))
    for name, value in (reply.get("attributes") or {}).items():
        setattr(error, name, _decoded(value))
    error.worker_traceback = reply.get("traceback")
    return error


def _outside_this_module():
    """The warnings stacklevel of the first caller outside this module."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame, level = frame.f_back, level + 1
    return level


def _loss_value(value):
    """A float, or {objective: float} in program order for a program of several objectives."""
    if isinstance(value, dict):
        return OrderedDict((k, float(v)) for k, v in value.items())
    return float(value)


def how_it_ended(returncode):
    """'died of SIGFPE (exit code -8: an arithmetic fault ...)' or 'exited (exit code 3)'."""
    if returncode is None:
        return "stopped answering"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "signal {}".format(-returncode)
        note = _SIGNALS.get(name)
        return "died of {} (exit code {}{})".format(
            name, returncode, ": " + note if note else "")
    return "exited (exit code {})".format(returncode)


def describe_batch(batch, most=6):
    """'a batch of 4 (images (4,3,32,32) float32, labels (4,) int32)'; without 'of 4' when
    the inputs differ in length (a program's stacked updates)."""
    arrays = [(k, np.asarray(v)) for k, v in batch.items()]
    sizes = [len(a) for _, a in arrays if a.ndim]
    parts = ["{} ({}) {}".format(k, ",".join(str(d) for d in a.shape) + ("," if a.ndim == 1 else ""),
                                 a.dtype) for k, a in arrays[:most]]
    if len(arrays) > most:
        parts.append("{} more".format(len(arrays) - most))
    size = " of {}".format(sizes[0]) if sizes and len(set(sizes)) == 1 else ""  # else stacked
    return "a batch{} ({})".format(size, ", ".join(parts))


def worker_lines(text, lines=TAIL_LINES):
    """The last ``lines`` lines of a worker's output that are its own: without the
    frameworks' start-up notices and installed packages' warnings (_NOISE, _PACKAGE_WARNING)."""
    given = text.splitlines()
    kept, i = [], 0
    while i < len(given):
        line = given[i]
        if _PACKAGE_WARNING.search(line):
            end = i + 1  # the header alone, unless its source line follows within the span
            for j in range(i + 1, min(len(given), i + 1 + _WARNING_SPAN)):
                if _WARNING_SOURCE.match(given[j]):
                    end = j + 1
                    break
                if _OWN_LINE.search(given[j]):
                    break
            i = end
            continue
        if line.strip() and not any(p.search(line) for p in _NOISE):
            kept.append(line if len(line) <= TAIL_LINE_CHARS else line[:TAIL_LINE_CHARS] + " ...")
        i += 1
    return kept[-lines:]


class WorkerHandle:
    """What ``model.native`` is for a model in a worker: its process and interpreter."""

    def __init__(self, process, python, native_type):
        self.process, self.python, self.native_type = process, python, native_type

    @property
    def pid(self):
        return self.process.pid

    def __repr__(self):
        return "<worker pid {} ({}) holding a {}>".format(self.pid, self.python, self.native_type)


# Request arguments that are plumbing (file paths, batch keys) or said by a request's
# description; the rest (steps=5, warmup=1) are shown in a dead worker's report.
_PLUMBING = frozenset(("key", "path", "out", "batch_path", "model", "backend", "config", "seed",
                       "overrides", "device"))


def _request(method, about, args):
    """'train_steps (steps=5) on a batch of 4 (...)': a request as a report names it."""
    shown = ["{}={}".format(k, v) for k, v in sorted(args.items()) if k not in _PLUMBING
             and isinstance(v, (bool, int, float, str))]
    text = method + (" ({})".format(", ".join(shown)) if shown else "")
    return text + (" " + about if about else "")


class RemoteModel(BackendModel):
    def __init__(self, model_def, hparams, seed, backend, timeout=DEFAULT_TIMEOUT, device=None):
        self.backend = backend
        self.model_def, self.name, self.hparams, self.seed = model_def, model_def.name, hparams, seed
        self._process, self._dir, self._built, self._closed = None, None, False, False
        self.spec = check_buildable(model_def, hparams, backend)  # refused before a worker starts
        self.step_count = 0
        self.timeout = timeout
        self.restarts = 0  # workers started after one died
        self._keys = itertools.count()
        self._python = environments.python_for(backend)
        if not os.path.exists(self._python):
            raise errors.BackendUnavailableError(
                "backend {!r} needs its environment, but {} does not exist; {}".format(
                    backend, self._python, environments.how_to_create(backend)))
        self._device_asked = device
        self._overrides = {k: v for k, v in hparams.items() if k not in ("model", "config") and
                           model_def.configs[hparams["config"]].get(k) != v}
        # The weights a new worker starts from if this one dies: the last ones this side knows
        # (docs/backends.md, "When a worker dies").
        self._restore = {"what": "the initial weights of seed {}".format(seed), "step_count": 0,
                         "group_steps": None, "method": None, "path": None}
        self._dir = tempfile.mkdtemp(prefix="tbdzoo-{}-".format(backend))
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        self._built = True

    def _start(self):
        """Start a worker and build the model in it; it must build the same spec (hash)."""
        # The worker writes its stderr (and anything printed to its stdout) to a file of its
        # own; we only ever read that file.
        self._stderr_path = os.path.join(self._dir, "stderr.log")
        with open(self._stderr_path, "wb") as stderr:
            self._process = subprocess.Popen(
                [self._python, "-m", "tbdzoo.backends.worker"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=stderr, env=environments.worker_environment(),
                cwd=self._dir)
        self._death, self._last_done, self._batches = None, None, {}
        built = self._call("build", about="of {} ({} config, seed {})".format(
                               self.name, self.hparams["config"], self.seed),
                           model=self.name, backend=self.backend, config=self.hparams["config"],
                           seed=self.seed, overrides=self._overrides, device=self._device_asked)
        if built["spec_hash"] != self.spec.hash():
            raise errors.WorkerError("the worker built spec {} but this side built {}: the two "
                                     "tbdzoo sources differ".format(built["spec_hash"], self.spec.hash()))
        self.native = WorkerHandle(self._process, self._python, built["native_type"])
        self.device = built["device"]

    # -- plumbing -------------------------------------------------------------------------
    def _check_open(self):
        if self._closed:
            raise errors.WorkerError("this {} model was closed, and its worker with it; "
                                     "tbdzoo.build() makes a new one".format(self.name))

    def _path(self, stem):
        self._check_open()
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

    def _output_tail(self):
        """The last TAIL_BYTES of the worker's output, from a whole line on."""
        try:
            with open(self._stderr_path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - TAIL_BYTES))
                data = f.read()
        except OSError:
            return ""
        if size > TAIL_BYTES:
            data = data[data.find(b"\n") + 1:]
        return data.decode("utf-8", "replace")

    def _call(self, method, timeout=None, progress=None, about=None, **args):
        """Send one request and return its result; an error raised in the worker is raised
        here as its own class (_ERRORS), a dead worker as a WorkerError saying why."""
        if about is None and "key" in args:
            about = self._batches.get(args["key"])
        request = _request(method, about, args)
        if method != "shutdown":
            self._running(request)
        elif self._process.poll() is not None:
            raise errors.WorkerError("the {} worker has already exited".format(self.backend))
        try:
            self._process.stdin.write((json.dumps({"method": method, "args": args}) + "\n").encode())
            self._process.stdin.flush()
        except OSError:  # BrokenPipeError: it died since the look above
            raise self._died(serving=request) from None
        line = self._read_reply(method, request, self.timeout if timeout is None else timeout,
                                progress)
        if method != "forget":  # plumbing after the request a report should name
            self._last_done = request
        reply = json.loads(line.decode())
        if reply["ok"]:
            return reply["result"]
        error = _worker_exception(reply)
        if error is None:
            raise errors.WorkerError("{} in the {} worker during {!r}: {}\n{}".format(
                reply["error"], self.backend, method, reply["message"], reply["traceback"]))
        raise error

    def _running(self, request):
        """Make sure a worker serves ``request``: a death not yet reported is reported (the
        request is not sent); after one that was, a new worker is started."""
        self._check_open()
        if self._process.poll() is None:
            return
        if self._death is None:
            raise self._died(not_sent=request)
        self._restart()

    def _read_reply(self, method, request, timeout, progress=None):
        deadline = time.monotonic() + timeout
        seen = os.path.getsize(self._stderr_path) if progress else 0
        with selectors.DefaultSelector() as sel:
            sel.register(self._process.stdout, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._process.kill()
                    self._process.wait()
                    raise self._died(serving=request, stopped="did not answer {!r} within {:.0f} s "
                                     "and was stopped".format(method, timeout))
                if progress:
                    seen = self._report_progress(seen, progress)
                if sel.select(min(left, 0.2 if progress else 1.0)):
                    line = self._process.stdout.readline()
                    if line:
                        if progress:  # the last steps' lines may have come with the reply
                            self._report_progress(seen, progress)
                        return line
                    raise self._died(serving=request)

    def _report_progress(self, seen, progress):
        """Pass the worker's 'tbdzoo-progress DONE TOTAL' stderr lines to ``progress``."""
        text, _end = self._read_stderr(seen)
        complete = text[:text.rfind("\n") + 1]  # a half-written line waits for the next look
        for line in complete.splitlines():
            if line.startswith("tbdzoo-progress "):
                done, total = line.split()[1:3]
                progress(int(done), int(total))
        return seen + len(complete.encode("utf-8"))

    def _reap(self, timeout=10):
        """Wait for a worker whose pipe broke, so its exit code and output are complete."""
        try:
            self._process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def _died(self, serving=None, not_sent=None, stopped=None):
        """The WorkerError for a worker found dead: how it ended (or ``stopped``, when this side
        stopped it), the request it was ``serving`` (or the one ``not_sent`` to it) and its own
        last lines. Its prepared batches are gone; the model's next call starts a new worker."""
        self._reap()
        head = "the {} worker (pid {}) {}".format(
            self.backend, self._process.pid, stopped or how_it_ended(self._process.returncode))
        if serving:
            head += " while serving " + serving
        elif self._last_done:
            head += " after its last request, {}; {} was not sent".format(self._last_done, not_sent)
        else:
            head += " before its first request; {} was not sent".format(not_sent)
        lines = worker_lines(self._output_tail())
        text = head + (". Its last lines:\n" + "\n".join("  | " + l for l in lines) if lines
                       else ". It printed no line of its own.")
        if self._built:
            r, lost = self._restore, self.step_count - self._restore["step_count"]
            text += ("\nThe model can be used again: its next call starts a new worker holding "
                     "{} (step {}){}; the optimizer's state starts afresh.".format(
                         r["what"], r["step_count"],
                         "; the {} step{} after it {} lost".format(
                             lost, "s" if lost > 1 else "", "are" if lost > 1 else "is")
                         if lost > 0 else ""))
        self._death, self._batches = text, {}
        return errors.WorkerError(text)

    def _restart(self):
        """A new worker in place of a dead one, holding the restore point's weights and step
        counters; warns what it holds. If it cannot start, raises WorkerError; the next call
        tries again."""
        dead, r = self._process.pid, self._restore
        self._close_pipes()
        try:
            self._start()
            if r["path"] is not None:
                self._call(r["method"], path=r["path"], about="of " + r["what"])
            self._call("set_counters", step_count=r["step_count"], group_steps=r["group_steps"])
        except Exception as e:  # noqa: BLE001  (any failure to restart is the worker's, said below)
            self._stop()
            self._death = self._death or str(e)
            raise errors.WorkerError(
                "the {} worker (pid {}) died earlier, and a new one could not be started: {}\n"
                "The model's next call tries again; tbdzoo.build() makes a new model.".format(
                    self.backend, dead, e)) from None
        self.step_count = r["step_count"]
        self.restarts += 1
        warnings.warn("the {} worker (pid {}) died earlier; a new one (pid {}) holds {} (step {}), "
                      "and the optimizer's state starts afresh".format(
                          self.backend, dead, self._process.pid, r["what"], r["step_count"]),
                      RuntimeWarning, stacklevel=_outside_this_module())

    def _mark_restore_point(self, what, counters, method, path):
        """Weights a new worker would start from: ``path`` (ours) read by the worker's
        ``method``, at the step counters the worker had."""
        old = self._restore["path"]
        if old and old != path and os.path.exists(old):
            os.remove(old)
        self._restore = {"what": what, "step_count": counters["step_count"],
                         "group_steps": counters["group_steps"], "method": method, "path": path}

    def _stop(self):
        """Kill the worker if it still runs, and close its pipes."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._close_pipes()

    def _close_pipes(self):
        for stream in (getattr(self._process, "stdin", None), getattr(self._process, "stdout", None)):
            if stream is not None:
                try:
                    stream.close()
                except OSError:  # a request still buffered for a dead worker cannot flush
                    pass

    def close(self):
        """Stop the worker and remove its files; safe to call twice."""
        self._closed = True
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
        self._close_pipes()
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
        except Exception:  # noqa: BLE001  (__del__ must not raise, at interpreter exit least of all)
            pass

    # -- the model interface ---------------------------------------------------------------
    def prepare_batch(self, batch):
        if isinstance(batch, Prepared):
            BackendModel.prepare_batch(self, batch)
            if batch.native not in self._batches:
                raise errors.WorkerError(
                    "this batch is not held by the {} worker of this model (a worker that dies "
                    "takes its prepared batches with it): prepare it again with "
                    "model.prepare_batch(batch)".format(self.backend))
            return batch
        self._check_batch(batch)
        key, path = "b{}".format(next(self._keys)), self._path("batch")
        about = "on " + describe_batch(batch)
        save_arrays(path, batch)
        try:
            self._call("prepare", key=key, path=path, about=about)
        finally:
            os.remove(path)
        self._batches[key] = about
        return Prepared(self.backend, key, self.model_def.items(self.hparams, batch))

    def _on_batch(self, method, batch, **args):
        """Call ``method`` on a batch; a batch prepared only for this call is forgotten after."""
        prepared = self.prepare_batch(batch)
        try:
            return self._call(method, key=prepared.native, **args)
        finally:
            if prepared is not batch and self._process.poll() is None:
                self._call("forget", key=prepared.native)
                self._batches.pop(prepared.native, None)

    def _arrays_in_worker(self, method, batch, out=None, path_arg="path", **args):
        """Call ``method`` on a NumPy ``batch`` sent as a file named by its ``path_arg``;
        returns (its result, the arrays it wrote to ``out``), the files removed."""
        path = self._path("batch")
        save_arrays(path, batch)
        args[path_arg] = path
        if out is not None:
            args["out"] = out
        try:
            result = self._call(method, about="on " + describe_batch(batch), **args)
        finally:
            os.remove(path)
        return result, (self._take(out) if out is not None else None)

    @staticmethod
    def _take(path):
        """The arrays of a file the worker wrote, the file removed."""
        try:
            return load_arrays(path)
        finally:
            os.remove(path)

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
        return self._arrays_in_worker("profile", batch, path_arg="batch_path", timeout=timeout,
                                      progress=progress, **options)[0]

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
        if inference or not isinstance(batch, Prepared):
            # inference reads only its own inputs (no labels), checked here and sent alone
            names = self._predict_inputs(batch)
            self._check_batch(batch, names)
            batch = OrderedDict((n, batch[n]) for n in names)
            arrays = self._arrays_in_worker("predict_arrays", batch, out=out)[1]
        else:
            self._on_batch("predict", batch, out=out)
            arrays = self._take(out)
        if "output" in arrays:
            return arrays["output"]
        return OrderedDict((k[len("output."):], v) for k, v in arrays.items())  # a dict

    def values(self, batch, names):
        """Graph values ``names`` in inference mode, computed in the worker."""
        arrays = self._arrays_in_worker("values", batch, out=self._path("values"),
                                        names=list(names))[1]
        return OrderedDict((n, arrays[n]) for n in names)

    def loss_and_gradients(self, batch):
        out = self._path("grads")
        loss = self._on_batch("loss_and_gradients", batch, out=out)["loss"]
        grads = self._take(out)
        return _loss_value(loss), OrderedDict((k, grads[k]) for k in self.trainable_names())

    def step_targets(self, batch):
        """The targets step's written inputs for ``batch``, made in the worker."""
        return self._arrays_in_worker("step_targets", batch, out=self._path("targets"))[1]

    # Each weights call marks a restore point: the weights a new worker holds if this one dies.
    def get_weights(self):
        out = self._path("weights")
        counters = self._call("get_weights", out=out)
        weights = load_arrays(out)
        self._mark_restore_point("the weights get_weights returned", counters, "set_weights", out)
        return weights

    def set_weights(self, weights):
        path = self._path("weights")
        checked = check(self.spec, weights)
        save_arrays(path, checked)
        try:
            counters = self._call("set_weights", path=path,
                                  about="of {} arrays".format(len(checked)))
        except BaseException:
            os.remove(path)
            raise
        self._mark_restore_point("the weights given to set_weights", counters, "set_weights", path)

    def save_weights(self, path):
        path = os.path.abspath(os.fspath(path))
        counters = self._call("save_weights", path=path, about="to " + path)
        self._keep_copy("the weights saved to " + path, counters, path)

    def load_weights(self, path):
        path = os.path.abspath(path_of(path))
        counters = self._call("load_weights", path=path, about="from " + path)
        self._keep_copy("the weights loaded from " + path, counters, path)

    def _keep_copy(self, what, counters, path):
        """A restore point from a user's weights file: a copy of it, which later changes to
        the file cannot touch."""
        own = self._path("restore")
        shutil.copyfile(path, own)
        self._mark_restore_point(what, counters, "load_weights", own)
