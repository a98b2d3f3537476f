"""Is a backend's work finished when a step returns? Asked with each framework's own primitive.

A step is timed, then the framework is drained with a call that waits for everything it has
queued (``mx.nd.waitall()``, TensorFlow's ``sync_devices()``, ``torch.cuda.synchronize()``;
CNTK has no queue to wait on, so a read of every parameter, which waits for its writer), then
drained again at once to time the drain's own cost. The difference is the work the step left
queued. A step that returned with its backward pass or update still queued leaves a sizeable
fraction of its own time; a complete one leaves nothing. Nothing here calls tbdzoo's own
``synchronize``, so the check does not trust what it checks.

Imported by tests/test_timing.py for the backends of the main interpreter, and run as a script
in the CNTK environment (``python completion_probe.py cntk``) through the worker's own request
handlers (the JAX environment's the same way). Valid Python 3.6.
"""
import json
import os
import sys
import tempfile
import time

# Tiny ResNet-50 with a larger batch and image: few ops, each with real work, so the backward
# pass is long compared with the host's time to launch it.
OVERRIDES = {"batch_size": 16, "image_size": 96}
TRIALS = 5


def framework_drain(model):
    """A function that waits for all the work ``model``'s framework has queued, by its own API."""
    if model.backend == "mxnet":
        import mxnet as mx
        return mx.nd.waitall
    if model.backend == "tensorflow":
        import tensorflow as tf
        return tf.test.experimental.sync_devices
    if model.backend == "torch":
        import torch
        if model.device.startswith("cuda"):
            return lambda: torch.cuda.synchronize(model.device)
        return lambda: None  # PyTorch runs CPU kernels before the call that launched them returns
    if model.backend == "cntk":
        params = list(model.native.parameters)
        return lambda: [p.value for p in params]
    if model.backend == "jax":  # waits for the array each of the model's variables holds now
        import jax
        from flax import nnx
        # the variables found once: nnx.state's walk of the tree costs 1 ms more on its first
        # call after a step than on the next (tiny ResNet-50: 3.1 against 2.1 ms), 5% of a step
        # that left nothing queued
        variables = [node for _, node in nnx.iter_graph(model.native)
                     if isinstance(node, nnx.Variable)]
        return lambda: jax.block_until_ready([v.get_raw_value() for v in variables])
    raise ValueError("no drain for backend {!r}".format(model.backend))


def _timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def queued_fraction(drain, seconds):
    """Time the framework still needed, as a fraction of ``seconds``, the drain's own cost off."""
    waited = _timed(drain)
    return max(0.0, waited - _timed(drain)) / seconds


def step_fractions(step, drain, trials=TRIALS):
    """For each of ``trials`` steps, the queued fraction of its time when it returned."""
    drain()
    return [queued_fraction(drain, _timed(step)) for _ in range(trials)]


class DrainMeter:
    """A meter for time_training: stop() runs right after the last timed window has closed."""

    def __init__(self, drain):
        self.drain = drain

    def start(self):
        pass

    def stop(self):
        waited = _timed(self.drain)
        return {"waited": waited, "idle": _timed(self.drain)}


def window_fractions(model, prepared, drain, calls=3):
    """Queued fractions when time_training read the first step's time and when its last timed
    window closed (two steps, the first queued without waiting), for each of ``calls`` runs."""
    from tbdzoo.profiling.timing import time_training
    first, last = [], []
    for _ in range(calls):
        after_first = []

        def progress(done, total, after_first=after_first):  # after the first step's time was read
            if done == 1:
                waited = _timed(drain)
                after_first.append(max(0.0, waited - _timed(drain)))
        result = time_training(model, prepared, warmup=1, steps=2, repeats=1, progress=progress,
                               meters=[DrainMeter(drain)])
        first.append(after_first[0] / result["first_step_s"])
        meter = result["meters"][0]
        last.append(max(0.0, meter["waited"] - meter["idle"]) / (2 * result["step_time"]["median"]))
    return {"first_step": first, "last_window": last}


def probe_model(model, prepared, step):
    drain = framework_drain(model)
    step()  # the first step builds and compiles: not one of the trials
    result = {"steps": step_fractions(step, drain)}
    result.update(window_fractions(model, prepared, drain))
    return result


def probe_through_worker(backend):
    """Build and step the model with the worker's own request handlers, as RemoteModel does."""
    from tbdzoo.backends.worker import Worker
    from tbdzoo.weights import save_arrays
    worker = Worker()
    worker.build("resnet50", backend, "tiny", 0, OVERRIDES)
    folder = tempfile.mkdtemp(prefix="tbdzoo-probe-")
    path = os.path.join(folder, "batch.npz")
    save_arrays(path, worker.model.synthetic_batch())
    worker.prepare("b", path)
    os.remove(path)
    os.rmdir(folder)
    return probe_model(worker.model, worker.batches["b"], lambda: worker.train_step("b"))


if __name__ == "__main__":
    sys.stdout.write(json.dumps(probe_through_worker(sys.argv[1])) + "\n")
