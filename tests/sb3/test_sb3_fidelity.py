"""The SB3 tiered buffers take what SB3's own buffers take and store it as they do (issue 15).

Every comparison runs SB3's own buffer beside ours on the same inputs: the stored arrays, and the
samples for the same rows and env columns, must be equal.
"""

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from rlaccel_sb3 import TieredDictReplayBuffer, TieredReplayBuffer
from stable_baselines3 import DDPG, DQN, SAC, TD3
from stable_baselines3.common.buffers import DictReplayBuffer, ReplayBuffer
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from rlaccel_plugins.errors import ConfigError

BOX_OBS = spaces.Box(-2.0, 2.0, (3,), np.float32)
BOX_ACT = spaces.Box(-1.0, 1.0, (1,), np.float32)
CASES = {
    # name: (observation space, action space, n_envs, buffer kwargs)
    "box": (BOX_OBS, BOX_ACT, 2, {}),
    "box_no_timeouts": (BOX_OBS, BOX_ACT, 2, dict(handle_timeout_termination=False)),
    "optimize_memory_usage": (BOX_OBS, BOX_ACT, 1, dict(optimize_memory_usage=True,
                                                        handle_timeout_termination=False)),
    "discrete_action": (spaces.Box(-1.0, 1.0, (4,), np.float32), spaces.Discrete(3), 3, {}),
    "discrete_obs": (spaces.Discrete(5), spaces.Discrete(3), 2, {}),
    "dict": (spaces.Dict({"vec": BOX_OBS, "cell": spaces.Discrete(4)}), BOX_ACT, 2, {}),
}
BUFFER_SIZE, ADDS = 16, 21  # the ring wraps


def odd_inputs(obs_space, action_space, n_envs, rng):
    """One add's arguments, in the loose forms SB3's own buffer accepts."""
    def obs():
        if isinstance(obs_space, spaces.Dict):
            return {"vec": rng.normal(size=(n_envs, 3)),                        # float64 -> float32
                    "cell": rng.integers(0, 4, size=n_envs)}                     # (n_envs,) -> (n_envs, 1)
        if isinstance(obs_space, spaces.Discrete):
            return rng.integers(0, obs_space.n, size=n_envs)
        return rng.normal(size=(n_envs, *obs_space.shape))

    if isinstance(action_space, spaces.Discrete):
        action = rng.integers(0, action_space.n, size=(n_envs, 1)).astype(np.float64)  # whole floats
    else:
        action = rng.uniform(-1, 1, size=n_envs)                                 # (n_envs,) -> (n_envs, 1)
    reward = float(rng.normal()) if rng.random() < 0.5 else rng.normal(size=n_envs)  # scalar broadcasts
    done = rng.random(n_envs) < 0.2
    infos = [{"TimeLimit.truncated": np.bool_(rng.random() < 0.5)} if d else {} for d in done]
    return obs(), obs(), action, reward, done, infos


def both_buffers(case):
    obs_space, action_space, n_envs, kwargs = CASES[case]
    dict_obs = isinstance(obs_space, spaces.Dict)
    stock = (DictReplayBuffer if dict_obs else ReplayBuffer)(BUFFER_SIZE, obs_space, action_space, n_envs=n_envs,
                                                             **kwargs)
    ours = (TieredDictReplayBuffer if dict_obs else TieredReplayBuffer)(
        BUFFER_SIZE, obs_space, action_space, n_envs=n_envs, level_capacity=[BUFFER_SIZE], sampling_ratio=[1.0],
        seed=0, **kwargs)
    rng = np.random.default_rng(1)
    next_obs = None
    for _ in range(ADDS):
        obs, new_next, *rest = odd_inputs(obs_space, action_space, n_envs, rng)
        if kwargs.get("optimize_memory_usage"):  # SB3 stores next_obs as the next row's obs: keep them chained
            obs = obs if next_obs is None else next_obs
        next_obs = new_next
        stock.add(obs, new_next, *rest)
        ours.add(obs, new_next, *rest)
    return stock, ours


def same_samples(stock, ours, rows, env=None):
    np.random.seed(3)
    expected = stock._get_samples(rows, env=env)
    np.random.seed(3)
    envs = np.random.randint(0, stock.n_envs, size=len(rows))  # the env columns SB3 drew
    got = ours._get_samples(rows, env=env, env_indices=envs)
    for name, a, b in zip(expected._fields, expected, got):
        if a is None:
            assert b is None, name
        elif isinstance(a, dict):
            for key in a:
                assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), f"{name}[{key}]"
        else:
            assert a.dtype == b.dtype and torch.equal(a, b), name


@pytest.mark.parametrize("case", list(CASES))
def test_adds_are_stored_and_sampled_as_sb3_does(case):
    stock, ours = both_buffers(case)
    assert (stock.pos, stock.full, stock.size()) == (ours.pos, ours.full, ours.size())
    fields = ["actions", "rewards", "dones"]
    fields += ["timeouts"] if stock.handle_timeout_termination else []
    # SB3's memory optimisation keeps next observations in the next row (row pos holds the newest one)
    fields += [] if stock.optimize_memory_usage else ["observations", "next_observations"]
    for name in fields:
        a, b = getattr(stock, name), getattr(ours, name)
        for key in (a if isinstance(a, dict) else [None]):
            x, y = (a[key], b[key]) if key else (a, b)
            assert x.dtype == y.dtype and np.array_equal(x, y), f"{name} {key}"
    rows = np.arange(stock.buffer_size)
    if stock.optimize_memory_usage:
        rows = rows[rows != stock.pos]  # SB3 never samples row pos there (its next obs is overwritten)
    same_samples(stock, ours, rows)


def test_samples_normalised_by_vecnormalize_as_sb3_does():
    env = VecNormalize(DummyVecEnv([lambda: gym.make("Pendulum-v1")] * 2))
    env.reset()
    for _ in range(30):
        env.step(np.random.default_rng(0).uniform(-2, 2, size=(2, 1)))
    stock, ours = both_buffers("box")
    same_samples(stock, ours, np.arange(stock.buffer_size), env=env)
    assert not np.array_equal(stock._get_samples(np.arange(4), env=env).observations,
                              stock._get_samples(np.arange(4)).observations)  # normalisation did something


@pytest.mark.parametrize("action, fragment", [
    (np.array([[0.7]]), "action must hold whole numbers (it is stored as int64), got action=[0.7]"),
    (np.array([[np.nan]]), "action must hold whole numbers"),
    (np.zeros((1, 3)), "action.shape"),
])
def test_refused_actions_name_the_field(action, fragment):
    buffer = TieredReplayBuffer(10, BOX_OBS, spaces.Discrete(3), level_capacity=[10], sampling_ratio=[1.0])
    with pytest.raises(ConfigError) as err:
        buffer.add(np.zeros((1, 3)), np.zeros((1, 3)), action, np.zeros(1), np.zeros(1), [{}])
    assert fragment in str(err.value)
    assert buffer.size() == 0  # nothing was written


@pytest.mark.parametrize("cls, env_id", [(DQN, "CartPole-v1"), (SAC, "Pendulum-v1"), (TD3, "Pendulum-v1")])
def test_extend_after_save_and_load_replay_buffer(cls, env_id, tmp_path):
    # SB3's own test_save_load pattern: a loaded buffer's arrays fed back through extend()
    kwargs = dict(buffer_size=400, learning_starts=50, batch_size=16, seed=0, policy_kwargs=dict(net_arch=[16]),
                  replay_buffer_class=TieredReplayBuffer)
    model = cls("MlpPolicy", env_id, **kwargs)
    model.learn(120)
    model.save_replay_buffer(tmp_path / "buffer.pkl")
    loaded = cls("MlpPolicy", env_id, **kwargs)
    loaded.load_replay_buffer(tmp_path / "buffer.pkl")
    old = loaded.replay_buffer
    stored = old.size()
    rows = np.arange(stored)
    before = {name: getattr(old, name)[rows].copy() for name in ("observations", "actions", "rewards", "dones")}
    infos = [[{"TimeLimit.truncated": truncated}] for truncated in old.timeouts[rows]]
    old.extend(before["observations"], before["observations"], before["actions"], before["rewards"],
               before["dones"], infos)
    assert old.size() == 2 * stored
    for name, values in before.items():
        assert np.array_equal(getattr(old, name)[stored:2 * stored], values), name
    loaded.learn(60)  # and it still trains


# ------------------------------------------------------------------ a model's seed makes its run reproducible
def final_parameters(cls, env, **kwargs):
    model = cls("MlpPolicy", env, seed=7, learning_starts=40, batch_size=16, buffer_size=500,
                policy_kwargs=dict(net_arch=[16]), replay_buffer_class=TieredReplayBuffer, **kwargs)
    model.learn(200)
    return [p.detach().clone() for p in model.policy.parameters()], model.replay_buffer.engine.sampler.rng


@pytest.mark.parametrize("cls, env_id", [(DQN, "CartPole-v1"), (SAC, "Pendulum-v1")])
def test_a_seeded_model_with_the_tiered_buffer_reproduces_its_run(cls, env_id):
    first, rng_a = final_parameters(cls, env_id)
    second, rng_b = final_parameters(cls, env_id)
    assert rng_a.bit_generator.state == rng_b.bit_generator.state
    assert all(torch.equal(a, b) for a, b in zip(first, second))


# ------------------------------------------------------------------ Dict and flat observations train alike
class OneKeyDictEnv(gym.Env):
    """A seeded random walk whose observation is a Dict with one key (SB3's test_consistency, one key)."""

    def __init__(self, discrete: bool) -> None:
        self.observation_space = spaces.Dict({"vec": spaces.Box(-5.0, 5.0, (4,), np.float32)})
        self.action_space = spaces.Discrete(3) if discrete else spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.t, self.state = 0, np.zeros(4, np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.state = 0, self.np_random.uniform(-1, 1, 4).astype(np.float32)
        return {"vec": self.state.copy()}, {}

    def step(self, action):
        push = (float(action) - 1.0) if np.isscalar(action) or np.ndim(action) == 0 else float(np.sum(action))
        self.state = np.clip(self.state + 0.1 * push + self.np_random.normal(0, 0.1, 4), -5, 5).astype(np.float32)
        self.t += 1
        return {"vec": self.state.copy()}, -float(np.abs(self.state).sum()), False, self.t >= 30, {}


@pytest.mark.parametrize("cls", [DQN, DDPG, SAC, TD3])
def test_dict_and_flat_tiered_buffers_train_alike(cls):
    kwargs = dict(buffer_size=250, train_freq=8, gradient_steps=1, learning_starts=0, gamma=0.5, seed=1,
                  batch_size=32, policy_kwargs=dict(net_arch=[16]))
    dict_env = OneKeyDictEnv(discrete=cls is DQN)
    flat_env = gym.wrappers.FlattenObservation(OneKeyDictEnv(discrete=cls is DQN))
    obs, _ = dict_env.reset(seed=5)
    obs = {"vec": obs["vec"].copy()}
    # one model after the other: each construction seeds the global RNGs the other's learn() draws from
    dict_model = cls("MultiInputPolicy", dict_env, replay_buffer_class=TieredDictReplayBuffer, **kwargs)
    dict_model.learn(256)
    flat_model = cls("MlpPolicy", flat_env, replay_buffer_class=TieredReplayBuffer, **kwargs)
    flat_model.learn(256)
    assert dict_model._n_updates == flat_model._n_updates > 0
    action_dict, _ = dict_model.predict(obs, deterministic=True)
    action_flat, _ = flat_model.predict(obs["vec"], deterministic=True)
    assert np.allclose(action_dict, action_flat)
    for a, b in zip(dict_model.policy.parameters(), flat_model.policy.parameters()):
        assert torch.equal(a, b)


def test_reset_empties_the_buffer_as_sb3_does():
    stock, ours = both_buffers("box")
    stock.reset()
    ours.reset()
    assert (stock.pos, stock.full, stock.size()) == (ours.pos, ours.full, ours.size()) == (0, False, 0)
    assert len(ours.engine) == 0


def test_save_replay_buffer_writes_what_is_stored_and_loads_back_exactly(tmp_path):
    # SB3's default 1,000,000-transition buffer holding 2,000 CartPole transitions
    model = DQN("MlpPolicy", "CartPole-v1", learning_starts=5_000, seed=0, replay_buffer_class=TieredReplayBuffer)
    model.learn(2_000)
    model.save_replay_buffer(tmp_path / "buffer.pkl")
    size = (tmp_path / "buffer.pkl").stat().st_size
    assert size < 1_000_000, size  # ~2,000 rows, not 1M (52 MB before: the whole preallocated ring)
    loaded = DQN("MlpPolicy", "CartPole-v1", learning_starts=5_000, seed=0, replay_buffer_class=TieredReplayBuffer)
    loaded.load_replay_buffer(tmp_path / "buffer.pkl")
    ours, back = model.replay_buffer, loaded.replay_buffer
    assert (back.pos, back.full, back.size()) == (ours.pos, ours.full, ours.size())
    for name in ("observations", "next_observations", "actions", "rewards", "dones", "timeouts"):
        assert np.array_equal(getattr(back, name), getattr(ours, name)), name
    a, b = ours.sample(256), back.sample(256)
    assert all(torch.equal(x, y) for x, y in zip(a[:5], b[:5]))
