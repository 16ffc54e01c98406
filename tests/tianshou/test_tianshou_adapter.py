"""The Tianshou adapter with real Tianshou 2.0 training (small budgets)."""

import ast
import copy
import os
import pickle

import gymnasium as gym
import numpy as np
import pytest
import rlaccel_tianshou
import torch
from rlaccel_tianshou import (
    SparseDenseOnPolicyWrapper,
    SparseDenseWrapper,
    SparseDenseWrapperFactory,
    TieredCollectorFactory,
    TieredReplayBuffer,
    TieredVectorReplayBuffer,
    unwrap_state_dict,
)
from tianshou.algorithm import DQN, PPO, SAC
from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
from tianshou.algorithm.modelfree.reinforce import ProbabilisticActorPolicy
from tianshou.algorithm.modelfree.sac import SACPolicy
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.data import Batch, Collector, VectorReplayBuffer
from tianshou.env import DummyVectorEnv
from tianshou.trainer import OffPolicyTrainerParams, OnPolicyTrainerParams
from tianshou.utils.net.common import ActorCritic, Net
from tianshou.utils.net.continuous import ContinuousActorProbabilistic, ContinuousCritic
from tianshou.utils.net.discrete import DiscreteActor, DiscreteCritic
from tianshou.utils.torch_utils import policy_within_training_step

import rlaccel_plugins as rla


def envs(env_id, n, seed=0):
    venv = DummyVectorEnv([lambda: gym.make(env_id) for _ in range(n)])
    venv.seed(seed)
    return venv


def make_dqn(hidden=(32, 32, 32), lr=1e-3, seed=0, **kw):
    torch.manual_seed(seed)
    net = Net(state_shape=4, action_shape=2, hidden_sizes=list(hidden))
    policy = DiscreteQLearningPolicy(model=net, action_space=gym.spaces.Discrete(2), eps_training=0.2)
    return DQN(policy=policy, optim=AdamOptimizerFactory(lr=lr), gamma=0.9, n_step_return_horizon=3,
               target_update_freq=100, **kw)


def first_weight(algorithm):
    return next(algorithm.policy.model.parameters())


def transition(i, obs_shape=(4,)):
    return Batch(obs=np.full((1, *obs_shape), i, np.float32), act=np.array([i % 2]), rew=np.array([float(i)]),
                 terminated=np.array([i % 17 == 16]), truncated=np.array([False]),
                 obs_next=np.full((1, *obs_shape), i + 1, np.float32), info=Batch())


# ------------------------------------------------------------------ buffers
def test_single_buffer_samples_levels_by_age_and_keeps_tianshou_semantics():
    buf = TieredReplayBuffer(100, level_capacity=[10, 90], sampling_ratio=[0.5, 0.5], random_seed=1)
    for i in range(130):  # wraps
        buf.add(transition(i), buffer_ids=[0])
    batch, _ = buf.sample(400)
    ages = 129 - batch.rew.astype(int)
    assert ((ages < 10) == (np.arange(400) < 0) | (ages < 10)).all()
    assert np.mean(ages < 10) == pytest.approx(0.5)
    assert (ages < 100).all()
    assert len(buf.sample_indices(0)) == 100 and len(buf.sample_indices(None)) == 100  # Tianshou's meanings
    assert len(buf.sample_indices(-1)) == 0


def test_vector_buffer_levels_over_all_sub_buffers_with_independent_streams():
    buf = TieredVectorReplayBuffer(400, 4, level_capacity=[40, 360], sampling_ratio=[0.7, 0.3])
    assert [b.maxsize for b in buf.buffers] == [100] * 4
    for i in range(150):
        batch = Batch.cat([transition(i) for _ in range(4)])
        batch.rew = np.full(4, float(i))
        buf.add(batch, buffer_ids=[0, 1, 2, 3])
    batch, idx = buf.sample(1000)
    ages = 149 - batch.rew.astype(int)
    assert np.mean(ages < 10) == pytest.approx(0.7, abs=0.001)  # 40 transitions / 4 envs = 10 newest rows
    streams = idx // 100
    assert sorted(np.bincount(streams)) == sorted(np.bincount(streams)) and len(set(np.bincount(streams))) > 1
    local = [idx[streams == s] % 100 for s in range(4)]
    assert not all(np.array_equal(np.sort(local[0][:5]), np.sort(loc[:5])) for loc in local[1:])
    assert [b._random_state.randint(1 << 30) for b in buf.buffers] != [buf.buffers[0]._random_state.randint(1 << 30)] * 4


def test_vector_buffer_pickle_and_hdf5_keep_sub_buffers_linked(tmp_path):
    buf = TieredVectorReplayBuffer(40, 2, level_capacity=[8, 32], sampling_ratio=[0.5, 0.5])
    for i in range(7):
        batch = Batch.cat([transition(i), transition(i)])
        batch.terminated = np.array([False, False])
        buf.add(batch, buffer_ids=[0, 1])
    for restored in (pickle.loads(pickle.dumps(buf)), _hdf5_round_trip(buf, tmp_path)):
        assert np.array_equal(restored.obs, buf.obs) and np.array_equal(restored.sample_indices(0), buf.sample_indices(0))
        done = Batch.cat([transition(99), transition(99)])
        done.terminated = np.array([True, True])
        restored.add(done, buffer_ids=[0, 1])
        assert restored.buffers[0].done[7] and restored.done[7]          # the child sees the manager's write
        assert len(restored.unfinished_index()) == 0
        assert restored.sampler.layout.level_capacity.tolist() == [8, 32]


def _stored_bytes(buf) -> int:
    """Bytes of the rows that hold data (each leaf's bytes per row times the rows written)."""
    def leaves(batch):
        for value in batch.values():
            yield from leaves(value) if isinstance(value, Batch) else [value]

    return sum(leaf.nbytes // len(leaf) for leaf in leaves(buf._meta)) * len(buf)


@pytest.mark.parametrize("wrapped", [False, True])
def test_buffers_pickle_what_is_stored_and_load_back_bit_exact(wrapped):
    frames = np.random.default_rng(0)
    single = TieredReplayBuffer(6_000, preset="classic_control")
    vector = TieredVectorReplayBuffer(6_000, 4, preset="classic_control", stack_num=4, save_only_last_obs=True,
                                      ignore_obs_next=True)
    steps = 1_600 if wrapped else 300  # 1,500 rows per stream in the vector buffer: 1,600 wraps it
    for i in range(steps):
        obs = frames.integers(0, 256, (4, 4, 84, 84), dtype=np.uint8)
        step = Batch(obs=obs, act=frames.integers(0, 6, 4), rew=frames.random(4).astype(np.float32),
                     terminated=frames.random(4) < 0.02, truncated=np.zeros(4, bool), obs_next=obs, info=Batch())
        if i % 3 == 0 and not wrapped:  # stream 3 falls behind: the streams' fills differ
            vector.add(step[:3], buffer_ids=[0, 1, 2])
        else:
            vector.add(step)
        single.add(transition(i, obs_shape=(16,)))
    for buf in (single, vector):
        data = pickle.dumps(buf)
        if not wrapped:  # what it holds, not its preallocated capacity (the 4 streams have unequal fills)
            assert len(data) <= 2 * _stored_bytes(buf) + 100_000, (len(data), _stored_bytes(buf))
        back = pickle.loads(data)
        for key in buf._meta.get_keys():
            if key != "info":
                assert np.array_equal(getattr(back._meta, key), getattr(buf._meta, key)), key
        assert back.sampler.state_dict()["rng"] == buf.sampler.state_dict()["rng"]
        assert np.array_equal(back.sample_indices(64), buf.sample_indices(64))
    # it goes on storing identically
    step = Batch(obs=np.ones((4, 4, 84, 84), np.uint8), act=np.zeros(4, int), rew=np.zeros(4, np.float32),
                 terminated=np.ones(4, bool), truncated=np.zeros(4, bool), obs_next=np.ones((4, 4, 84, 84), np.uint8),
                 info=Batch())
    restored = pickle.loads(pickle.dumps(vector))
    assert np.array_equal(restored.add(step)[0], vector.add(step)[0])
    assert np.array_equal(restored.obs, vector.obs) and restored.buffers[2].done.sum() == vector.buffers[2].done.sum()


def _hdf5_round_trip(buf, tmp_path):
    path = tmp_path / "buffer.hdf5"
    buf.save_hdf5(str(path))
    return TieredVectorReplayBuffer.load_hdf5(str(path))


def test_hasnull_checks_only_new_rows_and_still_finds_nan():
    buf = TieredVectorReplayBuffer(200, 2, level_capacity=[20, 180], sampling_ratio=[0.5, 0.5])
    for i in range(50):
        buf.add(Batch.cat([transition(i), transition(i)]), buffer_ids=[0, 1])
    assert not buf.hasnull()           # the first call checks everything
    assert not buf.hasnull()           # nothing new
    bad = Batch.cat([transition(60), transition(61)])
    bad.obs[1, 2] = np.nan
    buf.add(bad, buffer_ids=[0, 1])
    assert buf.hasnull()


@pytest.mark.parametrize("where", ["nowhere", "obs", "nested info", "object info"])
def test_the_new_rows_null_check_is_tianshous_batch_hasnull(where):
    from rlaccel_tianshou.buffers import _rows_hold_null

    meta = Batch(obs=np.zeros((6, 3), np.float32), act=np.arange(6), done=np.zeros(6, bool),
                 info=Batch(x=np.zeros(6), inner=Batch(y=np.ones(6, np.float32))), note=np.array(["a"] * 6, object))
    {"nowhere": lambda: None, "obs": lambda: meta.obs.__setitem__((4, 1), np.nan),
     "nested info": lambda: meta.info.inner.y.__setitem__(4, np.nan),
     "object info": lambda: meta.note.__setitem__(4, None)}[where]()
    for rows in (np.array([0, 1, 2]), np.array([3, 4])):
        assert _rows_hold_null(meta, rows) is bool(meta[rows].hasnull())
    assert _rows_hold_null(Batch(a=np.zeros(2), t=torch.zeros(2)), np.array([0])) is None  # not arrays: Tianshou's


def test_frame_stacking_options_work_with_tiered_sampling():
    buf = TieredReplayBuffer(60, stack_num=4, save_only_last_obs=True, ignore_obs_next=True,
                             level_capacity=[10, 50], sampling_ratio=[0.5, 0.5])
    for i in range(40):
        frames = np.stack([np.full((3, 3), i + k, np.uint8) for k in range(4)])  # env-side stack, newest last
        buf.add(Batch(obs=frames[None], act=[0], rew=[float(i)], terminated=[False], truncated=[False],
                      obs_next=frames[None] + 1, info=Batch()), buffer_ids=[0])
    batch, _ = buf.sample(16)
    assert batch.obs.shape == (16, 4, 3, 3)
    newest = batch.obs[:, -1, 0, 0].astype(int)
    assert np.array_equal(newest, batch.rew.astype(int) + 3)        # stacks rebuilt from the last frames
    assert np.array_equal(batch.obs_next[:, -1, 0, 0].astype(int)[batch.rew < 39], newest[batch.rew < 39] + 1)


def test_importance_weights_come_with_the_batch():
    buf = TieredReplayBuffer(100, level_capacity=[10, 90], sampling_ratio=[0.5, 0.5], importance_beta=1.0)
    for i in range(100):
        buf.add(transition(i), buffer_ids=[0])
    batch, _ = buf.sample(50)
    recent = 99 - batch.rew.astype(int) < 10
    assert np.allclose(batch.weight[recent], 0.2 / 1.8) and np.allclose(batch.weight[~recent], 1.0)


# ------------------------------------------------------------------ the wrapper
def test_dqn_trains_with_buffer_and_wrapper_and_frozen_layers_stay_bit_identical():
    algo = SparseDenseWrapper(make_dqn(), sparse_update_interval=10**6, dense_layers=[-1])
    train_envs = envs("CartPole-v1", 4)
    buf = TieredVectorReplayBuffer(2000, 4, level_capacity=[200, 1800], sampling_ratio=[0.5, 0.5])
    collector = Collector(algo, train_envs, buf, exploration_noise=True)
    collector.reset()
    collector.collect(n_step=400, random=True)
    with policy_within_training_step(algo.policy):
        algo.update(buffer=buf, sample_size=32)           # step 0: full
        before = copy.deepcopy(algo.policy.model.state_dict())
        for _ in range(30):
            stats = algo.update(buffer=buf, sample_size=32)
    after = algo.policy.model.state_dict()
    last = max(before).rsplit(".", 1)[0]            # the output layer's parameters move
    for name in before:
        assert torch.equal(before[name], after[name]) == (not name.startswith(last)), name
    assert algo.updater.stats["dense_updates"] == 30
    assert stats.rlaccel_dense_updates == 30 and stats.rlaccel_level_fill_L0 == 1.0  # logged with the losses


def test_the_thread_policy_holds_from_the_first_update_until_detach():
    from rlaccel_plugins.loader import load_config

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        algo = SparseDenseWrapper(make_dqn(), config=load_config(num_threads=1))
        buf = TieredVectorReplayBuffer(2000, 4, level_capacity=[200, 1800], sampling_ratio=[0.5, 0.5])
        collector = Collector(algo, envs("CartPole-v1", 4), buf, exploration_noise=True)
        collector.reset()
        collector.collect(n_step=200, random=True)
        assert torch.get_num_threads() == 2  # nothing changes before training
        with policy_within_training_step(algo.policy):
            algo.update(buffer=buf, sample_size=32)
        assert torch.get_num_threads() == 1 and algo.threads.fixed == 1
        algo.detach()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_sac_pendulum_and_ppo_cartpole_train_through_run_training():
    torch.manual_seed(0)
    # SAC, Pendulum: three optimizers (actor, two critics) under the schedule
    env = gym.make("Pendulum-v1")
    actor = ContinuousActorProbabilistic(preprocess_net=Net(state_shape=3, hidden_sizes=[32, 32]),
                                         action_shape=1, unbounded=True, conditioned_sigma=True)
    critics = [ContinuousCritic(preprocess_net=Net(state_shape=3, action_shape=1, hidden_sizes=[32, 32], concat=True))
               for _ in range(2)]
    policy = SACPolicy(actor=actor, action_space=env.action_space)
    sac = SAC(policy=policy, policy_optim=AdamOptimizerFactory(lr=1e-3), critic=critics[0],
              critic_optim=AdamOptimizerFactory(lr=1e-3), critic2=critics[1], critic2_optim=AdamOptimizerFactory(lr=1e-3))
    sac = SparseDenseWrapper(sac, sparse_update_interval=4, dense_layers=[-1])
    buf = TieredVectorReplayBuffer(2000, 2, level_capacity=[200, 1800], sampling_ratio=[0.5, 0.5])
    collector = Collector(sac, envs("Pendulum-v1", 2), buf, exploration_noise=True)
    collector.reset()
    collector.collect(n_step=200, random=True)
    sac.run_training(OffPolicyTrainerParams(training_collector=collector, max_epochs=1, epoch_num_steps=300,
                                            collection_step_num_env_steps=10, batch_size=32, show_progress=False,
                                            verbose=False, test_collector=None))
    assert len(sac.updater.attachments) == 3
    assert sac.updater.stats["dense_updates"] > sac.updater.stats["full_updates"] > 0

    # PPO, CartPole: many minibatch steps per update, each on the schedule
    torch.manual_seed(0)
    net = Net(state_shape=4, hidden_sizes=[32, 32])
    actor, critic = DiscreteActor(preprocess_net=net, action_shape=2), DiscreteCritic(preprocess_net=Net(
        state_shape=4, hidden_sizes=[32, 32]))
    policy = ProbabilisticActorPolicy(actor=actor, dist_fn=torch.distributions.Categorical,
                                      action_space=gym.spaces.Discrete(2), action_scaling=False)
    ppo = SparseDenseOnPolicyWrapper(PPO(policy=policy, critic=critic, optim=AdamOptimizerFactory(lr=1e-3)),
                                     sparse_update_interval=5, dense_layers=[-1])
    collector = Collector(ppo, envs("CartPole-v1", 2), VectorReplayBuffer(512, 2))
    ppo.run_training(OnPolicyTrainerParams(training_collector=collector, max_epochs=1, epoch_num_steps=512,
                                           collection_step_num_env_steps=256, batch_size=64,
                                           update_step_num_repetitions=2, show_progress=False, verbose=False,
                                           test_collector=None))
    stats = ppo.updater.stats
    assert stats["full_updates"] + stats["dense_updates"] == 16  # 2 updates x 2 repetitions x 4 minibatches
    assert isinstance(ppo.updater.attachments[0].module, ActorCritic)


def test_checkpoints_load_both_ways_and_lr_schedulers_step():
    algo = SparseDenseWrapper(make_dqn(), sparse_update_interval=3, dense_layers=[-1])
    buf = TieredReplayBuffer(500, level_capacity=[50, 450], sampling_ratio=[0.5, 0.5])
    collector = Collector(algo, envs("CartPole-v1", 1), buf, exploration_noise=True)
    collector.reset()
    collector.collect(n_step=200, random=True)
    with policy_within_training_step(algo.policy):
        for _ in range(7):
            algo.update(buffer=buf, sample_size=16)
    state = algo.state_dict()
    assert "_rlaccel" in state and not any(k.startswith("wrapped_algorithm.") for k in state)
    # wrapper -> wrapper: the phase of the schedule comes back too
    twin = SparseDenseWrapper(make_dqn(seed=1), sparse_update_interval=3, dense_layers=[-1])
    twin.load_state_dict(state)
    assert torch.equal(first_weight(twin), first_weight(algo))
    # unwrapped -> wrapper, and wrapper -> unwrapped
    plain = make_dqn(seed=2)
    SparseDenseWrapper(make_dqn(seed=3), dense_layers=[-1]).load_state_dict(plain.state_dict())
    plain.load_state_dict(unwrap_state_dict(state))
    assert torch.equal(first_weight(plain), first_weight(algo))
    # continue training after loading
    with policy_within_training_step(twin.policy):
        twin.update(buffer=buf, sample_size=16)
    assert twin.updater.stats["full_updates"] + twin.updater.stats["dense_updates"] == 8
    # attribute access falls through to the wrapped algorithm
    assert twin.gamma == 0.9 and twin.optim is twin.wrapped_algorithm.optim

    from tianshou.algorithm.optim import LRSchedulerFactoryLinear

    optim = AdamOptimizerFactory(lr=1e-3)
    optim.with_lr_scheduler_factory(LRSchedulerFactoryLinear(max_epochs=1, epoch_num_steps=10,
                                                             collection_step_num_env_steps=1))
    scheduled = SparseDenseWrapper(DQN(policy=make_dqn().policy, optim=optim), dense_layers=[-1])
    with policy_within_training_step(scheduled.policy):
        for _ in range(3):
            scheduled.update(buffer=buf, sample_size=16)
    assert scheduled.wrapped_algorithm.optim._optim.param_groups[0]["lr"] < 1e-3


def test_accelerate_dispatches_and_high_level_factories_build_tiered_parts():
    algo = rla.accelerate(make_dqn(), preset="classic_control", dense_layers=[-1])
    assert isinstance(algo, SparseDenseWrapper) and algo.updater.schedule.interval == 1  # off on small MLPs
    collector = TieredCollectorFactory("classic_control").create_collector(
        algo, envs("CartPole-v1", 2), VectorReplayBuffer(1000, 2, stack_num=1))
    assert isinstance(collector.buffer, TieredVectorReplayBuffer) and collector.buffer.buffer_num == 2
    wrapped = SparseDenseWrapperFactory("atari").create_wrapped_algorithm(make_dqn(), None, None, "cpu")
    assert isinstance(wrapped, SparseDenseWrapper) and wrapped.rlaccel_config.preset == "atari"


def test_envpool_envs_from_make_vec_env_feed_tianshou_collectors():
    algo = make_dqn()
    venv = rla.make_vec_env("CartPole-v1", num_envs=4, backend="envpool", seed=0)
    buf = TieredVectorReplayBuffer(1000, 4, level_capacity=[100, 900], sampling_ratio=[0.5, 0.5])
    collector = Collector(algo, venv, buf, exploration_noise=True)
    collector.reset()
    stats = collector.collect(n_step=400)
    assert stats.n_collected_steps == 400 and len(buf) == 400
    assert buf.sample(32)[0].obs.shape == (32, 4)


def test_high_level_experiment_switches_on_with_one_call(tmp_path):
    from rlaccel_tianshou import with_rlaccel
    from tianshou.highlevel.config import OffPolicyTrainingConfig
    from tianshou.highlevel.env import EnvFactoryRegistered, VectorEnvType
    from tianshou.highlevel.experiment import DQNExperimentBuilder, ExperimentConfig
    from tianshou.highlevel.params.algorithm_params import DQNParams

    builder = DQNExperimentBuilder(
        EnvFactoryRegistered(task="CartPole-v1", venv_type=VectorEnvType.DUMMY),
        ExperimentConfig(persistence_enabled=False, watch=False, device="cpu", persistence_base_dir=str(tmp_path),
                         log_file_enabled=False),
        OffPolicyTrainingConfig(max_epochs=1, epoch_num_steps=500, batch_size=32, num_training_envs=2,
                                num_test_envs=1, buffer_size=2000, collection_step_num_env_steps=10,
                                update_step_num_gradient_steps_per_sample=0.1, test_step_num_episodes=1),
    ).with_dqn_params(DQNParams(lr=1e-3, n_step_return_horizon=3)).with_model_factory_default(hidden_sizes=(32,) * 4)
    result = with_rlaccel(builder, "classic_control").build().run()
    world = result.world
    assert isinstance(world.algorithm, SparseDenseWrapper)
    assert isinstance(world.training_collector.buffer, TieredVectorReplayBuffer)
    assert world.algorithm.updater.stats["full_updates"] + world.algorithm.updater.stats["dense_updates"] == 50


def test_async_training_stores_every_collected_step_and_updates_at_the_ratio():
    from rlaccel_tianshou.async_learn import learn_async

    algo = make_dqn()
    buf = TieredVectorReplayBuffer(4000, 4, level_capacity=[400, 3600], sampling_ratio=[0.5, 0.5])
    chunks = []
    stored = learn_async(algo, envs("CartPole-v1", 4), buf, 2000, batch_size=32, gradient_steps_per_sample=0.25,
                         chunk_steps=5, sync_interval=10, on_chunk=lambda steps, stats: chunks.append(steps))
    assert stored == len(buf) == 2000 and chunks[-1] == 2000
    assert algo.policy.eps_training == 0.2
    # per-env time order is kept: every non-final transition's obs_next is the next transition's obs
    for child in range(4):
        idx = buf.sample_indices(0)
        idx = idx[idx // 1000 == child]
        data = buf[idx]
        cont = ~data.done[:-1]
        assert np.allclose(data.obs_next[:-1][cont], data.obs[1:][cont])


# ------------------------------------------------------------------ drop-in fidelity (issue 15)
def collected(buffer, n_envs=4, steps=300, reset_buffer=True):
    collector = Collector(make_dqn(), envs("CartPole-v1", n_envs), buffer, exploration_noise=True)
    collector.reset(reset_buffer=reset_buffer)
    collector.collect(n_step=steps, random=True)
    return collector


@pytest.mark.parametrize("vector", [True, False])
def test_tiered_buffer_like_keeps_the_data_size_and_episode_bookkeeping(vector):
    from rlaccel_tianshou.acceleration import tiered_buffer_like
    from tianshou.data import ReplayBuffer

    n_envs = 4 if vector else 1
    stock = VectorReplayBuffer(2000, n_envs) if vector else ReplayBuffer(2000)
    collected(stock, n_envs)
    tiered = tiered_buffer_like(stock, "atari")
    assert tiered.maxsize == stock.maxsize == 2000 and len(tiered) == len(stock) == 300
    everything = stock.sample_indices(0)
    assert np.array_equal(tiered.sample_indices(0), everything)
    for key in ("obs", "act", "rew", "terminated", "truncated", "obs_next"):
        assert np.array_equal(tiered[everything][key], stock[everything][key]), key
    assert np.array_equal(tiered.prev(everything), stock.prev(everything))  # episode links, for n-step returns
    assert np.array_equal(tiered.next(everything), stock.next(everything))
    again = collected(tiered, n_envs, steps=40, reset_buffer=False)  # collection goes on into the converted buffer
    assert len(again.buffer) == 340
    batch, _ = tiered.sample(64)
    assert len(batch) == 64


def test_tiered_buffer_like_refuses_buffers_with_their_own_behaviour():
    from rlaccel_tianshou.acceleration import tiered_buffer_like
    from tianshou.data import PrioritizedVectorReplayBuffer

    with pytest.raises(rla.ConfigError, match="got buffer=PrioritizedVectorReplayBuffer.*prioritisation"):
        tiered_buffer_like(PrioritizedVectorReplayBuffer(100, 2, alpha=0.6, beta=0.4), "classic_control")
    with pytest.raises(rla.ConfigError, match="level_capacity must keep the buffer's size"):
        tiered_buffer_like(collected(VectorReplayBuffer(2000, 4)).buffer, level_capacity=[100, 300],
                           sampling_ratio=[0.5, 0.5])


def test_presets_keep_the_users_buffer_size():
    buf = TieredVectorReplayBuffer(1000, 10, preset="atari")
    assert buf.maxsize == 1000 and buf.sampler.layout.level_capacity.tolist() == [1000]
    assert TieredReplayBuffer(30_000, preset="atari").maxsize == 30_000
    assert TieredVectorReplayBuffer(1000, 10, level_capacity=[100, 900], sampling_ratio=[0.5, 0.5]).maxsize == 1000


def test_accelerate_twice_rewraps_the_algorithm_with_the_new_settings():
    dqn = make_dqn()
    first = rlaccel_tianshou.accelerate(dqn, sparse_update_interval=5, dense_layers=[-1])
    second = rlaccel_tianshou.accelerate(first, sparse_update_interval=3, dense_layers=[-1])
    assert second.wrapped_algorithm is dqn and second.updater.schedule.interval == 3
    assert first.updater.attachments == []  # the first wrapper let go of everything
    buf = collected(TieredVectorReplayBuffer(2000, 4, level_capacity=[200, 1800], sampling_ratio=[0.5, 0.5])).buffer
    with policy_within_training_step(second.policy):
        for _ in range(6):
            stats = second.update(buffer=buf, sample_size=32)
    assert (stats.rlaccel_full_updates, stats.rlaccel_dense_updates) == (2, 4)


def seeded_dqn_run():
    np.random.seed(3)
    torch.manual_seed(3)
    algorithm = make_dqn(seed=3)
    buffer = TieredVectorReplayBuffer(2000, 4, preset="classic_control")
    collector = Collector(algorithm, envs("CartPole-v1", 4, seed=3), buffer, exploration_noise=True)
    collector.reset(reset_buffer=True)
    collector.collect(n_step=200, random=True)
    with policy_within_training_step(algorithm.policy):
        for _ in range(20):
            collector.collect(n_step=8)
            algorithm.update(buffer=buffer, sample_size=32)
    return [p.detach().clone() for p in algorithm.policy.parameters()]


def test_a_seeded_tianshou_run_with_the_tiered_buffer_is_reproducible():
    first, second = seeded_dqn_run(), seeded_dqn_run()
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_tianshous_numba_kernels_compile_once_per_machine_and_the_cache_can_be_turned_off():
    import subprocess
    import sys

    from numba.core.caching import NullCache
    from tianshou.algorithm import algorithm_base
    from tianshou.data.buffer import manager

    kernels = (manager._prev_index, manager._next_index, algorithm_base._gae, algorithm_base._nstep_return)
    TieredVectorReplayBuffer(100, 2)  # this process compiles (or loads) and stores them
    algorithm_base.Policy._compile()
    assert all(not isinstance(kernel._cache, NullCache) for kernel in kernels)
    names = "(manager._prev_index, manager._next_index, algorithm_base._gae, algorithm_base._nstep_return)"
    new_process = ("from rlaccel_tianshou import TieredVectorReplayBuffer\n"
                   "from tianshou.algorithm import algorithm_base\nfrom tianshou.data.buffer import manager\n"
                   "TieredVectorReplayBuffer(100, 2); algorithm_base.Policy._compile()\n"
                   f"print([sum(k.stats.cache_hits.values()) for k in {names}])")
    turned_off = ("import rlaccel_tianshou.buffers\nfrom numba.core.caching import NullCache\n"
                  "from tianshou.algorithm import algorithm_base\nfrom tianshou.data.buffer import manager\n"
                  f"print([isinstance(k._cache, NullCache) for k in {names}])")
    runs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "RLACCEL_NUMBA_CACHE": flag})
            for code, flag in ((new_process, "1"), (turned_off, "0"))]
    hits, off = (run.communicate(timeout=120)[0].strip().splitlines()[-1] for run in runs)
    assert all(n >= 1 for n in ast.literal_eval(hits)), hits  # loaded from the cache, not compiled
    assert ast.literal_eval(off) == [True] * 4
