"""CNTK backend specifics, reached the way users reach it from the main interpreter: through
``tbdzoo.build(..., backend='cntk')``, which starts a worker in the CPython 3.6 environment.
Cross-framework agreement lives in the consistency tests; here: the remote handle, weights,
running statistics for any batch size, the normalized optimizers and Python 3.6 validity."""
import os
import subprocess

import numpy as np
import pytest

import tbdzoo
from conftest import random_weights, require_backend, run_in_env
from tbdzoo.backends import environments
from tbdzoo.backends.base import BackendModel
from tbdzoo.backends.remote import RemoteModel, WorkerHandle

BACKEND_DIR = os.path.join(environments.SOURCE_ROOT, "tbdzoo", "backends", "cntk")


@pytest.fixture(scope="module")
def bn_model():
    """One worker for the tests that only need a small model (a worker takes seconds to start)."""
    require_backend("cntk")
    model = tbdzoo.build("probe/batchnorm", backend="cntk", config="tiny")
    yield model
    model.close()


def test_the_model_lives_in_a_worker_holding_a_cntk_function(bn_model):
    assert isinstance(bn_model, RemoteModel)
    assert isinstance(bn_model.native, WorkerHandle)
    assert bn_model.native.native_type == "cntk.ops.functions.Function"
    assert bn_model.native.python == environments.python_of("cntk")
    assert bn_model.native.process.poll() is None


def test_the_handle_has_the_methods_of_a_native_model(bn_model):
    public = [n for n in dir(BackendModel) if not n.startswith("_")]
    assert all(callable(getattr(bn_model, n)) for n in public if callable(getattr(BackendModel, n)))
    batch = bn_model.synthetic_batch(seed=1)
    out = bn_model.predict(batch)
    assert out.shape == (len(batch["labels"]),) + bn_model.spec.shape_of(bn_model.spec.output)
    loss, grads = bn_model.loss_and_gradients(batch)
    assert np.isfinite(loss) and list(grads) == bn_model.trainable_names()
    assert all(grads[n].shape == bn_model.spec.params()[n].shape for n in grads)
    steps = bn_model.step_count
    losses = bn_model.train_steps(batch, 2)
    assert len(losses) == 2 and bn_model.step_count == steps + 2


def test_running_statistics_follow_the_spec_for_any_batch_size(bn_model):
    """CNTK blends batch statistics by a factor that depends on the batch size; the backend
    must give running = (1 - m) running + m batch (unbiased variance) for every size, and
    gradients alone must change nothing."""
    bn_model.set_weights(bn_model.get_weights())
    mean, var = bn_model.get_weights()["bn.running_mean"], bn_model.get_weights()["bn.running_var"]
    m = bn_model.spec.nodes["bn"].attrs["momentum"]
    for size in (3, 5, 2):
        batch = bn_model.synthetic_batch(seed=size, batch_size=size)
        before = bn_model.get_weights()
        bn_model.loss_and_gradients(batch)
        for key, value in bn_model.get_weights().items():
            np.testing.assert_array_equal(value, before[key])
        bn_model.train_step(batch)
        x = batch["x"].astype(np.float64)
        mean = (1 - m) * mean + m * x.mean(axis=(0, 2, 3))
        var = (1 - m) * var + m * x.var(axis=(0, 2, 3), ddof=1)
        after = bn_model.get_weights()
        np.testing.assert_allclose(after["bn.running_mean"], mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(after["bn.running_var"], var, rtol=1e-5, atol=1e-6)


def test_inference_uses_running_statistics(bn_model):
    weights = random_weights(bn_model, 5)
    bn_model.set_weights(weights)
    batch = bn_model.synthetic_batch(seed=2)
    shape = (1, -1, 1, 1)
    x = (batch["x"] - weights["bn.running_mean"].reshape(shape)) / np.sqrt(
        weights["bn.running_var"].reshape(shape) + 1e-5)
    x = x * weights["bn.gamma"].reshape(shape) + weights["bn.beta"].reshape(shape)
    logits = x.reshape(len(x), -1) @ weights["head.fc.weight"].T + weights["head.fc.bias"]
    np.testing.assert_allclose(bn_model.predict(batch), logits, rtol=1e-4, atol=1e-4)


def test_a_transformer_with_tied_weights_trains_in_the_worker():
    require_backend("cntk")
    with tbdzoo.build("transformer", backend="cntk", config="tiny", dropout=0.0) as model:
        assert "generator.weight" not in model.get_weights()
        batch = model.synthetic_batch()
        _, grads = model.loss_and_gradients(batch)
        assert np.abs(grads["embed.weight"]).max() > 0
        losses = model.train_steps(batch, 3)
        assert all(np.isfinite(losses)) and losses[-1] < losses[0]
        assert model.predict(batch).shape == batch["labels"].shape + (model.hparams["vocab"],)


_OPTIMIZER_CHECK = r"""
import numpy as np, cntk as C
from tbdzoo.backends.cntk import optimizers
from tbdzoo.reference.optimizers import Optimizer as ReferenceOptimizer

def run(hp):
    rng = np.random.RandomState(0)
    w = rng.standard_normal(6)
    p = C.parameter(init=w.astype(np.float32))
    opt, reference = optimizers.make([p], hp), ReferenceOptimizer(hp)
    for lr in (0.1, 0.05, 0.2):  # the rate changes every step
        g = rng.standard_normal(6)
        opt.prepare(lr)
        opt.learner.update({p: C.NDArrayView.from_dense(g.astype(np.float32))}, 1)
        w = reference.step(w, g, lr)
        np.testing.assert_allclose(p.value, w, rtol=1e-5, atol=1e-6)

for nesterov in (False, True):
    run({"optimizer": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": nesterov,
         "weight_decay": 0.01})
run({"optimizer": "adam", "lr": 0.1, "beta1": 0.9, "beta2": 0.98, "eps": 1e-3,
     "weight_decay": 0.01})  # a large eps shows where it sits
print("optimizers ok")
"""


def test_optimizers_are_the_normalized_formulas():
    require_backend("cntk")
    proc = run_in_env(environments.python_of("cntk"), ["-c", _OPTIMIZER_CHECK], timeout=300)
    assert proc.returncode == 0 and "optimizers ok" in proc.stdout, proc.stdout + proc.stderr


def test_the_backend_byte_compiles_under_python36():
    require_backend("cntk")
    files = sorted(os.path.join(BACKEND_DIR, f) for f in os.listdir(BACKEND_DIR) if f.endswith(".py"))
    assert [os.path.basename(f) for f in files] == [
        "__init__.py", "async_learners.py", "blocks.py", "distributed.py", "framework.py",
        "model.py", "ops.py", "optimizers.py", "source.py"]
    proc = run_in_env(environments.python_of("cntk"), ["-m", "py_compile"] + files)
    assert proc.returncode == 0, proc.stdout + proc.stderr


_ONE_THREAD_WEIGHT_GRADIENTS = r"""
from tbdzoo.backends.registry import build_native
model = build_native("wgan", "cntk", config="paper", dim=4, batch_size=16)
batch = model.prepare_batch(model.synthetic_batch(seed=0))
for _ in range(2):
    model.train_step(batch)
print("one-thread steps ok")
"""


def test_one_thread_runs_finish_their_convolution_gradients():
    """With OMP_NUM_THREADS=1 the backend must not cap OpenMP's teams: a cap deadlocked
    MKL-ML's 1x1 weight gradient on AVX-512 CPUs (WGAN's critic has them; docs/benchmarks.md)."""
    require_backend("cntk")
    env = dict(environments.worker_environment(), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("OMP_THREAD_LIMIT", None)
    try:
        done = subprocess.run([environments.python_for("cntk"), "-c", _ONE_THREAD_WEIGHT_GRADIENTS],
                              env=env, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        pytest.fail("two one-thread WGAN steps (seconds each) did not finish in 180 s: a "
                    "capped OpenMP team deadlocks MKL-ML's weight gradient")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "one-thread steps ok" in done.stdout
