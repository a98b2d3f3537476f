"""The worker: runs one model of one backend in its own interpreter and answers requests.

Started by :mod:`tbdzoo.backends.remote` as ``python -m tbdzoo.backends.worker``. Requests and
replies are JSON lines on the original stdout/stdin; arrays travel as ``.npz`` files (never
pickles: the two sides may run different NumPy versions). Anything the framework prints goes
to stderr, which the client keeps for error reports; a fatal signal (SIGSEGV, SIGFPE, SIGABRT,
SIGBUS, SIGILL) writes the Python stack of every thread there first (faulthandler). Valid
Python 3.6: the CNTK side runs it.
"""
import faulthandler
import json
import os
import sys
import traceback

import numpy as np

from ..pipelines.measure import data_fed
from ..profiling.profile import profile
from ..profiling.timing import time_training
from ..weights import load_arrays
from .registry import build_native


def _protocol_streams():
    """Keep the real stdout for replies and send everything else printed to stderr."""
    reply = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return sys.stdin, reply


class Worker:
    def __init__(self):
        self.model = None
        self.batches = {}

    # Each handler takes the request's args and returns a JSON-able result.
    def build(self, model, backend, config, seed, overrides, device=None):
        self.model = build_native(model, backend, config=config, seed=seed, device=device,
                                  **overrides)
        return {"spec_hash": self.model.spec.hash(), "repr": repr(self.model),
                "device": self.model.device,
                "native_type": type(self.model.native).__module__ + "." +
                type(self.model.native).__name__}

    def prepare(self, key, path):
        self.batches[key] = self.model.prepare_batch(load_arrays(path))
        return {"items": self.batches[key].items}

    def forget(self, key):
        self.batches.pop(key, None)

    def _batch(self, key):
        return self.batches[key]

    def train_step(self, key):
        loss = self.model.train_step(self._batch(key))
        return {"loss": loss, "step_count": self.model.step_count}

    def train_steps(self, key, steps):
        """Several steps in one request, so the protocol adds no time between them."""
        losses = [self.model.train_step(self._batch(key)) for _ in range(steps)]
        return {"losses": losses, "step_count": self.model.step_count}

    def predict(self, key, out):
        _save_output(out, self.model.predict(self._batch(key)))

    def predict_arrays(self, path, out):
        _save_output(out, self.model.predict(load_arrays(path)))

    def values(self, path, names, out):
        np.savez(out, **self.model.values(load_arrays(path), names))

    def loss_and_gradients(self, key, out):
        loss, grads = self.model.loss_and_gradients(self._batch(key))
        np.savez(out, **grads)
        return {"loss": loss}

    def step_targets(self, path, out):
        np.savez(out, **self.model.step_targets(load_arrays(path)))

    # The weights requests answer with the step counters the weights go with: the client
    # keeps them to restore a new worker to (tbdzoo.backends.remote, RemoteModel._restore).
    def _counters(self):
        program = self.model.program is not None
        return {"step_count": self.model.step_count,
                "group_steps": dict(self.model.group_steps) if program else None}

    def set_counters(self, step_count, group_steps=None):
        """The step counters of a restored model (a new worker after one died)."""
        self.model.step_count = int(step_count)
        if group_steps is not None:
            self.model.group_steps.update((g, int(n)) for g, n in group_steps.items())

    def get_weights(self, out):
        np.savez(out, **self.model.get_weights())
        return self._counters()

    def set_weights(self, path):
        self.model.set_weights(load_arrays(path))
        return self._counters()

    def save_weights(self, path):
        self.model.save_weights(path)
        return self._counters()

    def load_weights(self, path):
        self.model.load_weights(path)
        return self._counters()

    def time_training(self, key, warmup, steps, repeats):
        """Timed in the worker, so the request round trip is never inside a timed step."""
        return time_training(self.model, self._batch(key), warmup, steps, repeats, _progress)

    def profile(self, batch_path=None, **options):
        batch = load_arrays(batch_path) if batch_path else None
        return profile(self.model, batch=batch, progress=_progress, **options)

    def data_fed(self, **options):
        """Training fed by the backend's own input pipeline, run here beside the model."""
        return data_fed(self.model, progress=_progress, **options)

    def ping(self):
        return {"pid": os.getpid(), "python": sys.version.split()[0]}


def _progress(done, total):
    """Progress goes to stderr as lines the client parses (tbdzoo.backends.remote)."""
    sys.stderr.write("tbdzoo-progress {} {}\n".format(done, total))
    sys.stderr.flush()


def _save_output(out, output):
    """A prediction to ``out``: one array as 'output', a dict of arrays (an inference hook's)
    as 'output.<key>'."""
    if isinstance(output, dict):
        np.savez(out, **dict(("output." + k, v) for k, v in output.items()))
    else:
        np.savez(out, output=output)


def _plain(value):
    """An error's attribute as JSON (NumPy scalars and small arrays as Python values, tuples
    marked so the client gets tuples back), or raise TypeError."""
    if isinstance(value, tuple):
        return {"__tuple__": [_plain(v) for v in value]}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return dict((str(k), _plain(v)) for k, v in value.items())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray) and value.size <= 64:
        return _plain(value.tolist())
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError("not sent: {!r}".format(type(value)))


def error_reply(error):
    """The reply for a request that raised ``error``: its class name, message, arguments and
    attributes (those JSON can carry) and traceback, from which the client raises the same
    class (tbdzoo.backends.remote)."""
    reply = {"ok": False, "error": type(error).__name__, "module": type(error).__module__,
             "message": str(error), "traceback": traceback.format_exc()}
    try:
        reply["args"] = _plain(list(error.args))
    except TypeError:
        pass
    attributes = {}
    for name, value in vars(error).items():
        try:
            attributes[name] = _plain(value)
        except TypeError:
            pass
    reply["attributes"] = attributes
    return reply


def serve(requests, replies):
    worker = Worker()
    for line in requests:
        if not line.strip():
            continue
        request = json.loads(line)
        method = request.get("method")
        if method == "shutdown":
            replies.write(json.dumps({"ok": True, "result": None}) + "\n")
            replies.flush()
            return
        try:
            handler = getattr(worker, method, None)
            if handler is None or method.startswith("_"):
                raise ValueError("unknown worker method {!r}".format(method))
            reply = {"ok": True, "result": handler(**request.get("args", {}))}
        except Exception as e:  # noqa: BLE001  (every failure goes back to the caller, with its traceback)
            reply = error_reply(e)
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def main():
    requests, replies = _protocol_streams()
    faulthandler.enable(sys.stderr, all_threads=True)
    serve(requests, replies)


if __name__ == "__main__":
    main()
