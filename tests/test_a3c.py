"""A3C: the model on every backend against PyTorch on a recorded CartPole rollout, its loss terms
against NumPy, the synchronous trainer (seeded, learning) and the errors of bad input."""
import numpy as np
import pytest

from conftest import random_weights, require_backend
from tbdzoo import consistency
from tbdzoo import reference as numpy_ref
from tbdzoo.backends import programs
from tbdzoo.backends.registry import build
from tbdzoo.errors import HyperparameterError
from tbdzoo.models.a3c.environments import Rollout, UnknownEnvironmentError
from tbdzoo.models.a3c.rollouts import split_output
from tbdzoo.rl import sample_actions, train_a2c, update_batch
from tbdzoo.rl.a2c import EnvironmentMismatchError


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread(one_torch_thread):
    """The networks here are tiny (conftest.one_torch_thread)."""


# CartPole's network, narrowed, and 8 learners: a rollout of 8 x 5 steps is the update's batch;
# the paper's entropy weight, so the update's gradients include the term the cartpole config
# leaves out.
SMALL = {"hidden": (8, 8), "learners": 8, "entropy_weight": 0.01}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A CartPole rollout taken by the torch policy, written to its file and read back, and
    the reference protocol (forward, loss, gradients, three steps) on its update batch."""
    from tbdzoo.models.a3c.environments import VectorEnv, collect
    model = build("a3c", backend="torch", config="cartpole", seed=0, **SMALL)
    weights = model.get_weights()
    rng = np.random.default_rng(0)

    def policy(obs):
        logits, values = split_output(model.predict({"observations": obs.astype(np.float32)}), 2)
        return sample_actions(logits, rng), values

    # a time limit of 12 steps: the recorded rollout (steps 10-14) holds a termination and the
    # truncations of the first episodes, so its returns bootstrap from final values too
    with VectorEnv("CartPole-v1", n=8, seed=0, max_episode_steps=12) as envs:
        for _ in range(3):   # into the episodes, so the returns see some episode ends
            rollout = collect(envs, policy, 5)
    assert rollout.truncated.any() and (rollout.dones & ~rollout.truncated).any()
    path = str(tmp_path_factory.mktemp("rollout") / "cartpole.npz")
    rollout.save(path)
    batch = update_batch(Rollout.load(path), model.hparams["gamma"])
    record = consistency.run_protocol(model, weights, batch, steps=3)
    return weights, batch, record


def test_the_loss_is_its_three_terms(recorded):
    """policy gradient - 0.01 entropy + 0.5 mean squared error, each term in NumPy (float64)
    from the reference's own logits and values."""
    _weights, batch, record = recorded
    logits, values = record["forward"][:, :2], record["forward"][:, 2:]
    terms = {kind: numpy_ref.loss_term(kind, values_, {}) for kind, values_ in (
        ("policy_gradient", {"logits": logits, "actions": batch["actions"],
                             "advantages": batch["advantages"]}),
        ("entropy", {"logits": logits}),
        ("squared_error", {"prediction": values, "target": batch["returns"]}))}
    assert 0.0 < terms["entropy"] <= np.log(2.0)
    expected = terms["policy_gradient"] - 0.01 * terms["entropy"] + terms["squared_error"]
    assert record["loss"] == pytest.approx(expected, rel=1e-5)
    assert terms["squared_error"] == pytest.approx(
        0.5 * np.mean((values[:, 0] - batch["returns"][:, 0]) ** 2))


@pytest.mark.parametrize("backend", ["tensorflow", "mxnet", "cntk", "jax"])
def test_a_recorded_rollout_trains_alike_on_every_backend(backend, recorded):
    """Forward, loss, every gradient and a three-step trajectory at docs/consistency.md's
    tolerances; the weights survive a round trip; the Atari network (tiny) predicts alike."""
    require_backend(backend)
    weights, batch, record = recorded
    model = build("a3c", backend=backend, config="cartpole", seed=1, isolate=backend == "cntk",
                  **SMALL)
    try:
        assert consistency.compare(record, consistency.run_protocol(model, weights, batch)) == []
        drawn = random_weights(model)
        model.set_weights(drawn)
        assert all(np.array_equal(model.get_weights()[k], v) for k, v in drawn.items())
    finally:
        model.close()
    reference = build("a3c", backend="torch", config="tiny")
    frames = reference.synthetic_batch(seed=2)
    other = build("a3c", backend=backend, config="tiny", seed=1, isolate=backend == "cntk")
    try:
        other.set_weights(reference.get_weights())
        np.testing.assert_allclose(other.predict(frames), reference.predict(frames),
                                   rtol=1e-4, atol=1e-5)
    finally:
        other.close()


def test_the_update_batch_bootstraps_a_truncation_from_its_final_value():
    """Two learners, three steps, time-major: learner 0's episode is cut by the time limit at
    step 1 (V of its final observation 8), learner 1's terminates there."""
    t, n = 3, 2
    rollout = Rollout(
        observations=np.zeros((t, n, 4), np.float32), actions=np.zeros((t, n), np.int64),
        rewards=np.array([[1.0, 0.0], [1.0, 3.0], [1.0, 2.0]]),
        dones=np.array([[0, 0], [1, 1], [0, 0]], bool),
        truncated=np.array([[0, 0], [1, 0], [0, 0]], bool),
        truncation_values=np.array([[0.0, 0.0], [8.0, 0.0], [0.0, 0.0]]),
        values=np.array([[1.0, 1.0], [0.5, 0.0], [6.0, 5.0]]), bootstrap=np.array([10.0, 4.0]),
        next_observations=np.zeros((n, 4), np.float32), episode_returns=np.zeros(2),
        episode_lengths=np.zeros(2, np.int64), frames=6)
    batch = update_batch(rollout, gamma=0.5)
    # learner 0: 1 + .5 * (1 + .5 * 8) = 3.5, 1 + .5 * 8 = 5, 1 + .5 * 10 = 6
    # learner 1: 0 + .5 * 3 = 1.5, 3, 2 + .5 * 4 = 4
    np.testing.assert_array_equal(batch["returns"][:, 0], [3.5, 1.5, 5.0, 3.0, 6.0, 4.0])
    np.testing.assert_array_equal(batch["advantages"], [2.5, 0.5, 4.5, 3.0, 0.0, -1.0])


def test_the_learning_rate_anneals_linearly_to_zero():
    model = build("a3c", backend="torch", config="tiny", anneal_steps=10)
    group = model.program.groups["all"]
    rates = [programs.learning_rate(group, step) for step in (0, 5, 10, 20)]
    assert rates == pytest.approx([7e-4, 3.5e-4, 0.0, 0.0])
    assert group["clip"] == {"kind": "global_norm", "value": 40.0}


def test_the_synchronous_trainer_is_seeded():
    """Two runs of one seed take the same actions, so they see the same episodes and end at
    the same weights; the result counts frames and updates."""
    def run():
        model = build("a3c", backend="torch", config="cartpole", seed=0, **SMALL)
        result = train_a2c(model, seed=3, max_updates=15)
        return result, model.get_weights()
    (a, wa), (b, wb) = run(), run()
    assert (a.frames, a.updates) == (b.frames, b.updates) == (15 * 8 * 5, 15)
    assert a.episode_returns == b.episode_returns and len(a.episode_returns) > 0
    assert all(np.array_equal(wa[k], wb[k]) for k in wa)
    assert a.frames_per_second > 0 and a.updates_per_second > 0


def test_cartpole_learns():
    """The mean return climbs well above a random policy's (about 22) within 16,000 frames;
    docs/models.md records the runs that reach 475."""
    model = build("a3c", backend="torch", config="cartpole", seed=0)
    result = train_a2c(model, seed=0, max_frames=16000)
    random_policy = 22.0
    assert result.mean_return(last=20) > 2.5 * random_policy, result.summary()


def test_bad_input_gets_a_clear_error():
    model = build("a3c", backend="torch", config="cartpole", **SMALL)
    with pytest.raises(UnknownEnvironmentError, match="unknown environment 'pongg'.*pong"):
        train_a2c(model, env="pongg", max_updates=1)
    with pytest.raises(EnvironmentMismatchError, match=r"\(4, 84, 84\).*observation_shape=4,84,84"):
        train_a2c(model, env="pong", max_updates=1)
    with pytest.raises(ValueError, match="stopping rule"):
        train_a2c(model)
    with pytest.raises(HyperparameterError, match="learners .* = 0"):
        build("a3c", backend="torch", config="tiny", learners=0)
    with pytest.raises(HyperparameterError, match=r"too small .*\(4, 84, 84\)"):
        build("a3c", backend="torch", config="paper", observation_shape=(4, 10, 10))
    with pytest.raises(HyperparameterError, match="cannot feed the atari network"):
        build("a3c", backend="torch", config="paper", observation_shape=(4,))


def test_the_command_line_records_each_run(tmp_path):
    """`python -m tbdzoo.rl --record FILE` adds one run per call, with the command that
    reproduces it (benchmarks/results/a3c_cartpole.json is such a file)."""
    import json

    from tbdzoo.rl.__main__ import main
    path = str(tmp_path / "runs.json")
    argv = ["--config", "cartpole", "--set", "hidden=8,8", "--set", "learners=4",
            "--max-frames", "200", "--record", path]
    assert main(argv + ["--seed", "1"]) == 0 and main(argv + ["--seed", "2"]) == 0
    with open(path) as f:
        runs = json.load(f)["runs"]
    assert [r["seed"] for r in runs] == [1, 2]
    first = runs[0]
    assert first["backend"] == "torch" and first["frames"] == 200 and not first["reached"]
    assert first["hparams"]["learners"] == 4 and first["overrides"]["hidden"] == [8, 8]
    assert first["command"].startswith("python -m tbdzoo.rl --config cartpole --set hidden=8,8")
