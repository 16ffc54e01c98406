"""`LeanCollector` collects what Tianshou's `Collector` collects, step by step: the same
algorithm, seeds and envs through both — the whole buffer (storage, infos, every sub-buffer's counters),
every call's collect statistics, the collector's carried-over observations and infos, and numpy's RNG
(exploration draws) compared. Tolerance: none (bit-identical, and the same Python and numpy types)."""

from __future__ import annotations

import copy
import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch
from tianshou.algorithm import DQN
from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.data import Batch, Collector, ReplayBuffer, VectorReplayBuffer
from tianshou.env import DummyVectorEnv
from tianshou.utils.net.common import Net

from rlaccel_plugins.fused import differences


def _plain(value):
    """A comparable copy of ``value``: Batches as ordered key lists, object arrays and buffers unpacked,
    scalars tagged with their type."""
    if isinstance(value, Batch):
        return ["Batch", [[key, _plain(item)] for key, item in value.__dict__.items()]]
    if isinstance(value, ReplayBuffer):
        return [type(value).__name__, _plain(vars(value))]
    if isinstance(value, np.random.RandomState):
        return _plain(list(value.get_state()))
    if isinstance(value, np.random.Generator):
        return _plain(value.bit_generator.state)
    if isinstance(value, np.ndarray):
        return [_plain(item) for item in value] if value.dtype == object else value.copy()
    if dataclasses.is_dataclass(value):
        return [type(value).__name__, _plain(vars(value))]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, bool | int | float | np.generic):
        return [type(value).__name__, value]
    if hasattr(value, "__dict__") and not callable(value):  # e.g. the tiered buffer's sampler
        return [type(value).__name__, _plain(vars(value))]
    return value


def _dqn(hidden=(64, 64)) -> DQN:
    torch.manual_seed(0)
    policy = DiscreteQLearningPolicy(model=Net(state_shape=4, action_shape=2, hidden_sizes=list(hidden)),
                                     action_space=gym.spaces.Discrete(2), eps_training=0.2)
    return DQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-3), gamma=0.9, n_step_return_horizon=3)


def _ppo():
    from tianshou.algorithm import PPO
    from tianshou.algorithm.modelfree.reinforce import DiscreteActorPolicy
    from tianshou.utils.net.discrete import DiscreteActor, DiscreteCritic

    torch.manual_seed(0)
    net = Net(state_shape=4, hidden_sizes=[16])
    actor, critic = DiscreteActor(preprocess_net=net, action_shape=2), DiscreteCritic(preprocess_net=net)
    policy = DiscreteActorPolicy(actor=actor, dist_fn=torch.distributions.Categorical,
                                 action_space=gym.spaces.Discrete(2))
    return PPO(policy=policy, critic=critic, optim=AdamOptimizerFactory())


class _InfoEveryThirdStep(gym.Wrapper):
    """An info that is a 0-d array every third step (a scalar otherwise): steps the lean write hands to Tianshou."""

    def step(self, action):
        obs, reward, terminated, truncated, _ = self.env.step(action)
        self.count = getattr(self, "count", 0) + 1
        x = np.float32(self.count / 7)
        return obs, reward, terminated, truncated, {"x": np.array(x) if self.count % 3 == 0 else x}


def _envs(count: int = 4, wrapper=None) -> DummyVectorEnv:
    def make():
        env = gym.make("CartPole-v1")
        return wrapper(env) if wrapper else env

    envs = DummyVectorEnv([make for _ in range(count)])
    envs.seed(5)
    return envs


def _collect(collector_class, algorithm, steps: int, exploration: bool = True, buffer=None, envs=None,
             episodes: tuple[int, ...] = (8,)) -> dict:
    envs = envs or _envs()
    buffer = buffer if buffer is not None else VectorReplayBuffer(4_000, len(envs))
    collector = collector_class(algorithm, envs, buffer, exploration_noise=exploration)
    np.random.seed(9)
    torch.manual_seed(9)
    collector.reset()
    stats = [collector.collect(n_step=100, random=True)]
    with torch.no_grad():
        algorithm.policy.is_within_training_step = True  # the training eps, as in a trainer's collection
        for _ in range(steps // 200):
            stats.append(collector.collect(n_step=200))
        algorithm.policy.is_within_training_step = False
    stats += [collector.collect(n_episode=n) for n in episodes]  # greedy (eps_inference 0), whole episodes
    stats.append(collector.collect(n_step=48))
    stats += [collector.collect(n_step=len(envs)) for _ in range(40)]  # a trainer's short calls: 0, 1, 2+ episodes
    for s in stats:
        s.collect_time = s.collect_speed = 0.0  # wall-clock
    return _plain({"buffer": buffer, "stats": stats, "rng": [np.random.get_state(), torch.get_rng_state()],
                   "carried": [collector._pre_collect_obs_RO, collector._pre_collect_info_R,
                               collector._pre_collect_hidden_state_RH, collector.collect_step,
                               collector.collect_episode]})


@pytest.fixture
def lean_writes(monkeypatch):
    """Counts the steps the lean loop wrote itself and those it handed to ``buffer.add``."""
    from rlaccel_tianshou import step_write

    counts = {"lean": 0, "tianshou": 0}
    add_step = step_write.add_step

    def counting(*args, **kwargs):
        result = add_step(*args, **kwargs)
        counts["lean" if result is not None else "tianshou"] += 1
        return result

    monkeypatch.setattr(step_write, "add_step", counting)
    return counts


def _tiered():
    from rlaccel_tianshou import TieredVectorReplayBuffer

    return TieredVectorReplayBuffer(4_000, 4, level_capacity=[800, 3_200], sampling_ratio=[0.5, 0.5])


@pytest.mark.filterwarnings("ignore:n_episode=3 should be larger")  # fewer episodes than envs: on purpose
@pytest.mark.parametrize(("case", "exploration", "make_buffer", "episodes"), [
    ("dqn", True, None, (8,)),
    ("dqn", False, None, (8, 3)),
    ("dqn", True, _tiered, (8,)),
    ("dqn", True, lambda: VectorReplayBuffer(4_000, 4, ignore_obs_next=True), (8,)),
    ("dqn", True, lambda: VectorReplayBuffer(120, 4), (8,)),  # sub-buffers wrap, episodes outlive them
    ("ppo", False, None, (8,)),  # Tianshou's own action step (a dist), inside the lean loop
])
def test_lean_collector_collects_what_tianshous_collector_collects(case, exploration, make_buffer, episodes,
                                                                   lean_writes):
    from rlaccel_tianshou import LeanCollector

    algorithm = _dqn() if case == "dqn" else _ppo()
    runs = {}
    for name, collector_class in (("stock", Collector), ("lean", LeanCollector)):
        buffer = make_buffer() if make_buffer else None
        runs[name] = _collect(collector_class, copy.deepcopy(algorithm), 2_000, exploration, buffer, episodes=episodes)
    assert differences(runs["stock"], runs["lean"]) == []
    assert lean_writes["lean"] > 500 and lean_writes["tianshou"] == 1  # only the first step: it allocates


def test_steps_the_lean_write_cannot_take_go_through_tianshous_add(lean_writes):
    from rlaccel_tianshou import LeanCollector

    dqn = _dqn()
    stock = _collect(Collector, copy.deepcopy(dqn), 1_000, envs=_envs(4, _InfoEveryThirdStep))
    lean = _collect(LeanCollector, copy.deepcopy(dqn), 1_000, envs=_envs(4, _InfoEveryThirdStep))
    assert differences(stock, lean) == []
    assert lean_writes["lean"] > 100 and lean_writes["tianshou"] > 100


def test_envpool_envs_collect_lean_with_their_nested_infos(lean_writes):
    pytest.importorskip("envpool")
    from rlaccel_tianshou import LeanCollector

    import rlaccel_plugins as rla

    def envs():
        pool = rla.make_vec_env("CartPole-v1", num_envs=4, backend="envpool", seed=5)
        pool.action_space.seed(3)  # the random warm-up's draws (one space for all envs)
        return pool

    dqn = _dqn()
    stock, lean = (_collect(cls, copy.deepcopy(dqn), 1_000, envs=envs()) for cls in (Collector, LeanCollector))
    assert differences(stock, lean) == []
    assert lean_writes["lean"] > 200 and lean_writes["tianshou"] == 1  # envpool's infos nest `players`


def test_hooks_custom_stats_and_other_buffers_collect_through_tianshous_loop():
    from rlaccel_tianshou import LeanCollector
    from tianshou.data import CollectStats, PrioritizedVectorReplayBuffer
    from tianshou.data.collector import EpisodeRolloutHookMCReturn

    class MyStats(CollectStats):
        pass

    dqn, envs = _dqn(), _envs()
    assert LeanCollector(dqn, envs, VectorReplayBuffer(100, 4)).lean_loop
    assert not LeanCollector(dqn, envs, VectorReplayBuffer(100, 4), on_step_hook=lambda *a: None).lean_loop
    assert not LeanCollector(dqn, envs, VectorReplayBuffer(100, 4),
                             on_episode_done_hook=EpisodeRolloutHookMCReturn()).lean_loop
    assert not LeanCollector(dqn, envs, VectorReplayBuffer(100, 4), collect_stats_class=MyStats).lean_loop
    assert not LeanCollector(dqn, envs, PrioritizedVectorReplayBuffer(100, 4, alpha=0.6, beta=0.4)).lean_loop
    hooked = {}
    for name, cls in (("stock", Collector), ("lean", LeanCollector)):
        buffer = VectorReplayBuffer(2_000, 4)
        collector = cls(copy.deepcopy(dqn), _envs(), buffer, on_episode_done_hook=EpisodeRolloutHookMCReturn())
        collector.reset()
        np.random.seed(3)
        collector.collect(n_episode=6)
        hooked[name] = _plain(buffer)
    assert differences(hooked["stock"], hooked["lean"]) == []


def test_a_changed_stored_reward_breaks_the_collector_equivalence(monkeypatch):
    from rlaccel_tianshou import LeanCollector, step_write

    add_step = step_write.add_step
    monkeypatch.setattr(step_write, "add_step", lambda buffer, ids, fields, *rest: add_step(
        buffer, ids, {**fields, "rew": fields["rew"] * 0.5}, *rest))
    dqn = _dqn()
    assert differences(_collect(Collector, copy.deepcopy(dqn), 400), _collect(LeanCollector, copy.deepcopy(dqn), 400))


def test_a_changed_action_breaks_the_collector_equivalence(monkeypatch):
    from rlaccel_tianshou import LeanCollector
    from rlaccel_tianshou import collector as module

    monkeypatch.setattr(module, "to_numpy", lambda t: 1 - t.cpu().numpy())  # the argmax flipped
    dqn = _dqn()
    assert differences(_collect(Collector, copy.deepcopy(dqn), 400), _collect(LeanCollector, copy.deepcopy(dqn), 400))


def test_other_policies_collect_through_tianshous_own_step():
    from rlaccel_tianshou import LeanCollector

    collector = LeanCollector(_ppo(), DummyVectorEnv([lambda: gym.make("CartPole-v1")]), VectorReplayBuffer(100, 1))
    _ = collector.reset()
    assert not collector.lean and collector.lean_loop and collector.collect(n_step=20).n_collected_steps == 20


class _ModesSeen(gym.Wrapper):
    """Records, at each env step, the training flag of every module of ``policy``."""

    def __init__(self, env, policy, seen):
        super().__init__(env)
        self.policy, self.seen = policy, seen

    def step(self, action):
        self.seen.append([m.training for m in self.policy.modules()])
        return self.env.step(action)


class _KeepsEval(torch.nn.Module):
    """A module whose ``train`` keeps it in eval mode (as users freeze batch norms) and counts its calls."""

    calls = 0

    def train(self, mode: bool = True):
        type(self).calls += 1
        return super().train(False)


@pytest.mark.parametrize("override", [False, True])
def test_collect_switches_the_policy_to_eval_mode_and_back_as_tianshou_does(override):
    """Module flags during collection (seen from the env) and after it, from a policy in training mode with
    one submodule in eval mode: the flat switch gives Tianshou's flags; a module that overrides ``train``
    gets Tianshou's own switch, so its override runs."""
    from rlaccel_tianshou import LeanCollector

    runs = []
    for cls in (Collector, LeanCollector):
        dqn, seen = _dqn(), []
        dqn.policy.train(True)
        dqn.policy.model.model.eval()  # a mixed tree: Module.train(original) makes it uniform again
        if override:
            dqn.policy.frozen = _KeepsEval()
        envs = DummyVectorEnv([lambda p=dqn.policy, s=seen: _ModesSeen(gym.make("CartPole-v1"), p, s) for _ in range(2)])
        envs.seed(0)
        collector = cls(dqn, envs, VectorReplayBuffer(200, 2), exploration_noise=True)
        collector.reset()
        _KeepsEval.calls = 0
        collector.collect(n_step=20)
        runs.append((seen, [m.training for m in dqn.policy.modules()], _KeepsEval.calls))
    (stock_seen, stock_after, stock_calls), (lean_seen, lean_after, lean_calls) = runs
    assert stock_seen == lean_seen and stock_after == lean_after and stock_calls == lean_calls
    assert len(stock_seen) == 20 and not any(any(flags) for flags in stock_seen)
    assert stock_after[0] and (stock_calls > 0) == override


@pytest.mark.parametrize("returns", [[], [21.0], [21.0, 9.0], [np.inf], [np.nan], [-0.0]])
def test_the_one_episode_summaries_are_tianshous(returns):
    from rlaccel_tianshou.collector import _refresh_sequence_stats
    from tianshou.data import CollectStats

    ours, theirs = CollectStats(), CollectStats()
    for stats in (ours, theirs):
        for i, episode_return in enumerate(returns):
            stats.update_at_episode_done(episode_batch=range(5 + i), episode_return=episode_return)
    _refresh_sequence_stats(ours)
    theirs.refresh_all_sequence_stats()
    assert differences(_plain(theirs), _plain(ours)) == []
