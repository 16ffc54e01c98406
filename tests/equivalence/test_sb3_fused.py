"""Fused SB3 updates are SB3's own, step by step: the same model, seed and buffer
contents through the stock and the fused ``train()`` for 200 gradient steps — every step's loss and
gradients, then parameters, optimizer state, the logged loss and every RNG compared.

Tolerance: none — on this CPU the fused path is bit-identical to SB3's (the multi-tensor Adam and
clipping compute the same arithmetic; one batched target forward gives the same rows as k separate
ones). With importance weights it is not: SB3's path scales output gradients through a hook, the
fused loss weights per sample, and float addition in another order differs by ~1 ulp, so that case
is compared at rtol=1e-5 (a one-line change to the loss breaks even that: see the mutation test).
"""

from __future__ import annotations

import copy
import pickle
import zipfile

import numpy as np
import pytest
import torch

from rlaccel_plugins.fused import UpdateRecorder, differences

pytestmark = pytest.mark.needs("stable_baselines3", "sb3_contrib")

STEPS, CALLS = 8, 25  # 25 train() calls of 8 gradient steps: 200 steps


def _filled(algo: str, buffer: str, seed: int = 3, device: str = "cpu"):
    """A model whose buffer holds 1,500 transitions and which has not trained yet."""
    from rlaccel_sb3 import TieredReplayBuffer
    from sb3_contrib import QRDQN
    from stable_baselines3 import DDPG, DQN, SAC, TD3
    from stable_baselines3.common.buffers import NStepReplayBuffer

    tiers = dict(level_capacity=[500, 1500], sampling_ratio=[0.6, 0.4])
    kwargs = {"ReplayBuffer": {}, "Wrapped": dict(buffer_size=1_000),  # the ring has wrapped: SB3's `full` draws
              "OptimizeMemory": dict(buffer_size=1_000, optimize_memory_usage=True,
                                     replay_buffer_kwargs=dict(handle_timeout_termination=False)),
              "NStep": dict(replay_buffer_class=NStepReplayBuffer,
                                                 replay_buffer_kwargs=dict(n_steps=3)),
              "Tiered": dict(replay_buffer_class=TieredReplayBuffer, replay_buffer_kwargs=tiers),
              "TieredWeighted": dict(replay_buffer_class=TieredReplayBuffer,
                                     replay_buffer_kwargs=dict(tiers, importance_beta=0.5))}[buffer]
    cls = {"DQN": DQN, "QRDQN": QRDQN, "SAC": SAC, "TD3": TD3, "DDPG": DDPG}[algo]
    env = "CartPole-v1" if algo in ("DQN", "QRDQN") else "Pendulum-v1"
    policy_kwargs = dict(net_arch=[64, 64])
    if algo == "QRDQN":  # 25 quantiles, not the default 200: the same code path, a 64x smaller quantile loss
        policy_kwargs["n_quantiles"] = 25
    model = cls("MlpPolicy", env, learning_starts=10_000, seed=seed, policy_kwargs=policy_kwargs, device=device,
                **kwargs)
    model.learn(1_500)
    return model


def _rng() -> dict:
    return {"numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def _optimizers(model) -> list[torch.optim.Optimizer]:
    if hasattr(model, "actor"):
        extra = [model.ent_coef_optimizer] if getattr(model, "ent_coef_optimizer", None) is not None else []
        return [model.actor.optimizer, model.critic.optimizer, *extra]
    return [model.policy.optimizer]


def _run(model, train, weights_hook: bool = False):
    """200 gradient steps through ``train``; what they did and where they left the model."""
    from rlaccel_sb3.networks import critic_networks
    from rlaccel_sb3.weights import ImportanceWeightHook

    hook = ImportanceWeightHook(model.replay_buffer, critic_networks(model)) if weights_hook else None
    np.random.seed(11)
    torch.manual_seed(11)
    logged = []
    with UpdateRecorder(_optimizers(model)) as record:
        for _ in range(CALLS):
            train(STEPS, 32)
            logged.append({k: v for k, v in model.logger.name_to_value.items() if k.startswith("train/")})
    if hook is not None:
        hook.remove()
    sampler = getattr(getattr(model.replay_buffer, "engine", None), "sampler", None)
    return {"losses": record.losses, "gradients": record.gradients,
            "parameters": dict(model.policy.state_dict()),
            "log_ent_coef": getattr(model, "log_ent_coef", None),
            "optimizers": [copy.deepcopy(o.state_dict()) for o in _optimizers(model)],
            "logged": logged, "n_updates": model._n_updates, "rng": _rng(),
            "sampler_rng": pickle.dumps(sampler.rng.bit_generator.state) if sampler is not None else None}


def _stock_and_fused(algo: str, buffer: str):
    from rlaccel_sb3.fused import fused_train_for

    weighted = buffer == "TieredWeighted"
    stock, fused = _filled(algo, buffer), _filled(algo, buffer)
    assert not differences(dict(stock.policy.state_dict()), dict(fused.policy.state_dict()))
    return _run(stock, stock.train, weights_hook=weighted), _run(fused, fused_train_for(fused))


@pytest.mark.parametrize(("algo", "buffer"), [
    ("DQN", "ReplayBuffer"), ("DQN", "Wrapped"), ("DQN", "OptimizeMemory"), ("DQN", "NStep"), ("DQN", "Tiered"), ("QRDQN", "ReplayBuffer"), ("QRDQN", "Tiered"),
    ("SAC", "ReplayBuffer"), ("SAC", "Tiered"), ("TD3", "ReplayBuffer"), ("TD3", "NStep"), ("DDPG", "Tiered")])
def test_fused_train_is_sb3s_train_bit_for_bit(algo, buffer):
    stock, fused = _stock_and_fused(algo, buffer)
    assert len(stock["gradients"]) == len(fused["gradients"]) > CALLS * STEPS * 0.9
    assert differences(stock, fused) == []


def test_the_flat_actors_and_critics_are_sb3s_networks_bit_for_bit():
    """SAC's squashed-Gaussian actor, TD3's actor and the critics as flat functions: the same outputs,
    random draws and gradients as SB3's modules; the modules themselves where a hook is registered or
    the network is not an MLP on a 1-D Box (gSDE)."""
    from rlaccel_sb3 import flat_actor_critic as flat
    from stable_baselines3 import SAC, TD3

    sac, td3 = (cls("MlpPolicy", "Pendulum-v1", seed=0, policy_kwargs=dict(net_arch=[16, 16])) for cls in (SAC, TD3))
    obs, act = torch.randn(5, 3), torch.rand(5, 1) * 2 - 1
    cases = [(flat.action_log_prob(sac.actor), sac.actor.action_log_prob, (obs,), sac.actor),
             (flat.critic_forward(sac.critic), sac.critic, (obs, act), sac.critic),
             (flat.critic_q1(td3.critic), td3.critic.q1_forward, (obs, act), td3.critic),
             (flat.actor_forward(td3.actor), td3.actor, (obs,), td3.actor)]
    for lean, own, inputs, network in cases:
        assert lean is not own
        results = []
        for function in (own, lean):
            network.zero_grad()
            torch.manual_seed(4)
            out = function(*inputs)
            torch.stack([o.sum() for o in (out if isinstance(out, tuple) else (out,))]).sum().backward()
            results.append((out, [None if p.grad is None else p.grad.clone() for p in network.parameters()],
                            torch.get_rng_state()))
        assert differences(results[0], results[1]) == []
    handle = sac.actor.mu.register_forward_hook(lambda *args: None)
    assert flat.action_log_prob(sac.actor) == sac.actor.action_log_prob  # the module's call runs the hook
    handle.remove()
    assert flat.action_log_prob(sac.actor) != sac.actor.action_log_prob
    sde = SAC("MlpPolicy", "Pendulum-v1", seed=0, use_sde=True)
    assert flat.action_log_prob(sde.actor) == sde.actor.action_log_prob


@pytest.mark.parametrize("algo", ["SAC", "TD3"])
def test_a_changed_flat_actor_breaks_the_fused_actor_critic_equivalence(monkeypatch, algo):
    """The bit-for-bit tests run the flat networks; SAC's log-probability 0.01% off, or TD3's actions,
    make the same comparison fail."""
    from rlaccel_sb3 import flat_actor_critic as flat

    name = "_action_log_prob" if algo == "SAC" else "_actor_forward"
    original = getattr(flat, name)

    def changed(actor):
        function = original(actor)

        def off(obs):
            out = function(obs)
            return (out[0], out[1] * 1.0001) if algo == "SAC" else out * 1.0001
        return off

    monkeypatch.setattr(flat, name, changed)
    assert differences(*_stock_and_fused(algo, "ReplayBuffer"))


@pytest.mark.parametrize("algo", ["DQN", "SAC", "TD3"])
def test_fused_train_with_importance_weights_matches_sb3_with_its_weight_hook(algo):
    stock, fused = _stock_and_fused(algo, "TieredWeighted")
    assert len(fused["gradients"]) > CALLS * STEPS * 0.9
    # SB3 backpropagates the plain loss (its hook weights the gradients), the fused path the weighted one:
    # the backward()'d scalars differ by design, the gradients and everything after them must not
    del stock["losses"], fused["losses"]
    assert differences(stock, fused, rtol=1e-5, atol=1e-7) == []


def test_a_one_line_change_to_the_loss_breaks_the_equivalence(monkeypatch):
    import torch.nn.functional as F
    from rlaccel_sb3.fused import value_based

    def huber_with_beta_0_99(model, q_net, observations, actions, target, weights, batch_size):  # one changed argument
        current = torch.gather(q_net(observations), dim=1, index=actions.long())
        loss = F.smooth_l1_loss(current, target, beta=0.99)
        return loss, loss

    monkeypatch.setattr(value_based, "_dqn_loss", huber_with_beta_0_99)
    stock, fused = _stock_and_fused("DQN", "TieredWeighted")
    assert differences(stock["gradients"], fused["gradients"], rtol=1e-5, atol=1e-7)
    stock, fused = _stock_and_fused("DQN", "ReplayBuffer")
    assert differences(stock["losses"], fused["losses"])


# training.fused_optimizer: PyTorch's single-kernel Adam rounds differently from the multi-tensor one, so
# the runs drift apart by float noise; 200 steps stay within this tolerance, and a one-line loss change does not
FUSED_OPTIMIZER_TOLERANCE = dict(rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("algo", ["DQN", "SAC", "TD3"])
def test_the_fused_optimizer_agrees_with_sb3s_train_within_its_tolerance(algo):
    from rlaccel_sb3.fused import fused_train_for

    stock, fused = _filled(algo, "ReplayBuffer"), _filled(algo, "ReplayBuffer")
    train = fused_train_for(fused, fused_optimizer=True)
    stock_run, fused_run = _run(stock, stock.train), _run(fused, train)
    assert differences(stock_run, fused_run)  # the single-kernel step ran: not bit-identical
    assert differences(stock_run, fused_run, **FUSED_OPTIMIZER_TOLERANCE) == []
    groups = [g for o in _optimizers(fused) for g in o.param_groups]
    assert all(not g.get("fused") and g.get("foreach") is None for g in groups)  # put back after each call


def test_the_fused_optimizer_agrees_with_sb3s_ppo_and_a_one_line_loss_change_breaks_it(monkeypatch):
    import torch.nn.functional as F
    from rlaccel_sb3 import fused as fused_package
    from rlaccel_sb3.fused import value_based

    kwargs = dict(n_steps=128, batch_size=32, n_epochs=4, ent_coef=0.01)
    monkeypatch.setattr(fused_package, "fused_train_for",
                        lambda model, real=fused_package.fused_train_for: real(model, fused_optimizer=True))
    stock, fused = _on_policy_run("PPO", False, 13, **dict(kwargs)), _on_policy_run("PPO", True, 13, **dict(kwargs))
    assert differences(stock, fused) and differences(stock, fused, **FUSED_OPTIMIZER_TOLERANCE) == []

    def huber_with_beta_0_99(model, q_net, observations, actions, target, weights, batch_size):
        current = torch.gather(q_net(observations), dim=1, index=actions.long())
        loss = F.smooth_l1_loss(current, target, beta=0.99)
        return loss, loss

    monkeypatch.setattr(value_based, "_dqn_loss", huber_with_beta_0_99)
    stock, fused = _filled("DQN", "ReplayBuffer"), _filled("DQN", "ReplayBuffer")
    mutated = _run(fused, fused_package.fused_train_for(fused))
    assert differences(_run(stock, stock.train)["losses"], mutated["losses"], **FUSED_OPTIMIZER_TOLERANCE)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])  # bf16: the autocast wrapper around the fused train
def test_the_callback_installs_the_fused_train_for_learn_only_and_never_saves_it(tmp_path, dtype):
    from rlaccel_sb3 import AccelerateCallback
    from stable_baselines3 import DQN

    from rlaccel_plugins.loader import load_config

    model = DQN("MlpPolicy", "CartPole-v1", learning_starts=100, train_freq=4, gradient_steps=2, seed=0)
    callback = AccelerateCallback(config=load_config(preset="classic_control", dtype=dtype))
    seen = []

    class Probe(AccelerateCallback):
        def _on_rollout_end(self) -> None:
            seen.append((callback.fused, "train" in self.model.__dict__))
            model.save(tmp_path / "during.zip")  # a save mid-learn (RL Zoo's checkpoints) stays SB3's own

    model.learn(400, callback=[callback, Probe(preset="classic_control", sparse=False)])
    assert seen and all(fused for fused, _ in seen)
    assert "train" not in model.__dict__ and "_excluded_save_params" not in model.__dict__
    with zipfile.ZipFile(tmp_path / "during.zip") as archive:
        data = archive.read("data").decode()
    assert '"train"' not in data and "_excluded_save_params" not in data
    DQN.load(tmp_path / "during.zip", env=model.get_env()).learn(50)  # loads and trains as a plain SB3 model


@pytest.mark.parametrize("algo", ["DQN", "SAC"])
def test_the_drop_in_trains_a_lazy_layer_as_sb3_does_bit_for_bit(algo):
    """A features extractor whose ``LazyLinear`` makes its weights in its first forward (the actor's in the
    first action, the critics' and the target networks' in the first ``train()``): ``learn()`` with the
    callback's fused ``train()`` and lean collection ends with SB3's weights, optimizer states, counters
    and random states."""
    from rlaccel_sb3 import AccelerateCallback
    from stable_baselines3 import DQN, SAC
    from stable_baselines3.common.callbacks import BaseCallback

    from tests.equivalence.test_sb3_collection import _lazy_features

    cls, env = {"DQN": (DQN, "CartPole-v1"), "SAC": (SAC, "Pendulum-v1")}[algo]

    def learn(callback):
        model = cls("MlpPolicy", env, learning_starts=50, train_freq=4, gradient_steps=2, batch_size=32, seed=0,
                    policy_kwargs=dict(net_arch=[32, 32], features_extractor_class=_lazy_features))
        model.learn(300, callback=callback)
        return model, {"parameters": dict(model.policy.state_dict()), "n_updates": model._n_updates, "rng": _rng(),
                       "optimizers": [copy.deepcopy(o.state_dict()) for o in _optimizers(model)]}

    seen = []

    class Probe(BaseCallback):
        def _on_step(self) -> bool:
            return True

        def _on_rollout_end(self) -> None:
            seen.append({"train", "collect_rollouts"} <= set(self.model.__dict__))

    _, stock = learn(None)
    model, dropin = learn([AccelerateCallback(sparse=False), Probe()])
    assert seen and all(seen)  # the fused train() and the lean loop ran the whole learn()
    assert not any(torch.nn.parameter.is_lazy(p) for p in model.policy.parameters())
    assert differences(stock, dropin) == []


def test_the_callback_steps_with_the_fused_optimizer_only_inside_train_and_never_saves_it(tmp_path):
    from rlaccel_sb3 import AccelerateCallback
    from stable_baselines3 import DQN

    model = DQN("MlpPolicy", "CartPole-v1", learning_starts=100, train_freq=4, gradient_steps=2, seed=0)
    optimizer, during = model.policy.optimizer, []
    optimizer.register_step_pre_hook(lambda opt, *_: during.append(opt.param_groups[0]["fused"]))
    model.learn(300, callback=AccelerateCallback(preset="classic_control", fused_optimizer=True, sparse=False))
    assert during and all(during)  # every step of the fused train() ran the single kernel
    assert not optimizer.param_groups[0]["fused"] and optimizer.param_groups[0]["foreach"] is None
    model.save(tmp_path / "after.zip")
    loaded = DQN.load(tmp_path / "after.zip")
    assert not loaded.policy.optimizer.param_groups[0]["fused"]  # the user's optimizer as they made it


def test_fused_updates_setting(caplog):
    from rlaccel_sb3 import AccelerateCallback
    from stable_baselines3 import DQN

    from rlaccel_plugins.errors import ConfigError

    class MyDQN(DQN):  # a subclass that overrides train() may change the math: never fused
        def train(self, gradient_steps: int, batch_size: int = 100) -> None:
            super().train(gradient_steps, batch_size)

    model = DQN("MlpPolicy", "CartPole-v1", learning_starts=50, seed=0)
    off = AccelerateCallback(preset="classic_control", fused_updates=False)
    model.learn(100, callback=off)
    assert not off.fused
    mine = MyDQN("MlpPolicy", "CartPole-v1", learning_starts=50, seed=0)
    auto = AccelerateCallback(preset="classic_control")
    with caplog.at_level("INFO", logger="rlaccel"):
        mine.learn(100, callback=auto)  # auto: SB3's own, said once
    assert not auto.fused and "no fused update for MyDQN" in caplog.text
    with pytest.raises(ConfigError, match="fused_updates=true needs a fused update .* got MyDQN"):
        mine.learn(100, callback=AccelerateCallback(preset="classic_control", fused_updates=True))


def _on_policy_run(algo: str, fused: bool, cycles: int, **kwargs):
    """``cycles`` rounds of SB3's own collection then ``train()`` (stock or fused) from the same seed."""
    from rlaccel_sb3.fused import fused_train_for
    from stable_baselines3 import A2C, PPO

    cls = {"PPO": PPO, "A2C": A2C}[algo]
    env = kwargs.pop("env", "CartPole-v1")
    model = cls("MlpPolicy", env, seed=3, policy_kwargs=dict(net_arch=[64, 64]), **kwargs)
    train = fused_train_for(model) if fused else model.train
    _, callback = model._setup_learn(total_timesteps=10**7, callback=None)
    callback.on_training_start(locals(), globals())
    logged = []
    with UpdateRecorder([model.policy.optimizer]) as record:
        for _ in range(cycles):
            model.collect_rollouts(model.env, callback, model.rollout_buffer, n_rollout_steps=model.n_steps)
            train()
            logged.append({k: v for k, v in model.logger.name_to_value.items() if k.startswith("train/")})
    assert "evaluate_actions" not in model.policy.__dict__  # the lean one is the fused train()'s, for its call
    return {"losses": record.losses, "gradients": record.gradients, "parameters": dict(model.policy.state_dict()),
            "optimizer": copy.deepcopy(model.policy.optimizer.state_dict()), "logged": logged,
            "n_updates": model._n_updates, "rng": _rng()}


@pytest.mark.parametrize(("algo", "cycles", "kwargs"), [
    ("PPO", 13, dict(n_steps=128, batch_size=32, n_epochs=4, ent_coef=0.01)),         # 208 minibatch steps
    ("PPO", 13, dict(n_steps=128, batch_size=32, n_epochs=4, target_kl=0.002, clip_range_vf=0.2)),  # early stops
    ("PPO", 7, dict(env="Pendulum-v1", n_steps=256, batch_size=64, n_epochs=8, ent_coef=0.01)),  # Gaussian, log_std
    ("A2C", 200, dict(n_steps=8, ent_coef=0.01)),
    ("A2C", 120, dict(env="Pendulum-v1", n_steps=8, normalize_advantage=True)),  # Gaussian, log_std, normalised
])
def test_fused_on_policy_train_is_sb3s_train_bit_for_bit(algo, cycles, kwargs):
    stock = _on_policy_run(algo, False, cycles, **dict(kwargs))
    fused = _on_policy_run(algo, True, cycles, **dict(kwargs))
    assert len(stock["gradients"]) > 100
    assert differences(stock, fused) == []


def test_the_lean_evaluate_actions_is_kept_while_the_policy_stays_and_a_users_own_wins():
    from rlaccel_sb3.flat_actor_critic import evaluate_actions_of
    from stable_baselines3 import A2C

    model = A2C("MlpPolicy", "CartPole-v1", seed=3)
    lean = evaluate_actions_of(model)
    assert lean is evaluate_actions_of(model) and lean != model.policy.evaluate_actions
    hook = model.policy.value_net.register_forward_hook(lambda *args: None)  # a hook: the modules' own calls
    assert evaluate_actions_of(model) == model.policy.evaluate_actions
    hook.remove()
    model.policy.value_net = torch.nn.Linear(64, 1)  # a changed tree: built again
    rebuilt = evaluate_actions_of(model)
    assert rebuilt is not lean and rebuilt != model.policy.evaluate_actions
    model.policy.evaluate_actions = own = lambda obs, actions: None
    assert evaluate_actions_of(model) is own


@pytest.mark.parametrize(("algo", "env"), [("PPO", "CartPole-v1"), ("PPO", "Pendulum-v1"), ("A2C", "CartPole-v1")])
def test_the_fused_on_policy_update_evaluates_actions_without_module_calls_and_a_changed_entropy_breaks_it(
        monkeypatch, algo, env):
    """The bit-for-bit test above runs the lean ``evaluate_actions`` (checked here, so a silent fallback to
    SB3's would fail); an entropy 0.01% off makes the same comparison fail."""
    from rlaccel_sb3 import flat_actor_critic
    from stable_baselines3 import A2C, PPO

    model = {"PPO": PPO, "A2C": A2C}[algo]("MlpPolicy", env, seed=3, policy_kwargs=dict(net_arch=[64, 64]))
    assert flat_actor_critic.lean_evaluate_actions_for(model) is not None
    original = flat_actor_critic.lean_evaluate_actions_for

    def entropy_off(model):
        evaluate = original(model)

        def evaluate_actions(obs, actions):
            values, log_prob, entropy = evaluate(obs, actions)
            return values, log_prob, entropy * 1.0001
        return evaluate_actions

    monkeypatch.setattr(flat_actor_critic, "lean_evaluate_actions_for", entropy_off)
    kwargs = dict(env=env, n_steps=128, batch_size=32, n_epochs=2) if algo == "PPO" else dict(n_steps=8)
    kwargs["ent_coef"] = 0.01
    assert differences(_on_policy_run(algo, False, 3, **dict(kwargs)), _on_policy_run(algo, True, 3, **dict(kwargs)))
