"""A3C's environments on the real Gymnasium and ALE: Pong's preprocessed frames, seeding, frame
counts, CartPole rollouts, n-step returns on hand-computed cases, the rollout file, errors."""
import itertools
import sys

import numpy as np
import pytest

from conftest import IN_CI, require_backend, run_in_env
from tbdzoo.backends import environments as venvs
from tbdzoo.errors import TbdError
from tbdzoo.models.a3c import environments as E


def require_opencv():
    """Gymnasium's AtariPreprocessing needs OpenCV (requirements/main.txt pins it)."""
    try:
        import cv2  # noqa: F401  (only whether it imports)
    except ImportError:
        message = "opencv-python-headless is not installed: pip install -r requirements/main.txt"
        if IN_CI:
            pytest.fail(message + " (CI must run the Atari tests)")
        pytest.skip(message)


def random_policy(num_actions, seed=0):
    rng = np.random.default_rng(seed)
    return lambda obs: (rng.integers(0, num_actions, len(obs)), np.zeros(len(obs)))


def lean_policy(obs):
    """CartPole: push the cart the way the pole leans. Deterministic, episodes of ~40 steps."""
    return (obs[:, 2] > 0).astype(np.int64), obs[:, 2].astype(np.float32)


# ---------------------------------------------------------------- names and preprocessing

@pytest.mark.parametrize("name", ["pong", "Pong", "ALE/Pong-v5"])
def test_pong_names_resolve_to_the_v5_id(name):
    assert E.resolve(name) == "ALE/Pong-v5"


def test_other_names_resolve():
    assert E.resolve("ms_pacman") == "ALE/MsPacman-v5"
    assert E.resolve("cartpole") == "CartPole-v1"
    assert E.resolve("CartPole-v1") == "CartPole-v1"
    assert E.DEFAULT == "ALE/Pong-v5"


def test_make_seeds_the_first_reset():
    a, b, c = (E.make("cartpole", seed=s) for s in (2, 2, 3))
    first = [env.reset()[0] for env in (a, b, c)]
    np.testing.assert_array_equal(first[0], first[1])
    assert not np.array_equal(first[0], first[2])
    np.testing.assert_array_equal(a.reset()[0], b.reset()[0])  # later resets follow the seed
    np.testing.assert_array_equal(a.reset(seed=2)[0], first[0])  # an explicit seed still wins


def test_pong_observations_are_four_stacked_84x84_uint8_frames():
    require_opencv()
    env = E.make("pong", seed=0)
    obs, _ = env.reset()
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    assert env.action_space.n == 6  # Pong's minimal action set
    obs, _reward, _terminated, _truncated, _ = env.step(0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    assert obs.max() > obs.min()  # a real screen, not a blank one
    assert E.frames_per_step(env) == 4
    env.close()


def test_sticky_actions_are_off_by_default_and_an_option():
    require_opencv()
    for options, expected in [({}, 0.0), ({"repeat_action_probability": 0.25}, 0.25)]:
        env = E.make("pong", seed=0, **options)
        env.reset()
        assert env.unwrapped.ale.getFloat("repeat_action_probability") == pytest.approx(expected)
        env.close()


def test_same_seed_same_actions_same_pong_frames():
    require_opencv()

    def same_action_everywhere(seed):
        rng = np.random.default_rng(seed)
        return lambda obs: (np.full(len(obs), rng.integers(0, 6)), np.zeros(len(obs)))

    a, b = E.VectorEnv("pong", 2, seed=3), E.VectorEnv("pong", 2, seed=3)
    ra = E.collect(a, same_action_everywhere(1), 20)
    rb = E.collect(b, same_action_everywhere(1), 20)
    assert ra.observations.shape == (20, 2, 4, 84, 84) and ra.observations.dtype == np.uint8
    assert ra == rb
    assert not np.array_equal(ra.observations[0], ra.observations[-1])  # the game moved
    # the seed matters: seeds 3 and 4 start after other no-op counts, same actions or not
    assert not np.array_equal(ra.observations[:, 0], ra.observations[:, 1])
    a.close(), b.close()


def test_atari_frames_count_the_skipped_frames():
    require_opencv()
    envs = E.VectorEnv("pong", 2, seed=0)
    assert E.collect(envs, random_policy(6), 5).frames == 5 * 2 * 4
    assert E.collect(envs, random_policy(6), 3).frames == 3 * 2 * 4
    assert envs.frames == 8 * 2 * 4
    envs.close()


def test_vector_env_takes_the_frame_skip_option():
    require_opencv()
    envs = E.VectorEnv("pong", 1, seed=0, frame_skip=2, stack=2)
    assert envs.observation_shape == (2, 84, 84) and envs.frames_per_step == 2
    envs.close()


# ---------------------------------------------------------------- CartPole rollouts

def test_cartpole_random_rollout_arrays_and_episodes():
    envs = E.VectorEnv("CartPole-v1", 3, seed=0)
    r = E.collect(envs, random_policy(2), 100)
    assert r.observations.shape == (100, 3, 4) and r.observations.dtype == np.float32
    assert r.actions.shape == r.rewards.shape == r.dones.shape == r.values.shape == (100, 3)
    assert r.bootstrap.shape == (3,) and r.next_observations.shape == (3, 4)
    assert r.frames == 300 == envs.frames  # one frame per step on classic control
    assert np.all(r.rewards == 1.0)
    # random play ends an episode every ~20 steps; each ending is one finished episode
    assert len(r.episode_returns) == r.dones.sum() > 5
    np.testing.assert_array_equal(r.episode_returns, r.episode_lengths)  # +1 per step
    # same-step autoreset: the observation after an ending starts a new episode
    t, i = np.nonzero(r.dones[:-1])
    assert np.all(np.abs(r.observations[t + 1, i]) <= 0.05)  # CartPole's reset range
    envs.close()


def test_episodes_inside_a_rollout_sum_its_rewards():
    envs = E.VectorEnv("CartPole-v1", 1, seed=5)
    r = E.collect(envs, random_policy(2, 2), 200)
    ends = np.flatnonzero(r.dones[:, 0])
    inside = [r.rewards[a + 1:b + 1, 0].sum() for a, b in itertools.pairwise(ends)]
    np.testing.assert_array_equal(r.episode_returns[1:], inside)
    envs.close()


def test_consecutive_rollouts_continue_the_same_episodes():
    whole = E.VectorEnv("CartPole-v1", 2, seed=1)
    one = E.collect(whole, lean_policy, 120)
    split = E.VectorEnv("CartPole-v1", 2, seed=1)
    parts = [E.collect(split, lean_policy, 8) for _ in range(15)]
    np.testing.assert_array_equal(np.concatenate([p.observations for p in parts]), one.observations)
    np.testing.assert_array_equal(np.concatenate([p.episode_returns for p in parts]),
                                  one.episode_returns)
    assert split.frames == whole.frames == 240
    np.testing.assert_array_equal(parts[-1].next_observations, one.next_observations)
    np.testing.assert_array_equal(one.bootstrap, one.next_observations[:, 2])  # V of the last obs


def test_cartpole_seeds_give_different_episodes():
    a = E.collect(E.VectorEnv("cartpole", 2, seed=0), lean_policy, 5)
    b = E.collect(E.VectorEnv("cartpole", 2, seed=1), lean_policy, 5)
    assert not np.array_equal(a.observations, b.observations)
    assert not np.array_equal(a.observations[0, 0], a.observations[0, 1])  # seed, seed + 1


def test_episode_statistics_against_cartpole_target():
    import gymnasium
    target = gymnasium.spec("CartPole-v1").reward_threshold
    assert target == 475.0
    stats = E.EpisodeStats(window=3)
    assert np.isnan(stats.mean_return()) and not stats.solved(target)
    stats.add([500.0, 100.0], [500, 100])
    assert stats.mean_return() == 300.0 and not stats.solved(target)  # window not full
    stats.add([500.0, 500.0, 500.0], [500, 500, 500])  # the 100 leaves the window
    assert stats.mean_return() == 500.0 and stats.mean_length() == 500.0 and stats.count == 5
    assert stats.solved(target)
    envs = E.VectorEnv("cartpole", 2, seed=0, window=10)
    r = E.collect(envs, random_policy(2), 50)
    assert envs.stats.count == len(r.episode_returns)
    assert envs.stats.mean_return() == pytest.approx(r.episode_returns[-10:].mean())


# ---------------------------------------------------------------- returns on hand cases

def test_returns_stop_at_an_episode_end_inside_the_window():
    rewards = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 2.0]])
    dones = np.array([[False, False], [True, False], [False, False]])
    bootstrap = np.array([10.0, 4.0])
    # env 0: R2 = 1 + .5*10 = 6; R1 = 1 (episode ends, 6 is the next episode's); R0 = 1 + .5*1
    # env 1: R2 = 2 + .5*4 = 4; R1 = 0 + .5*4 = 2; R0 = 0 + .5*2 = 1
    expected = np.array([[1.5, 1.0], [1.0, 2.0], [6.0, 4.0]], np.float32)
    got = E.returns(rewards, dones, bootstrap, 0.5)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, expected)
    values = np.array([[1.0, 1.0], [0.5, 0.0], [6.0, 5.0]])
    np.testing.assert_array_equal(E.advantages(rewards, dones, values, bootstrap, 0.5),
                                  expected - values.astype(np.float32))


def test_returns_ignore_the_bootstrap_after_a_final_step_and_sum_without_discount():
    rewards = np.array([[1.0], [2.0], [3.0]])
    last_done = np.array([[False], [False], [True]])
    np.testing.assert_allclose(E.returns(rewards, last_done, [100.0], 0.9),
                               [[1 + 0.9 * (2 + 0.9 * 3)], [2 + 0.9 * 3], [3.0]], rtol=1e-7)
    np.testing.assert_array_equal(E.returns(rewards, np.zeros((3, 1), bool), [4.0], 1.0),
                                  [[10.0], [9.0], [7.0]])


def test_a_truncated_return_bootstraps_from_the_final_observation_inside_the_window():
    """Env 0 is cut by a time limit at step 1: R1 = r1 + gamma V(final obs of that episode),
    neither 1 (a terminal) nor r1 + gamma R2 (the next episode's). Env 1 terminates there."""
    rewards = np.array([[1.0, 0.0], [1.0, 3.0], [1.0, 2.0]])
    dones = np.array([[False, False], [True, True], [False, False]])
    truncated = np.array([[False, False], [True, False], [False, False]])
    final_values = np.array([[0.0, 0.0], [8.0, 0.0], [0.0, 0.0]])
    bootstrap = np.array([10.0, 4.0])
    # env 0: R2 = 1 + .5*10 = 6; R1 = 1 + .5*8 = 5; R0 = 1 + .5*5 = 3.5
    # env 1: R2 = 2 + .5*4 = 4; R1 = 3 (terminated); R0 = 0 + .5*3 = 1.5
    expected = np.array([[3.5, 1.5], [5.0, 3.0], [6.0, 4.0]], np.float32)
    got = E.returns(rewards, dones, bootstrap, 0.5, truncated, final_values)
    np.testing.assert_array_equal(got, expected)
    values = np.array([[1.0, 1.0], [0.5, 0.0], [6.0, 5.0]])
    np.testing.assert_array_equal(
        E.advantages(rewards, dones, values, bootstrap, 0.5, truncated, final_values),
        expected - values.astype(np.float32))
    with pytest.raises(E.RolloutError, match="need truncation_values"):
        E.returns(rewards, dones, bootstrap, 0.5, truncated)
    with pytest.raises(E.RolloutError, match="also be done"):
        E.returns(rewards, np.zeros_like(dones), bootstrap, 0.5, truncated, final_values)


def test_a_time_limit_inside_a_rollout_is_a_truncation_with_its_final_value():
    """CartPole cut at 3 steps: the rollout marks the truncation, keeps V(final observation)
    from the policy, and its returns bootstrap from it; the next observation is the new
    episode's first. A pole that falls is terminated, not truncated."""
    envs = E.VectorEnv("CartPole-v1", 2, seed=0, max_episode_steps=3)
    seen = []

    def policy(obs):
        seen.append(np.array(obs))
        return lean_policy(obs)

    r = E.collect(envs, policy, 5)
    assert r.dones[2].all() and r.truncated[2].all() and r.truncated.sum() == 2
    final = seen[3]   # asked after step 2, on the final observations
    assert not np.array_equal(final, r.observations[3])   # not the new episode's start
    np.testing.assert_array_equal(r.truncation_values[2], final[:, 2])   # lean_policy's V
    gamma = 0.9
    returns = r.returns(gamma)
    np.testing.assert_allclose(returns[2], 1.0 + gamma * final[:, 2], rtol=1e-6)
    np.testing.assert_allclose(returns[1], 1.0 + gamma * returns[2], rtol=1e-6)
    np.testing.assert_allclose(returns[4], 1.0 + gamma * r.bootstrap, rtol=1e-6)
    envs.close()
    falls = E.collect(E.VectorEnv("CartPole-v1", 2, seed=0), random_policy(2), 100)
    assert falls.dones.any() and not falls.truncated.any()


def test_a_rollout_file_without_truncations_loads_as_untruncated(tmp_path):
    r = E.collect(E.VectorEnv("cartpole", 1, seed=0), random_policy(2), 30)
    older = dict(r.arrays())
    del older["truncated"], older["truncation_values"]
    np.savez(str(tmp_path / "older.npz"), **older)
    back = E.Rollout.load(str(tmp_path / "older.npz"))
    assert back == r and not back.truncated.any()
    with pytest.raises(E.RolloutError, match="no truncation_values"):
        E.Rollout(**dict(older, truncated=np.ones_like(r.dones)))


def test_rollout_methods_match_the_functions():
    r = E.collect(E.VectorEnv("cartpole", 2, seed=0), lean_policy, 30)
    np.testing.assert_array_equal(r.returns(0.99), E.returns(r.rewards, r.dones, r.bootstrap, 0.99))
    np.testing.assert_array_equal(r.advantages(0.99), r.returns(0.99) - r.values)


# ---------------------------------------------------------------- recording and replay

def test_npz_round_trip(tmp_path):
    r = E.collect(E.VectorEnv("cartpole", 2, seed=0), random_policy(2), 40)
    path = str(tmp_path / "rollout.npz")
    r.save(path)
    back = E.Rollout.load(path)
    assert back == r and back.frames.dtype == np.int64 and int(back.frames) == 80
    with np.load(path, allow_pickle=False) as f:
        assert sorted(f.files) == sorted(r.arrays())


def test_pong_rollout_round_trip_keeps_uint8(tmp_path):
    require_opencv()
    r = E.collect(E.VectorEnv("pong", 1, seed=0), random_policy(6), 4)
    r.save(str(tmp_path / "pong.npz"))
    back = E.Rollout.load(str(tmp_path / "pong.npz"))
    assert back.observations.dtype == np.uint8 and back == r


def test_bad_rollout_files_are_refused(tmp_path):
    r = E.collect(E.VectorEnv("cartpole", 1, seed=0), lean_policy, 3)
    arrays = r.arrays()
    pickled = dict(arrays, values=np.array([object()] * 3, dtype=object))
    np.savez(str(tmp_path / "pickled.npz"), **pickled)
    with pytest.raises(E.RolloutError, match="pickled"):
        E.Rollout.load(str(tmp_path / "pickled.npz"))
    missing = dict(arrays)
    del missing["bootstrap"]
    np.savez(str(tmp_path / "missing.npz"), **missing)
    with pytest.raises(E.RolloutError, match="bootstrap"):
        E.Rollout.load(str(tmp_path / "missing.npz"))
    with pytest.raises(E.RolloutError, match="rewards has shape"):
        E.Rollout(**dict(arrays, rewards=np.zeros((2, 1))))


def test_a_recorded_rollout_loads_in_the_cntk_worker_interpreter(tmp_path):
    """The CNTK update reads the same file under CPython 3.6 and NumPy 1.19."""
    require_backend("cntk")
    r = E.collect(E.VectorEnv("cartpole", 2, seed=0), random_policy(2), 25)
    path = str(tmp_path / "rollout.npz")
    r.save(path)
    code = ("import sys\nfrom tbdzoo.models.a3c.environments.rollout import Rollout\n"
            "r = Rollout.load(sys.argv[1])\nprint(repr(r.returns(0.99).tobytes().hex()))\n"
            "print('gymnasium' in sys.modules)\n")
    proc = run_in_env(venvs.python_of("cntk"), ["-c", code, path])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split("\n")
    assert lines[0] == repr(r.returns(0.99).tobytes().hex())
    assert lines[1] == "False"


# ---------------------------------------------------------------- errors

@pytest.mark.parametrize("name", ["pongg", "Foo-v9", "ALE/Foo-v5", ""])
def test_unknown_names_list_known_games_and_the_fix(name):
    with pytest.raises(E.UnknownEnvironmentError) as info:
        E.VectorEnv(name, 1)
    message = str(info.value)
    assert "'pong'" in message and "ale_py.roms.get_all_rom_ids()" in message and "fix:" in message
    assert isinstance(info.value, TbdError) and isinstance(info.value, KeyError)


def test_a_misspelt_game_gets_a_suggestion():
    with pytest.raises(E.UnknownEnvironmentError, match="did you mean 'pong'"):
        E.make("pongg")


def test_older_atari_ids_point_to_v5():
    for old in ("PongNoFrameskip-v4", "Pong-v0"):
        with pytest.raises(E.EnvironmentOptionError, match="fix: pass 'ALE/Pong-v5'"):
            E.make(old)


@pytest.mark.parametrize("n", [0, -1, 1.5, True])
def test_a_vector_env_needs_at_least_one_environment(n):
    with pytest.raises(E.EnvironmentOptionError, match="n >= 1"):
        E.VectorEnv("cartpole", n)


def test_options_are_checked():
    with pytest.raises(E.EnvironmentOptionError, match="Atari games"):
        E.make("cartpole", repeat_action_probability=0.25)
    with pytest.raises(E.EnvironmentOptionError, match="sticky"):
        E.make("pong", sticky=True)
    with pytest.raises(E.EnvironmentOptionError, match="not a probability"):
        E.make("pong", repeat_action_probability=1.5)
    with pytest.raises(E.EnvironmentOptionError, match="discrete"):
        E.make("Pendulum-v1")
    with pytest.raises(E.EnvironmentOptionError, match="max_episode_steps=0"):
        E.make("cartpole", max_episode_steps=0)


def test_missing_opencv_names_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "cv2", None)  # makes `import cv2` fail
    with pytest.raises(E.MissingDependencyError, match="requirements/main.txt"):
        E.make("pong")


@pytest.mark.parametrize("policy, match", [
    (lambda obs: (np.zeros((len(obs), 1), np.int64), np.zeros(len(obs))), r"actions .* \(2,\)"),
    (lambda obs: (np.zeros(len(obs)), np.zeros(len(obs))), "actions must be integers"),
    (lambda obs: (np.zeros(3, np.int64), np.zeros(3)), r"actions .* \(3,\)"),
    (lambda obs: (np.zeros(len(obs), np.int64), np.zeros((len(obs), 1))), r"values .* \(2, 1\)"),
    (lambda obs: np.zeros(len(obs), np.int64), "return \\(actions, values\\)"),
    (lambda obs: (np.full(len(obs), 2), np.zeros(len(obs))), r"lie in \[0, 2\)"),
])
def test_a_policy_with_wrong_answers_is_refused(policy, match):
    envs = E.VectorEnv("cartpole", 2, seed=0)
    with pytest.raises(E.RolloutError, match=match):
        E.collect(envs, policy, 5)
    envs.close()


def test_t_max_must_be_positive():
    with pytest.raises(E.RolloutError, match="t_max"):
        E.collect(E.VectorEnv("cartpole", 1), lean_policy, 0)
