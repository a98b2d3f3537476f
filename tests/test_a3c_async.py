"""Asynchronous A3C (docs/a3c.md): two learners on CartPole on every backend make real updates
to one set of shared parameters through one shared RMSProp state, frames are counted, and bad
input is refused. No timing asserts: speed is measured by benchmarks/gpu_a3c.py."""
import subprocess
import sys

import numpy as np
import pytest

from conftest import require_backend
from tbdzoo.errors import HyperparameterError, UnsupportedOptionError
from tbdzoo.rl import RunResult, train_a2c, train_a3c
from tbdzoo.rl.async_learners.common import NumpyRMSProp, Settings

# CartPole's network narrowed, so each learner's step costs little on a loaded machine.
SMALL = {"hidden": (8, 8)}
FRAMES = {"torch": 300, "tensorflow": 300, "mxnet": 300, "cntk": 60, "jax": 60}


@pytest.mark.parametrize("backend", ["torch", "tensorflow", "mxnet", "cntk", "jax"])
def test_two_learners_update_the_shared_parameters(backend):
    require_backend(backend)
    result = train_a3c(backend, "cartpole", learners=2, frames=FRAMES[backend], seed=0, **SMALL)
    assert isinstance(result, RunResult) and result.backend == backend
    t_max = 5   # CartPole: one frame per agent step
    assert result.learners == 2 and len(result.cpu_utilisation) == 2
    assert result.frames >= FRAMES[backend]
    assert result.frames == t_max * result.updates
    assert result.frames_by_learner == [t_max * u for u in result.updates_by_learner]
    # both learners updated, and the one shared optimizer state counted both
    assert min(result.updates_by_learner) > 0
    assert result.optimizer_updates == result.updates_by_learner
    for name, before in result.initial_weights.items():
        assert not np.array_equal(result.weights[name], before), name
        assert np.all(np.isfinite(result.weights[name])), name
        v = result.square_averages[name]
        assert v.shape == before.shape and np.all(v >= 0) and v.max() > 0, name
    assert all(c > 0 for c in result.cpu_utilisation)
    assert result.frames_per_second > 0 and result.updates_per_second > 0


def _settings(**changes):
    hp = {"t_max": 5, "gamma": 0.99, "reward_clip": 0.0, "lr": 0.1, "alpha": 0.99, "eps": 0.1,
          "grad_clip_norm": 0.0, "anneal_steps": 100, "learners": 2, "lr_schedule": "linear",
          "num_actions": 2}
    hp.update(changes)
    return Settings(hp, 2, 1)


def _expected(w, g1, g2, s, lr):
    """Two learners' steps on one state: the second sees the first's square average."""
    v1 = (1 - s.alpha) * g1 * g1
    w1 = w - lr * g1 / np.sqrt(v1 + s.eps)
    v2 = s.alpha * v1 + (1 - s.alpha) * g2 * g2
    return w1 - lr * g2 / np.sqrt(v2 + s.eps), v2


def test_two_learners_share_one_numpy_rmsprop_state():
    s = _settings()
    w = np.array([1.0, -2.0, 0.5], np.float32)
    g1, g2 = np.array([0.3, -1.0, 2.0], np.float32), np.array([-0.5, 0.2, 1.0], np.float32)
    params, square, updates = {"w": w.copy()}, {"w": np.zeros(3, np.float32)}, np.zeros(2, np.int64)
    first = NumpyRMSProp(params, square, updates, s)    # each learner holds its own optimizer
    second = NumpyRMSProp(params, square, updates, s)   # object over the same shared arrays
    first.step(0, {"w": g1}, 0.1)
    second.step(1, {"w": g2}, 0.1)
    want_w, want_v = _expected(w, g1, g2, s, 0.1)
    np.testing.assert_allclose(params["w"], want_w, rtol=1e-5)
    np.testing.assert_allclose(square["w"], want_v, rtol=1e-5)
    assert updates.tolist() == [1, 1]


def test_two_learners_share_one_torch_rmsprop_state():
    import torch

    from tbdzoo.backends.torch.async_learners import SharedRMSprop
    s = _settings()
    w = np.array([1.0, -2.0, 0.5], np.float32)
    g1, g2 = np.array([0.3, -1.0, 2.0], np.float32), np.array([-0.5, 0.2, 1.0], np.float32)
    shared = torch.tensor(w).share_memory_()
    first = SharedRMSprop([shared], s, learners=2)
    second = SharedRMSprop([shared], s, square_averages=first.square_averages,
                           updates=first.updates)
    for optimizer, index, g in ((first, 0, g1), (second, 1, g2)):
        shared.grad = torch.tensor(g)
        optimizer.step(index, 0.1)
    want_w, want_v = _expected(w, g1, g2, s, 0.1)
    np.testing.assert_allclose(shared.detach().numpy(), want_w, rtol=1e-5)
    np.testing.assert_allclose(first.square_averages[0].numpy(), want_v, rtol=1e-5)
    assert first.updates.tolist() == [1, 1]


def test_two_learners_share_one_tensorflow_rmsprop_state():
    """Each learner thread steps its own backend RMSProp over the shared variable and the one
    shared square average (tbdzoo/backends/tensorflow/optimizers.py's fused kernel)."""
    tf = pytest.importorskip("tensorflow")
    from tbdzoo.backends.tensorflow.async_learners import SharedRMSprop
    s = _settings()
    w = np.array([1.0, -2.0, 0.5], np.float32)
    g1, g2 = np.array([0.3, -1.0, 2.0], np.float32), np.array([-0.5, 0.2, 1.0], np.float32)
    shared = tf.Variable(w)
    optimizer = SharedRMSprop([shared], s, learners=2)
    optimizer.step(0, [tf.constant(g1)], 0.1)
    optimizer.step(1, [tf.constant(g2)], 0.1)
    want_w, want_v = _expected(w, g1, g2, s, 0.1)
    np.testing.assert_allclose(shared.numpy(), want_w, rtol=1e-5)
    np.testing.assert_allclose(optimizer.slots[0].numpy(), want_v, rtol=1e-5)
    assert optimizer.updates.tolist() == [1, 1]


def test_one_result_type_for_the_synchronous_and_the_asynchronous_modes():
    """train_a2c and train_a3c both return a RunResult; an asynchronous one says so in its
    summary and record, a synchronous one names its target."""
    import tbdzoo
    model = tbdzoo.build("a3c", backend="torch", config="cartpole", seed=0, **SMALL)
    try:
        sync = train_a2c(model, seed=0, max_updates=3, progress=lambda line: None)
    finally:
        model.close()
    assert isinstance(sync, RunResult) and sync.learners is None
    assert sync.updates == 3 and "target not reached" in sync.summary()
    run = RunResult("CartPole-v1", backend="torch", learners=2, how="2 processes")
    run.episode_returns = [float(r) for r in range(150)]
    assert run.mean_return() == pytest.approx(np.mean(range(50, 150)))   # the last 100
    assert "2 learners" in run.summary() and run.record()["episodes"] == 150


def test_the_learning_rate_anneals_with_the_frames_of_all_learners():
    s = _settings()   # 100 updates x 2 learners x 5 steps x 1 frame = 1,000 frames
    assert [s.learning_rate(f) for f in (0, 500, 1000, 2000)] == pytest.approx([0.1, 0.05, 0, 0])
    assert _settings(lr_schedule="constant").learning_rate(5000) == 0.1


def test_fewer_than_one_learner_is_refused():
    for bad in (0, -3, True, 1.5):
        with pytest.raises(HyperparameterError, match="learners.*at least one actor-learner"):
            train_a3c("torch", "cartpole", learners=bad, frames=10)
    with pytest.raises(ValueError, match="stopping rule"):
        train_a3c("torch", "cartpole", learners=1)
    with pytest.raises(UnsupportedOptionError, match="run on the CPU; fix"):
        train_a3c("mxnet", "cartpole", learners=1, frames=10, device="cuda:0")
    done = subprocess.run([sys.executable, "-m", "tbdzoo.cli", "sweep", "a3c", "--backend",
                           "torch", "--config", "cartpole", "--learners", "2,0", "--frames", "10"],
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert "learners=0: asynchronous A3C needs at least one actor-learner" in done.stderr
