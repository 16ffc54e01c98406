"""The SB3 adapter with real Stable-Baselines3 training (small budgets)."""

import copy

import numpy as np
import pytest
import rlaccel_sb3
import torch
from gymnasium import spaces
from rlaccel_sb3 import SparseDenseCallback, TieredDictReplayBuffer, TieredReplayBuffer
from rlaccel_sb3.weights import ImportanceWeightHook
from sb3_contrib import QRDQN
from stable_baselines3 import A2C, DDPG, DQN, PPO, SAC, TD3
from stable_baselines3.common.buffers import NStepReplayBuffer, ReplayBuffer
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.envs import SimpleMultiObsEnv
from stable_baselines3.common.vec_env import VecNormalize

import rlaccel_plugins as rla
from rlaccel_plugins.errors import RlaccelWarning

OFF_POLICY = {"dqn": (DQN, "CartPole-v1"), "qrdqn": (QRDQN, "CartPole-v1"), "sac": (SAC, "Pendulum-v1"),
              "td3": (TD3, "Pendulum-v1"), "ddpg": (DDPG, "Pendulum-v1")}
def small(**kw):
    # a fresh dict each time: SB3 writes into policy_kwargs (e.g. SAC adds use_sde)
    return {**dict(learning_starts=64, batch_size=32, buffer_size=2000, seed=0,
                   policy_kwargs=dict(net_arch=[32, 32])), **kw}


def small_model(algo, n_envs=1, **kw):
    cls, env_id = OFF_POLICY[algo]
    env = make_vec_env(env_id, n_envs=n_envs, seed=0)
    return cls("MlpPolicy", env, **small(**kw))


# ------------------------------------------------------------------ the buffer
@pytest.mark.parametrize("n_envs", [1, 4])
@pytest.mark.parametrize("algo", list(OFF_POLICY))
def test_every_off_policy_algorithm_trains_with_the_tiered_buffer(algo, n_envs):
    model = small_model(algo, n_envs=n_envs, replay_buffer_class=TieredReplayBuffer,
                        replay_buffer_kwargs=dict(level_capacity=[200, 1800], sampling_ratio=[0.5, 0.5]))
    model.learn(400)
    buf = model.replay_buffer
    assert isinstance(buf, TieredReplayBuffer) and isinstance(buf, ReplayBuffer)
    assert len(buf.engine) == model.num_timesteps  # every transition stored once
    assert buf.engine.level_sizes[0] == 200 and sum(buf.engine.level_samples) > 0
    assert model._n_updates > 0


def test_tiers_come_from_level_capacity_then_preset_then_buffer_size(monkeypatch, caplog):
    box = spaces.Box(-1, 1, (3,), np.float32)
    explicit = TieredReplayBuffer(5000, box, box, level_capacity=[10, 90], sampling_ratio=[0.5, 0.5])
    assert explicit.engine.config.level_capacity == (10, 90) and explicit.buffer_size == 100
    # a preset never resizes the user's buffer: recent levels as they are, the long-term level takes the rest
    big = TieredReplayBuffer(1_000_000, box, box, preset="atari")
    assert big.engine.config.level_capacity == (1000, 5000, 20000, 974000) and big.engine.capacity == 1_000_000
    with caplog.at_level("INFO", logger="rlaccel"):
        small = DQN("MlpPolicy", "CartPole-v1", buffer_size=10_000, replay_buffer_class=TieredReplayBuffer,
                    replay_buffer_kwargs=dict(preset="atari")).replay_buffer
    assert small.engine.capacity == 10_000 and small.buffer_size == 10_000
    assert small.engine.config.level_capacity == (1000, 5000, 4000)
    assert small.engine.config.sampling_ratio == pytest.approx((0.7, 0.2, 0.1))
    assert [r.getMessage() for r in caplog.records if "cannot hold the recent levels" in r.getMessage()] == [
        ("rlaccel: a buffer of 10000 transitions cannot hold the recent levels [1000, 5000, 20000]: kept levels "
         "[1000, 5000, 4000], ratios [0.7, 0.2, 0.1] (pass level_capacity to choose the tiers yourself)")]
    scaled = TieredReplayBuffer(252_000, box, box, n_envs=4)
    assert scaled.engine.config.level_capacity == (2000, 10000, 40000, 200000)
    assert scaled.buffer_size == 252_000 // 4
    monkeypatch.setenv("RLACCEL_PRESET", "multi_agent")
    assert TieredReplayBuffer(5000, box, box).engine.config.level_capacity == (2000, 3000)


def test_sb3_contract_full_without_add_and_optimize_memory_usage():
    # SB3's own test_buffer_dtypes pattern: a buffer marked full without any add can be sampled
    box = spaces.Box(-1, 1, (2,), np.float32)
    buf = TieredReplayBuffer(1, box, spaces.Discrete(3))
    buf.full = True
    sample = buf.sample(64)  # with replacement
    assert sample.observations.shape == (64, 2) and sample.actions.dtype == torch.int64
    # optimize_memory_usage with timeouts is refused by SB3's ReplayBuffer, accepted here (next_obs is always kept)
    buf = TieredReplayBuffer(100, box, box, optimize_memory_usage=True, handle_timeout_termination=True)
    assert buf.optimize_memory_usage and buf.handle_timeout_termination


def test_n_step_returns_match_sb3():
    box = spaces.Box(-10, 10, (2,), np.float32)
    stock = NStepReplayBuffer(50, box, box, device="cpu", n_steps=3, gamma=0.9)
    ours = TieredReplayBuffer(50, box, box, device="cpu", level_capacity=[50], sampling_ratio=[1.0], n_steps=3,
                              gamma=0.9)
    rng = np.random.default_rng(0)
    for t in range(73):  # wraps
        obs, next_obs = rng.normal(size=(1, 2)), rng.normal(size=(1, 2))
        done = np.array([rng.random() < 0.15])
        infos = [{"TimeLimit.truncated": bool(done[0] and rng.random() < 0.5)}]
        action = rng.normal(size=(1, 2))
        for buf in (stock, ours):
            buf.add(obs, next_obs, action, np.array([float(t)]), done, infos)
    inds = np.arange(50)
    a, b = stock._get_samples(inds), ours._get_samples(inds)
    for field in ("observations", "actions", "next_observations", "dones", "rewards", "discounts"):
        assert torch.allclose(getattr(a, field), getattr(b, field)), field


def test_vecnormalize_normalises_at_sample_time():
    env = VecNormalize(make_vec_env("Pendulum-v1", n_envs=2, seed=0))
    model = SAC("MlpPolicy", env, **small(replay_buffer_class=TieredReplayBuffer))
    model.learn(200)
    buf = model.replay_buffer
    where = buf.engine.sample_indices(16)
    raw = buf.engine.gather(where.rows, where.envs)["obs"]
    sample = buf._get_samples(where.rows, env=env, env_indices=where.envs)
    assert np.allclose(sample.observations.numpy(), env.normalize_obs(raw), atol=1e-6)
    assert not np.allclose(raw, env.normalize_obs(raw))


def test_dict_observations():
    env = make_vec_env(lambda: SimpleMultiObsEnv(random_start=True), n_envs=2, seed=0)
    model = DQN("MultiInputPolicy", env, replay_buffer_class=TieredDictReplayBuffer,
                **small(replay_buffer_kwargs=dict(level_capacity=[100, 900], sampling_ratio=[0.6, 0.4])))
    model.learn(300)
    sample = model.replay_buffer.sample(8)
    assert set(sample.observations) == {"vec", "img"} and sample.observations["img"].shape[0] == 8


def test_save_load_continue_model_and_buffer(tmp_path):
    model = small_model("dqn", replay_buffer_class=TieredReplayBuffer,
                        replay_buffer_kwargs=dict(level_capacity=[100, 400], sampling_ratio=[0.7, 0.3], seed=3))
    model.learn(700)
    model.save(tmp_path / "model")
    model.save_replay_buffer(tmp_path / "buffer")
    loaded = DQN.load(tmp_path / "model", env=model.get_env())
    assert isinstance(loaded.replay_buffer, TieredReplayBuffer) and len(loaded.replay_buffer.engine) == 0
    loaded.load_replay_buffer(tmp_path / "buffer")
    a, b = model.replay_buffer.engine.state_dict(), loaded.replay_buffer.engine.state_dict()
    assert (a["pos"], a["full"], a["added"]) == (b["pos"], b["full"], b["added"])
    for name in a["storage"]:
        assert np.array_equal(a["storage"][name], b["storage"][name]), name
    assert a["sampler"]["rng"] == b["sampler"]["rng"]  # same sampling stream
    assert np.array_equal(model.replay_buffer.sample(32).observations, loaded.replay_buffer.sample(32).observations)
    callback = SparseDenseCallback(sparse_update_interval=4, dense_layers=[-1])  # installs on the loaded model
    loaded.learn(300, reset_num_timesteps=False, callback=callback)
    assert loaded.num_timesteps == 1000
    assert callback.stats["full_updates"] + callback.stats["dense_updates"] == loaded._n_updates - model._n_updates


def test_pixel_observations_are_stored_once():
    obs_space = spaces.Box(0, 255, (4, 84, 84), np.uint8)
    buf = TieredReplayBuffer(1000, obs_space, spaces.Discrete(6), preset=None, level_capacity=[200, 800],
                             sampling_ratio=[0.5, 0.5])
    assert buf.engine.frames is not None
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 256, (1, 4, 84, 84), dtype=np.uint8)
    for _ in range(50):
        next_obs = np.concatenate([obs[:, 1:], rng.integers(0, 256, (1, 1, 84, 84), dtype=np.uint8)], axis=1)
        buf.add(obs, next_obs, np.array([1]), np.array([0.0]), np.array([False]), [{}])
        last = (obs, next_obs)
        obs = next_obs
    s = buf._get_samples(np.array([49]), env_indices=np.array([0]))
    assert np.array_equal(s.observations.numpy(), last[0]) and np.array_equal(s.next_observations.numpy(), last[1])
    assert buf.engine.nbytes / buf.engine.capacity < 7_500


# ------------------------------------------------------------------ the callback
@pytest.mark.parametrize("algo", ["dqn", "qrdqn", "sac", "td3", "ddpg", "ppo", "a2c"])
def test_callback_runs_the_schedule_on_every_algorithm(algo):
    if algo in ("ppo", "a2c"):
        cls = PPO if algo == "ppo" else A2C
        kw = dict(n_steps=64, batch_size=32, n_epochs=2) if algo == "ppo" else dict(n_steps=16)
        model = cls("MlpPolicy", "CartPole-v1", seed=0, **kw)
    else:
        model = small_model(algo)
    callback = SparseDenseCallback(sparse_update_interval=3, dense_layers=[-1])
    model.learn(300, callback=callback)
    expected = {"dqn": ["q_net"], "qrdqn": ["quantile_net"], "ppo": ["policy"], "a2c": ["policy"]}.get(
        algo, ["actor", "critic"])
    assert callback.networks == expected
    stats = callback.stats
    assert stats["full_updates"] > 0 and stats["dense_updates"] > stats["full_updates"]
    assert all(p.requires_grad for p in model.policy.parameters())  # every flag restored
    callback.on_training_end()  # RL Zoo calls it twice: harmless


def test_dense_steps_leave_frozen_layers_bit_identical():
    model = small_model("dqn", train_freq=4, gradient_steps=1)
    callback = SparseDenseCallback(sparse_update_interval=10**6, dense_layers=[-1])
    model.learn(200, callback=callback)                 # step 0 full, the rest dense
    before = copy.deepcopy(model.q_net.state_dict())
    optimizer_before = copy.deepcopy(model.policy.optimizer.state_dict())
    model.learn(400, callback=callback, reset_num_timesteps=False)   # the phase carries over: all dense
    after = model.q_net.state_dict()
    assert callback.stats["dense_updates"] > 50
    for name in before:
        same = torch.equal(before[name], after[name])
        assert same == (not name.startswith("q_net.4")), name    # only the last layer moved
    state_before, state_after = optimizer_before["state"], model.policy.optimizer.state_dict()["state"]
    assert torch.equal(state_before[0]["exp_avg"], state_after[0]["exp_avg"])      # frozen: Adam state untouched


def test_callback_logs_rlaccel_metrics(tmp_path):
    model = small_model("dqn", replay_buffer_class=TieredReplayBuffer,
                        replay_buffer_kwargs=dict(level_capacity=[100, 400], sampling_ratio=[0.7, 0.3]))
    from stable_baselines3.common.logger import configure

    model.set_logger(configure(str(tmp_path), ["csv"]))
    model.learn(600, callback=SparseDenseCallback(sparse_update_interval=4, dense_layers=[-1]), log_interval=1)
    header = (tmp_path / "progress.csv").read_text().splitlines()[0].split(",")
    for key in ("rlaccel/full_updates", "rlaccel/dense_updates", "rlaccel/backward_flops_saved",
                "rlaccel/level_fill/L0", "rlaccel/level_samples/L1", "rlaccel/fps"):
        assert key in header, key
    # a second learn() whose last rollout is logged (every 100 env steps): the end of learn() reads the meter
    # again at that rollout's step count, and the rate stays a rate, never 0.0
    config = rla.load_config(sparse_update_interval=4, dense_layers=[-1], log_interval=100)
    model.learn(200, callback=SparseDenseCallback(config=config), reset_num_timesteps=False)
    assert model.logger.name_to_value["rlaccel/fps"] > 0
    rows = [dict(zip(header, line.split(","))) for line in (tmp_path / "progress.csv").read_text().splitlines()[1:]]
    assert all(float(row["rlaccel/fps"]) > 0 for row in rows if row["rlaccel/fps"])


def test_importance_weights_scale_the_loss_exactly():
    model = small_model("dqn", replay_buffer_class=TieredReplayBuffer,
                        replay_buffer_kwargs=dict(level_capacity=[50, 450], sampling_ratio=[0.5, 0.5],
                                                  importance_beta=1.0))
    with pytest.warns(RlaccelWarning, match="nothing applies the weights.*AccelerateCallback") as warned:
        model.learn(300)  # without the callback: trains unweighted, and says so once
    # (counted by message: pytest.warns records every warning raised meanwhile, e.g. by an earlier
    # test's background thread)
    assert sum("nothing applies the weights" in str(w.message) for w in warned) == 1
    buf, q_net = model.replay_buffer, model.q_net
    q_net.train()
    data = buf.sample(32)
    weights = torch.as_tensor(buf.last_weights)
    assert weights.min() < 1.0  # L0 transitions are over-sampled, so down-weighted

    def grads(loss_fn):
        q_net.zero_grad()
        loss_fn(q_net(data.observations).gather(1, data.actions.long())).backward()
        return [p.grad.clone() for p in q_net.parameters()]

    hook = ImportanceWeightHook(buf, [q_net])
    hooked = grads(lambda q: torch.nn.functional.smooth_l1_loss(q, data.rewards))
    hook.remove()
    explicit = grads(lambda q: (weights[:, None] * torch.nn.functional.smooth_l1_loss(
        q, data.rewards, reduction="none")).mean())
    assert all(torch.allclose(a, b, atol=1e-7) for a, b in zip(hooked, explicit))


# ------------------------------------------------------------------ accelerate / restore
def test_accelerate_swaps_the_buffer_keeping_transitions_and_restore_undoes_it(caplog):
    model = small_model("dqn", batch_size=32)
    model.learn(500)
    stored = model.replay_buffer.size()
    original = model.replay_buffer
    with caplog.at_level("INFO", logger="rlaccel"):
        callback = rla.accelerate(model, preset="classic_control")   # dispatched to rlaccel_sb3
    assert isinstance(callback, SparseDenseCallback)
    assert "batch_size: model has 32, preset 'classic_control' suggests 256 (not changed" in caplog.text
    assert model.batch_size == 32                                    # reported, never changed
    tiered = model.replay_buffer
    assert isinstance(tiered, TieredReplayBuffer) and len(tiered.engine) == stored
    newest = original.observations[(original.pos - 1) % original.buffer_size]
    assert np.array_equal(tiered.engine.gather(np.array([tiered.pos - 1]), np.array([0]))["obs"][0], newest[0])
    callback = SparseDenseCallback(sparse_update_interval=5, dense_layers=[-1])
    model.learn(300, callback=callback, reset_num_timesteps=False)
    rlaccel_sb3.restore(model)
    assert model.replay_buffer is original and original.size() == stored + 300
    assert all(p.requires_grad for p in model.policy.parameters())
    model.learn(100, reset_num_timesteps=False)  # still trains as stock


def test_restore_copies_back_everything_the_ring_still_holds_after_it_wrapped(caplog):
    model = small_model("dqn", buffer_size=600)
    model.learn(700)                                  # the model's own buffer is full
    original = model.replay_buffer
    rlaccel_sb3.accelerate(model, preset="classic_control")
    tiered = model.replay_buffer
    assert tiered.engine.capacity == 600              # the user's capacity, not the preset's 50,000
    model.learn(700, reset_num_timesteps=False)       # more than the ring holds: it wraps
    newest = tiered.engine.gather(np.arange(600), np.zeros(600, np.int64))
    ages = tiered.engine.age_of(np.arange(600))
    with caplog.at_level("INFO", logger="rlaccel"):
        rlaccel_sb3.restore(model)
    assert model.replay_buffer is original and original.full
    assert "no longer holds the oldest 100 of the 700 transitions" in caplog.text
    for row, age in zip(range(600), ages):           # every transition the ring held, in order
        back = (original.pos - 1 - age) % original.buffer_size
        assert np.array_equal(original.observations[back, 0], newest["obs"][row])
        assert np.array_equal(original.next_observations[back, 0], newest["next_obs"][row])


def test_accelerate_carries_n_step_returns_and_reports_an_explicit_capacity(caplog):
    model = small_model("dqn", n_steps=3, gamma=0.9)
    assert type(model.replay_buffer) is NStepReplayBuffer
    model.learn(200)
    with caplog.at_level("INFO", logger="rlaccel"):
        rlaccel_sb3.accelerate(model, level_capacity=[100, 400], sampling_ratio=[0.5, 0.5])
    tiered = model.replay_buffer
    assert (tiered.n_steps, tiered.gamma) == (3, 0.9)
    assert tiered.sample(8).discounts is not None
    assert ("buffer_size: model has 2000, level_capacity=[100, 400] sets the replay buffer's capacity to 500 "
            "transitions") in caplog.text
    model.learn(100, reset_num_timesteps=False)
    rlaccel_sb3.restore(model)
    assert type(model.replay_buffer) is NStepReplayBuffer and model.replay_buffer.size() == 300


def test_accelerate_refuses_a_buffer_it_cannot_reproduce():
    from stable_baselines3 import HerReplayBuffer
    from stable_baselines3.common.envs import BitFlippingEnv

    model = DQN("MultiInputPolicy", BitFlippingEnv(n_bits=4), replay_buffer_class=HerReplayBuffer,
                learning_starts=10, buffer_size=1000)
    with pytest.raises(rla.ConfigError, match=r"got replay_buffer=HerReplayBuffer.*tiered_replay=False"):
        rlaccel_sb3.accelerate(model, preset="classic_control")
    assert type(model.replay_buffer) is HerReplayBuffer
    callback = rlaccel_sb3.accelerate(model, preset="classic_control", tiered_replay=False)
    assert type(model.replay_buffer) is HerReplayBuffer
    model.learn(50, callback=callback)
    rlaccel_sb3.restore(model)
