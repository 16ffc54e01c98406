"""The fused Tianshou updates (DQN, QR-DQN, DDPG, TD3, SAC, PPO) are Tianshou's own, step by step:
the same algorithm, seed and buffer contents through the wrapper with
``fused_updates`` off and on for 200 updates (PPO: 224 minibatch steps) — every update's stats,
backpropagated losses and gradients, then parameters, target networks, optimizer states, counters,
and every RNG (torch's, numpy's, the buffer's) compared.

Tolerance: none — bit-identical on this CPU (Tianshou's own ``_nstep_return`` / ``compute_episodic_return``
compute the returns from the same values; the multi-tensor Adam and the Polyak update compute the
same arithmetic). Mutation tests show a one-line change breaks it.
"""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlaccel_plugins.checkpoint import state_digest
from rlaccel_plugins.fused import UpdateRecorder, differences

pytestmark = pytest.mark.needs("tianshou")

UPDATES = 200


def _algorithm(is_double=True, huber=None, n_step=3, target=10):
    from tianshou.algorithm import DQN
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.utils.net.common import Net

    torch.manual_seed(0)
    policy = DiscreteQLearningPolicy(model=Net(state_shape=4, action_shape=2, hidden_sizes=[64, 64]),
                                     action_space=gym.spaces.Discrete(2), eps_training=0.1)
    return DQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-3), gamma=0.9, n_step_return_horizon=n_step,
               target_update_freq=target, is_double=is_double, huber_loss_delta=huber)


def _buffer(kind: str, algorithm, env_id: str = "CartPole-v1"):
    from rlaccel_tianshou import TieredVectorReplayBuffer
    from tianshou.data import Collector, ReplayBuffer, VectorReplayBuffer
    from tianshou.env import DummyVectorEnv

    envs = DummyVectorEnv([lambda: gym.make(env_id) for _ in range(1 if kind == "single" else 4)])
    envs.seed(0)
    buffer = {"vector": lambda: VectorReplayBuffer(4_000, 4),
              "single": lambda: ReplayBuffer(4_000),
              "tiered-weighted": lambda: TieredVectorReplayBuffer(4_000, 4, level_capacity=[1_000, 3_000],
                                                                  sampling_ratio=[0.6, 0.4], importance_beta=0.5),
              "no-obs-next": lambda: VectorReplayBuffer(4_000, 4, ignore_obs_next=True)}[kind]()
    np.random.seed(0)
    collector = Collector(algorithm, envs, buffer, exploration_noise=True)
    collector.reset()
    collector.collect(n_step=2_000, random=True)
    return buffer


@pytest.mark.parametrize(("kind", "kwargs"), [
    ("vector", {}),                                                   # double DQN, 3-step, MSE, target every 10
    ("vector", dict(is_double=False, huber=1.0, n_step=1, target=0)),  # Nature DQN, Huber, no target network
    ("single", dict(n_step=5)),
    ("no-obs-next", {}),
    ("tiered-weighted", {}),                                          # importance weights in the MSE loss
])
def test_fused_dqn_update_is_tianshous_bit_for_bit(kind, kwargs):
    stock, fused = _stock_and_fused(_algorithm(**kwargs), kind)
    assert len(stock["gradients"]) == UPDATES
    assert differences(stock, fused) == []


def test_a_one_line_change_to_the_returns_breaks_the_equivalence(monkeypatch):
    from rlaccel_tianshou.fused import common

    original = common.next_observations
    monkeypatch.setattr(common, "next_observations", lambda buffer, indices: original(buffer, indices) * 1.0001)
    stock, fused = _stock_and_fused(_algorithm(), "vector")
    assert differences(stock["stats"], fused["stats"])


def test_fused_updates_setting_and_what_runs_tianshous_own(caplog):
    from rlaccel_tianshou import SparseDenseWrapper
    from tianshou.algorithm import DQN
    from tianshou.algorithm.optim import AdamOptimizerFactory

    from rlaccel_plugins.errors import ConfigError
    from rlaccel_plugins.loader import load_config

    class MyDQN(DQN):  # a subclass may change the update: not fused
        pass

    mine = MyDQN(policy=_algorithm().policy, optim=AdamOptimizerFactory())
    with caplog.at_level("INFO", logger="rlaccel"):
        assert not SparseDenseWrapper(mine, preset="classic_control").fused
    assert "no fused update for MyDQN" in caplog.text
    with pytest.raises(ConfigError, match="fused_updates=true needs a fused update .* got MyDQN"):
        SparseDenseWrapper(mine, config=load_config(preset="classic_control", fused_updates=True))
    assert SparseDenseWrapper(_algorithm(), preset="classic_control").fused  # auto: on where it exists


# ------------------------------------------------------------------------ QR-DQN, DDPG, TD3, SAC
def _qrdqn(n_step=3, target=10):
    from tianshou.algorithm import QRDQN
    from tianshou.algorithm.modelfree.qrdqn import QRDQNPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.utils.net.common import Net

    torch.manual_seed(0)
    net = Net(state_shape=4, action_shape=2, hidden_sizes=[64, 64], num_atoms=16)
    policy = QRDQNPolicy(model=net, action_space=gym.spaces.Discrete(2), eps_training=0.1)
    return QRDQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-3), gamma=0.9, num_quantiles=16,
                 n_step_return_horizon=n_step, target_update_freq=target)


def _actor_critic(name: str, n_step=1, auto_alpha=True):
    from tianshou.algorithm import DDPG, SAC, TD3
    from tianshou.algorithm.modelfree.ddpg import ContinuousDeterministicPolicy
    from tianshou.algorithm.modelfree.sac import AutoAlpha, SACPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.utils.net.common import Net
    from tianshou.utils.net.continuous import (
        ContinuousActorDeterministic,
        ContinuousActorProbabilistic,
        ContinuousCritic,
    )

    torch.manual_seed(0)
    space = gym.spaces.Box(-2.0, 2.0, (1,))

    def critic():
        return ContinuousCritic(preprocess_net=Net(state_shape=3, action_shape=1, hidden_sizes=[64, 64],
                                                   concat=True))

    optim = AdamOptimizerFactory(lr=1e-3)
    if name == "SAC":
        actor = ContinuousActorProbabilistic(preprocess_net=Net(state_shape=3, hidden_sizes=[64, 64]),
                                             action_shape=1, unbounded=True, conditioned_sigma=True)
        alpha = AutoAlpha(-1.0, 0.0, AdamOptimizerFactory(lr=3e-4)) if auto_alpha else 0.2
        return SAC(policy=SACPolicy(actor=actor, action_space=space), policy_optim=optim, critic=critic(),
                   critic_optim=optim, critic2=critic(), critic2_optim=optim, tau=0.01, gamma=0.95, alpha=alpha,
                   n_step_return_horizon=n_step)
    actor = ContinuousActorDeterministic(preprocess_net=Net(state_shape=3, hidden_sizes=[64, 64]), action_shape=1)
    policy = ContinuousDeterministicPolicy(actor=actor, action_space=space, exploration_noise=0.1)
    if name == "TD3":
        return TD3(policy=policy, policy_optim=optim, critic=critic(), critic_optim=optim, critic2=critic(),
                   critic2_optim=optim, tau=0.01, gamma=0.95, n_step_return_horizon=n_step)
    return DDPG(policy=policy, policy_optim=optim, critic=critic(), critic_optim=optim, tau=0.01, gamma=0.95,
                n_step_return_horizon=n_step)


def _run(wrapper, buffer, record: bool = True):
    """Every update's stats and recorded losses/gradients (``record``: the recorder's step hooks leave no
    compiled step eligible), then the whole state and every RNG."""
    from tianshou.utils.torch_utils import policy_within_training_step

    np.random.seed(5)
    torch.manual_seed(5)
    algorithm = wrapper.wrapped_algorithm
    optimizers = [o._optim for o in algorithm._optimizers]
    alpha = getattr(algorithm, "alpha", None)
    if hasattr(alpha, "_optim"):
        optimizers.append(alpha._optim)
    stats, fused_calls = [], []
    if wrapper.fused:
        inner = wrapper._fused_update
        wrapper._fused_update = lambda *args: fused_calls.append(1) or inner(*args)
    with UpdateRecorder(optimizers if record else []) as recorder, policy_within_training_step(wrapper.policy):
        for _ in range(UPDATES):
            step = wrapper.update(buffer, 64).get_loss_stats_dict()
            stats.append({k: v for k, v in step.items() if not k.startswith("rlaccel")})
    return {"stats": stats, "backward": recorder.losses, "gradients": recorder.gradients,
            "state": dict(algorithm.state_dict()), "optimizers": [copy.deepcopy(o.state_dict()) for o in optimizers],
            "counters": [getattr(algorithm, name, None) for name in ("_iter", "_cnt", "_last")],
            "torch_rng": torch.get_rng_state(), "numpy_rng": np.random.get_state()[1],
            "buffer": state_digest(buffer)}, len(fused_calls)


@pytest.mark.parametrize(("name", "kind", "kwargs"), [
    ("QRDQN", "vector", {}),
    ("QRDQN", "tiered-weighted", dict(n_step=1, target=0)),  # weights in the quantile loss, no target network
    ("DDPG", "vector", dict(n_step=2)),
    ("TD3", "vector", {}),                                   # target smoothing noise, delayed actor updates
    ("TD3", "tiered-weighted", dict(n_step=3)),
    ("SAC", "vector", {}),                                   # auto-tuned alpha
    ("SAC", "tiered-weighted", dict(auto_alpha=False, n_step=2)),
])
def test_fused_update_is_tianshous_bit_for_bit(name, kind, kwargs):
    algorithm = _qrdqn(**kwargs) if name == "QRDQN" else _actor_critic(name, **kwargs)
    stock, fused = _stock_and_fused(algorithm, kind)
    assert differences(stock, fused) == []


def _stock_and_fused(algorithm, kind: str, **config):
    """The update run ``UPDATES`` times by Tianshou and fused, from the same algorithm and buffer (both
    wrappers with the ``config`` overrides)."""
    from rlaccel_tianshou import SparseDenseWrapper

    from rlaccel_plugins.loader import load_config

    continuous = type(algorithm).__name__ in ("DDPG", "TD3", "SAC")
    buffer = _buffer(kind, algorithm, "Pendulum-v1" if continuous else "CartPole-v1")
    twin, twin_buffer = copy.deepcopy(algorithm), copy.deepcopy(buffer)
    stock = SparseDenseWrapper(algorithm, config=load_config(preset="classic_control", fused_updates=False, **config))
    fused = SparseDenseWrapper(twin, config=load_config(preset="classic_control", fused_updates=True, **config))
    assert fused.fused and not stock.fused
    (stock_run, _), (fused_run, fused_calls) = _run(stock, buffer), _run(fused, twin_buffer)
    assert fused_calls == UPDATES
    assert len(stock_run["gradients"]) >= UPDATES
    return stock_run, fused_run


def test_the_fused_update_runs_in_fp32_only():
    """Under ``precision.dtype: bf16`` the wrapper's autocast casts the outputs of the optimizers' modules
    (DQN's policy) to fp32 for the loss; the fused update calls the networks inside them, so its loss
    would see bf16 Q-values (measured: every update's loss off by bf16 rounding). There Tianshou's own
    update runs (``auto``), and ``fused_updates=true`` is a clear error."""
    from rlaccel_tianshou import SparseDenseWrapper

    from rlaccel_plugins.errors import ConfigError
    from rlaccel_plugins.loader import load_config

    assert not SparseDenseWrapper(_algorithm(), config=load_config(dtype="bf16")).fused
    assert SparseDenseWrapper(_algorithm(), config=load_config(dtype="fp32")).fused
    with pytest.raises(ConfigError, match="fp32 only, got dtype='bf16'"):
        SparseDenseWrapper(_algorithm(), config=load_config(dtype="bf16", fused_updates=True))


@pytest.mark.parametrize("name", ["DQN", "SAC"])
def test_the_fused_optimizer_agrees_with_tianshous_update_within_its_tolerance(name):
    """``training.fused_optimizer``: the single-kernel Adam rounds differently, within the tolerance the SB3
    tests state (a one-line loss change breaks it there)."""
    from rlaccel_tianshou import SparseDenseWrapper

    from rlaccel_plugins.loader import load_config

    algorithm = _algorithm() if name == "DQN" else _actor_critic(name)
    continuous = name != "DQN"
    buffer = _buffer("vector", algorithm, "Pendulum-v1" if continuous else "CartPole-v1")
    twin, twin_buffer = copy.deepcopy(algorithm), copy.deepcopy(buffer)
    stock = SparseDenseWrapper(algorithm, config=load_config(preset="classic_control", fused_updates=False))
    fused = SparseDenseWrapper(twin, config=load_config(preset="classic_control", fused_updates=True,
                                                        fused_optimizer=True))
    (stock_run, _), (fused_run, _) = _run(stock, buffer), _run(fused, twin_buffer)
    assert differences(stock_run, fused_run)  # the single-kernel step ran
    assert differences(stock_run, fused_run, rtol=1e-4, atol=1e-5) == []


@pytest.mark.parametrize(("name", "mutation"), [
    ("SAC", "log_prob"),   # the entropy term 0.01% off
    ("TD3", "polyak"),     # the target update with SB3's rounding instead of Tianshou's: last-bit differences
])
def test_a_one_line_change_to_an_actor_critic_update_breaks_the_equivalence(monkeypatch, name, mutation):
    from rlaccel_tianshou.fused import actor_critic

    from rlaccel_plugins.fused import polyak_update_

    if mutation == "log_prob":
        original = actor_critic._squashed_gaussian

        def entropy_off(actor, obs):
            act, log_prob = original(actor, obs)
            return act, log_prob * 1.0001
        monkeypatch.setattr(actor_critic, "_squashed_gaussian", entropy_off)
    else:
        def sb3_rounding(algorithm):
            pairs = algorithm._lagged_networks._lagged_network_pairs
            polyak_update_([p.data for pair in pairs for p in pair.source.parameters()],
                           [p.data for pair in pairs for p in pair.target.parameters()], algorithm.tau)
        monkeypatch.setattr(actor_critic, "polyak", sb3_rounding)
    stock, fused = _stock_and_fused(_actor_critic(name), "vector")
    assert differences(stock["state"], fused["state"])


def test_ppo_without_tianshous_unused_sample_draws_differs(monkeypatch):
    """The fused PPO draws the ``dist.sample()`` it does not use, because Tianshou's does: without it
    the random stream differs, and so do the parameters, in the last bits (the sample computes the
    Categorical's ``probs`` early, which changes the order autograd sums the entropy's gradient in)."""
    from rlaccel_tianshou import SparseDenseOnPolicyWrapper
    from rlaccel_tianshou.fused import on_policy

    from rlaccel_plugins.loader import load_config

    def no_sample(policy, obs):
        return policy.dist_fn(policy.actor(obs)[0])
    monkeypatch.setattr(on_policy, "_policy_dist", no_sample)
    algorithm = _ppo(False)
    buffer = _on_policy_buffer(False, algorithm)
    runs = [_run_on_policy(SparseDenseOnPolicyWrapper(a, config=load_config(preset="classic_control",
                                                                            fused_updates=fused)), buffer, 1)[0]
            for a, fused in ((algorithm, False), (copy.deepcopy(algorithm), True))]
    assert differences(runs[0]["torch_rng"], runs[1]["torch_rng"])
    assert differences(runs[0]["state"], runs[1]["state"])


# ---------------------------------------------------------------------------------------------- PPO
def _ppo(continuous: bool, **kwargs):
    from tianshou.algorithm import PPO
    from tianshou.algorithm.modelfree.reinforce import DiscreteActorPolicy, ProbabilisticActorPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.utils.net.common import Net
    from tianshou.utils.net.continuous import ContinuousActorProbabilistic, ContinuousCritic
    from tianshou.utils.net.discrete import DiscreteActor, DiscreteCritic

    torch.manual_seed(0)
    obs_dim = 3 if continuous else 4
    trunk = dict(state_shape=obs_dim, hidden_sizes=[64, 64])
    if continuous:
        actor = ContinuousActorProbabilistic(preprocess_net=Net(**trunk), action_shape=1, unbounded=True)
        policy = ProbabilisticActorPolicy(
            actor=actor, dist_fn=lambda loc_scale: torch.distributions.Independent(
                torch.distributions.Normal(*loc_scale), 1),
            action_space=gym.spaces.Box(-2.0, 2.0, (1,)))
        critic = ContinuousCritic(preprocess_net=Net(**trunk))
    else:
        policy = DiscreteActorPolicy(actor=DiscreteActor(preprocess_net=Net(**trunk), action_shape=2),
                                     action_space=gym.spaces.Discrete(2))
        critic = DiscreteCritic(preprocess_net=Net(**trunk))
    return PPO(policy=policy, critic=critic, optim=AdamOptimizerFactory(lr=1e-3), max_batchsize=200, **kwargs)


def _on_policy_buffer(continuous: bool, algorithm):
    from tianshou.data import Collector, VectorReplayBuffer
    from tianshou.env import DummyVectorEnv

    env_id = "Pendulum-v1" if continuous else "CartPole-v1"
    envs = DummyVectorEnv([lambda: gym.make(env_id) for _ in range(4)])
    envs.seed(0)
    buffer = VectorReplayBuffer(600, 4)
    torch.manual_seed(1)
    np.random.seed(1)
    collector = Collector(algorithm, envs, buffer)
    collector.reset()
    collector.collect(n_step=600)  # episodes cut by the buffer's end count as unfinished (GAE)
    return buffer


def _run_on_policy(wrapper, buffer, updates: int = 7):
    from tianshou.utils.torch_utils import policy_within_training_step

    np.random.seed(5)
    torch.manual_seed(5)
    ppo = wrapper.wrapped_algorithm
    stats, fused_calls = [], []
    if wrapper.fused:
        inner = wrapper._fused_update
        wrapper._fused_update = lambda *args: fused_calls.append(1) or inner(*args)
    with UpdateRecorder([ppo.optim._optim]) as record, policy_within_training_step(wrapper.policy):
        for _ in range(updates):
            step = wrapper.update(buffer, 64, 4).get_loss_stats_dict()
            stats.append({k: v for k, v in step.items() if not k.startswith("rlaccel")})
    return {"stats": stats, "backward": record.losses, "gradients": record.gradients,
            "state": dict(ppo.state_dict()), "optimizer": copy.deepcopy(ppo.optim._optim.state_dict()),
            "ret_rms": [ppo.ret_rms.mean, ppo.ret_rms.var, ppo.ret_rms.count],
            "torch_rng": torch.get_rng_state(), "numpy_rng": np.random.get_state()[1]}, len(fused_calls)


@pytest.mark.parametrize(("continuous", "kwargs"), [
    (False, {}),                                                    # Tianshou's defaults: advantage normalization on
    (False, dict(value_clip=True, dual_clip=3.0, recompute_advantage=True, max_grad_norm=0.5)),
    (True, dict(return_scaling=True, advantage_normalization=False, gae_lambda=0.9)),
])
def test_fused_ppo_update_is_tianshous_bit_for_bit(continuous, kwargs):
    from rlaccel_tianshou import SparseDenseOnPolicyWrapper

    from rlaccel_plugins.loader import load_config

    algorithm = _ppo(continuous, **kwargs)
    buffer = _on_policy_buffer(continuous, algorithm)
    twin = copy.deepcopy(algorithm)
    stock = SparseDenseOnPolicyWrapper(algorithm, config=load_config(preset="classic_control", fused_updates=False))
    fused = SparseDenseOnPolicyWrapper(twin, config=load_config(preset="classic_control", fused_updates=True))
    assert fused.fused and not stock.fused
    (stock_run, _), (fused_run, fused_calls) = _run_on_policy(stock, buffer), _run_on_policy(fused, buffer)
    assert fused_calls == 7
    assert len(stock_run["gradients"]) >= 200  # 600 transitions, minibatches of 64 (the last merged), 4 epochs, 7 updates
    assert differences(stock_run, fused_run) == []


def test_a_wrapper_with_a_fused_update_pickles_and_keeps_it():
    import pickle

    from rlaccel_tianshou import SparseDenseOnPolicyWrapper, SparseDenseWrapper

    for wrapper in (SparseDenseWrapper(_actor_critic("SAC"), preset="classic_control"),
                    SparseDenseOnPolicyWrapper(_ppo(False), preset="classic_control")):
        assert wrapper.fused and pickle.loads(pickle.dumps(wrapper)).fused


def _networks():
    """Tianshou's networks as the examples build them (DQN's Net, a 4-atom Net with softmax, SAC's and
    TD3's actors and critics, PPO's discrete actors and critic)."""
    from tianshou.utils.net.common import Net
    from tianshou.utils.net.continuous import (
        ContinuousActorDeterministic,
        ContinuousActorProbabilistic,
        ContinuousCritic,
    )
    from tianshou.utils.net.discrete import DiscreteActor, DiscreteCritic

    torch.manual_seed(5)
    obs = torch.randn(16, 3)
    act = torch.randn(16, 1)
    return [
        (Net(state_shape=3, action_shape=2, hidden_sizes=[32, 32]), (obs,)),
        (Net(state_shape=3, action_shape=2, hidden_sizes=[8], num_atoms=4, softmax=True), (obs,)),
        (ContinuousCritic(preprocess_net=Net(state_shape=3, action_shape=1, hidden_sizes=[32, 32], concat=True)),
         (obs, act)),
        (ContinuousCritic(preprocess_net=Net(state_shape=3, hidden_sizes=[16]), hidden_sizes=[8],
                          apply_preprocess_net_to_obs_only=True), (obs,)),  # its last MLP reads obs only
        (ContinuousActorDeterministic(preprocess_net=Net(state_shape=3, hidden_sizes=[32]), action_shape=1,
                                      max_action=2.0), (obs,)),
        (ContinuousActorProbabilistic(preprocess_net=Net(state_shape=3, hidden_sizes=[32]), action_shape=1,
                                      max_action=2.0), (obs,)),
        (ContinuousActorProbabilistic(preprocess_net=Net(state_shape=3, hidden_sizes=[32]), action_shape=1,
                                      unbounded=True, conditioned_sigma=True), (obs,)),
        (DiscreteActor(preprocess_net=Net(state_shape=3, hidden_sizes=[32, 32]), action_shape=2), (obs,)),
        (DiscreteActor(preprocess_net=Net(state_shape=3, hidden_sizes=[16]), action_shape=3, hidden_sizes=[8],
                       softmax_output=False), (obs,)),
        (DiscreteCritic(preprocess_net=Net(state_shape=3, hidden_sizes=[32, 32])), (obs,)),
    ]


def _outputs_and_gradients(network, forward, inputs):
    network.zero_grad()
    out = forward(*inputs)
    tensors = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    sum(t.sum() for t in tensors).backward()
    return [t.detach().clone() for t in tensors] + [p.grad.clone() for p in network.parameters()]


@pytest.mark.parametrize("index", range(10))
def test_flat_forwards_are_the_networks_own_ops(index):
    """Tianshou's networks called without their module calls: the same outputs and gradients, bit for
    bit; the module itself wherever a hook must run or a layer is not a plain Linear/ReLU/Tanh."""
    from rlaccel_tianshou.flat_networks import forward_of

    network, inputs = _networks()[index]
    flat = forward_of(network)
    assert flat is not network
    own, lean = _outputs_and_gradients(network, network, inputs), _outputs_and_gradients(network, flat, inputs)
    assert all(torch.equal(a, b) for a, b in zip(own, lean, strict=True))
    handle = network.register_forward_hook(lambda *args: None)
    assert forward_of(network) is network
    handle.remove()
    leaf = next(m for m in network.modules() if isinstance(m, torch.nn.Linear))
    leaf.register_forward_pre_hook(lambda *args: None)
    assert forward_of(network) is network


def test_networks_with_other_layers_keep_their_own_forward():
    from rlaccel_tianshou.flat_networks import forward_of
    from tianshou.utils.net.common import Net

    normed = Net(state_shape=3, action_shape=2, hidden_sizes=[8], norm_layer=torch.nn.LayerNorm)
    dueling = Net(state_shape=3, action_shape=2, hidden_sizes=[8], dueling_param=({"hidden_sizes": [4]},) * 2)
    assert forward_of(normed) is normed and forward_of(dueling) is dueling


def test_a_changed_layer_in_the_flat_forward_breaks_the_equivalence(monkeypatch):
    from rlaccel_plugins.fused import flat

    monkeypatch.setitem(flat.LAYERS, torch.nn.ReLU, lambda m, x: torch.nn.functional.leaky_relu(x, 1e-3))
    stock, fused = _stock_and_fused(_algorithm(), "vector")
    assert differences(stock, fused)


def test_cached_flat_forwards_and_parameter_lists_follow_every_change_to_the_network():
    """What the fused update keeps per network (flat forward, parameter list, mode check) is rebuilt
    when a layer or parameter object is replaced or a forward or backward hook is added."""
    from rlaccel_tianshou.flat_networks import forward_of, is_mode_free, parameters_of
    from tianshou.utils.net.common import Net

    net = Net(state_shape=3, action_shape=2, hidden_sizes=[8])
    obs = torch.randn(4, 3)
    flat, params = forward_of(net), parameters_of(net)
    assert flat is not net and forward_of(net) is flat and parameters_of(net) is params and is_mode_free(net)
    net.model.model[0] = torch.nn.Linear(3, 8)  # a layer replaced
    assert forward_of(net) is not flat and torch.equal(forward_of(net)(obs)[0], net(obs)[0])
    assert parameters_of(net)[0] is net.model.model[0].weight
    net.model.model[2].weight = torch.nn.Parameter(torch.zeros(2, 8))  # a parameter object replaced
    assert parameters_of(net)[2] is net.model.model[2].weight and torch.equal(forward_of(net)(obs)[0], net(obs)[0])
    handle = net.model.model[2].register_full_backward_hook(lambda *args: None)
    assert forward_of(net) is net  # a backward hook runs only through the module's call
    handle.remove()
    assert forward_of(net) is not net
    net.model.model[1] = torch.nn.Dropout()
    assert forward_of(net) is net and not is_mode_free(net)


def test_buffer_reads_are_tianshous():
    """The lean ``sample_indices`` gives Tianshou's indices and leaves every random state (the buffer's
    and each sub-buffer's) as Tianshou's does (``choice``'s draws are what it reimplements);
    ``unfinished_index`` gives Tianshou's indices (empty, ended and running sub-buffers)."""
    from rlaccel_tianshou.buffer_reads import sample_indices, unfinished_index
    from tianshou.data import Batch, ReplayBuffer, VectorReplayBuffer

    rng = np.random.RandomState(0)
    for seed in range(50):  # RandomState.choice's two draws, against numpy's own
        n, k, p = rng.randint(1, 50_000), rng.randint(1, 300), rng.randint(0, 2_000, size=10).astype(float)
        own, lean = np.random.RandomState(seed), np.random.RandomState(seed)
        assert np.array_equal(own.choice(n, k), lean.randint(0, n, size=k))
        p /= p.sum()
        cdf = p.cumsum()
        cdf /= cdf[-1]
        assert np.array_equal(own.choice(10, k, p=p), cdf.searchsorted(lean.random_sample(k), side="right"))
        assert str(own.get_state()) == str(lean.get_state())

    def states(buffer):
        return [str(b._random_state.get_state()) for b in [buffer, *getattr(buffer, "buffers", [])]]

    vector, uneven, single = VectorReplayBuffer(400, 4), VectorReplayBuffer(400, 4), ReplayBuffer(50)
    for t in range(130):
        step = dict(act=[0, 1, 0, 1], rew=[1.0] * 4, terminated=[t % 7 == 0 or t == 127] * 4, truncated=[False] * 4,
                    info={})
        vector.add(Batch(obs=np.full((4, 1), t), obs_next=np.full((4, 1), t + 1), **step))
        if t % 3:  # sub-buffers of different lengths (sub-buffer 0 empty; 1 ends on a done)
            uneven.add(Batch(obs=np.full((2, 1), t), obs_next=np.full((2, 1), t + 1),
                             **{k: v[:2] for k, v in step.items() if k != "info"}, info={}), buffer_ids=[t % 3, 3])
        single.add(Batch(obs=np.full(1, t), obs_next=np.full(1, t + 1), **{k: v[0] for k, v in step.items()
                                                                        if k != "info"}, info={}))
    assert len(uneven.buffers[0]) == 0 and uneven.buffers[1].done[(uneven.buffers[1]._insertion_idx - 1)]
    for buffer in (vector, uneven, single):
        assert np.array_equal(unfinished_index(buffer), buffer.unfinished_index())
        twin = copy.deepcopy(buffer)
        for size in (1, 7, 64, 256, 0, None):
            assert np.array_equal(sample_indices(buffer, size), twin.sample_indices(size))
            assert states(buffer) == states(twin)
