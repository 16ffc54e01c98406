"""EnvPoolVecEnv against gymnasium/SB3 semantics, and SB3 training on it."""

import numpy as np
import pytest
from rlaccel_sb3 import EnvPoolVecEnv, TieredReplayBuffer
from stable_baselines3 import DQN
from stable_baselines3.common.env_util import make_vec_env

pytestmark = pytest.mark.filterwarnings("ignore:.*precision lowered.*:UserWarning")


def test_transitions_follow_gymnasium_cartpole_dynamics_with_terminal_observations():
    """Each envpool step equals gymnasium's CartPole step from the same state and action; at episode
    ends the terminal observation is in the info and the returned observation is a fresh reset."""
    import gymnasium as gym

    venv = EnvPoolVecEnv("CartPole-v1", num_envs=4, seed=0)
    reference = gym.make("CartPole-v1").unwrapped
    reference.reset(seed=0)
    rng = np.random.default_rng(0)
    obs = venv.reset()
    finished = 0
    for _ in range(400):
        actions = rng.integers(0, 2, 4)
        next_obs, rewards, dones, infos = venv.step(actions)
        for i in range(4):
            reference.state, reference.steps_beyond_terminated = obs[i].astype(np.float64), None
            expected, _, terminated, _, _ = reference.step(int(actions[i]))
            got = infos[i]["terminal_observation"] if dones[i] else next_obs[i]
            assert np.allclose(expected, got, atol=1e-6)
            if dones[i]:
                finished += 1
                assert terminated == (not infos[i]["TimeLimit.truncated"])
                assert np.abs(next_obs[i]).max() <= 0.05           # a reset state, not a step past the end
            assert rewards[i] == 1.0                                # no zero-reward "reset step"
        obs = next_obs
    assert finished > 20
    venv.close()


def test_truncation_matches_sb3_dummy_vec_env():
    ours = EnvPoolVecEnv("CartPole-v1", num_envs=2, seed=0, max_episode_steps=20)
    stock = make_vec_env("CartPole-v1", n_envs=2, seed=0, env_kwargs=dict(max_episode_steps=20))
    for venv in (ours, stock):
        venv.reset()
        for t in range(20):
            obs, _, dones, infos = venv.step(np.array([t % 2, t % 2]))  # alternate: never falls in 20 steps
        assert dones.all() and all(info["TimeLimit.truncated"] for info in infos)
        assert all(info["terminal_observation"].shape == (4,) for info in infos)
        assert np.abs(obs).max() <= 0.05
        venv.close()


def test_dqn_trains_on_envpool_with_four_envs_and_stores_no_bogus_transition():
    venv = EnvPoolVecEnv("CartPole-v1", num_envs=4, seed=0)
    model = DQN("MlpPolicy", venv, learning_starts=100, buffer_size=4000, batch_size=32, seed=0,
                replay_buffer_class=TieredReplayBuffer,
                replay_buffer_kwargs=dict(level_capacity=[400, 3600], sampling_ratio=[0.5, 0.5]))
    model.learn(2000)
    engine = model.replay_buffer.engine
    assert len(engine) == 2000
    rows, envs = np.divmod(np.arange(len(engine)), 4)
    data = engine.gather(rows, envs)
    ended = (data["done"] == 1) & (data["timeout"] == 0)
    assert ended.any()
    terminal = data["next_obs"][ended]
    # a terminated CartPole has left the track or tipped over: the stored next_obs is the terminal one
    assert ((np.abs(terminal[:, 0]) > 2.4) | (np.abs(terminal[:, 2]) > 0.2094)).all()
    assert (data["reward"] == 1.0).all()


def test_atari_options_match_sb3_atari_wrapper_layout():
    venv = EnvPoolVecEnv("Pong-v5", num_envs=2, seed=0, sb3_atari=True)
    obs = venv.reset()
    assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
    assert venv.pool.spec.config.episodic_life and venv.pool.spec.config.reward_clip
    obs, rewards, _dones, _infos = venv.step(np.zeros(2, dtype=np.int64))
    assert obs.shape == (2, 4, 84, 84) and set(np.unique(rewards)) <= {-1.0, 0.0, 1.0}
    assert venv.get_attr("render_mode") == [None, None] and venv.env_is_wrapped(object) == [False, False]
    venv.close()


def test_unknown_env_id_suggests_the_closest():
    from rlaccel_plugins.errors import ConfigError

    with pytest.raises(ConfigError, match="Did you mean 'CartPole-v1'"):
        EnvPoolVecEnv("CartPole-v9")


def test_the_rlaccel_make_env_hook_reaches_the_envs_rlaccel_train_builds(fresh_plugins):
    from rlaccel_sb3.envs import make_env
    from rlaccel_tianshou.envs import make_envs

    import rlaccel_plugins as rla
    from rlaccel_plugins.plugins import get_plugin_manager

    seen = []

    class Spy:  # a plugin that watches, then lets the built-in answer
        @rla.hookimpl(tryfirst=True)
        def rlaccel_make_env(self, env_id, num_envs, backend, seed, config, env_kwargs):
            seen.append((env_id, num_envs, backend))

    get_plugin_manager().register(Spy(), name="spy")
    make_env("CartPole-v1", 8, 0, accelerated=True).close()   # SB3: EnvPoolVecEnv's pool
    make_envs("CartPole-v1", 8, 0, True).close()              # Tianshou: the collector's envs
    assert seen == [("CartPole-v1", 8, "envpool")] * 2
