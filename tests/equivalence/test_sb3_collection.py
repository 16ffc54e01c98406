"""Lean SB3 collection is SB3's own, step by step: the same model and seed through
``learn()`` with SB3's ``collect_rollouts`` (and the ``_sample_action``, ``_store_transition`` and
``_on_step`` it calls) and with the lean ones — every vector step's actions, buffer actions,
observations, rewards, dones and infos as a callback sees them, the names of the locals SB3 hands
callbacks, then the replay buffer, the weights (target networks included), the episode statistics,
the logged values and numpy's and torch's RNG states. Tolerance: none (bit-identical): the same ops
run on the same inputs.
"""

from __future__ import annotations

import copy
import zipfile

import numpy as np
import pytest
import torch

from rlaccel_plugins.fused import differences

pytestmark = pytest.mark.needs("stable_baselines3", "sb3_contrib")

SB3_LOCALS = {"self", "env", "callback", "train_freq", "replay_buffer", "action_noise", "learning_starts",
              "log_interval", "num_collected_steps", "num_collected_episodes", "continue_training", "actions",
              "buffer_actions", "new_obs", "rewards", "dones", "infos"}


def _without_clock(value):
    """Monitor's episode ``t`` and SB3's ``time/*`` are wall-clock readings: left out of the comparison."""
    if isinstance(value, dict):
        return {k: _without_clock(v) for k, v in value.items() if k != "t" and not str(k).startswith("time/")}
    if isinstance(value, (list, tuple)):
        return type(value)(_without_clock(v) for v in value)
    return value


def _recorder():
    from stable_baselines3.common.callbacks import BaseCallback

    class Recorder(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.steps: list[dict] = []
            self.locals_seen: set[str] = set()

        def _on_step(self) -> bool:
            self.locals_seen |= set(self.locals)
            self.steps.append({k: _without_clock(copy.deepcopy(self.locals[k])) for k in
                               ("actions", "buffer_actions", "new_obs", "rewards", "dones", "infos")}
                              | {"num_timesteps": self.num_timesteps})
            return True

    return Recorder()


def _model(algo: str, n_envs: int = 1, device: str = "cpu", **overrides):
    from sb3_contrib import QRDQN
    from stable_baselines3 import DDPG, DQN, SAC, TD3
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.noise import NormalActionNoise

    env_id = "CartPole-v1" if algo in ("DQN", "QRDQN") else "Pendulum-v1"
    env = make_vec_env(env_id, n_envs=n_envs, seed=7)
    kwargs = dict(learning_starts=300, seed=7, device=device, policy_kwargs=dict(net_arch=[32, 32]))
    if algo in ("DQN", "QRDQN"):
        kwargs.update(train_freq=4, target_update_interval=50, exploration_fraction=0.5)
    if algo == "QRDQN":  # 25 quantiles, not the default 200: the same code path, a 64x smaller quantile loss
        kwargs["policy_kwargs"] = dict(net_arch=[32, 32], n_quantiles=25)
    if algo == "TD3":
        kwargs.update(action_noise=NormalActionNoise(np.zeros(1), 0.1 * np.ones(1)))
    cls = {"DQN": DQN, "QRDQN": QRDQN, "SAC": SAC, "TD3": TD3, "DDPG": DDPG}[algo]
    return cls("MlpPolicy", env, **{**kwargs, **overrides})


LEAN = {"_sample_action", "collect_rollouts", "_store_transition", "_on_step"}


def _lazy_features(observation_space, features_dim: int = 16):
    """A features extractor whose layer is created in its first forward (``LazyLinear``)."""
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor

    class LazyFeatures(BaseFeaturesExtractor):
        def __init__(self) -> None:
            super().__init__(observation_space, features_dim)
            self.net = torch.nn.Sequential(torch.nn.LazyLinear(features_dim), torch.nn.ReLU())

        def forward(self, observations: torch.Tensor) -> torch.Tensor:
            return self.net(observations)

    return LazyFeatures()


def _learn(algo: str, lean: bool, steps: int, n_envs: int = 1, device: str = "cpu", expect=LEAN,
           callback=None, log_interval: int = 4, **overrides) -> dict:
    from rlaccel_sb3.overrides import override_method, remove_override
    from rlaccel_sb3.rollouts import lean_off_policy_methods
    from stable_baselines3.common.callbacks import CallbackList

    model = _model(algo, n_envs, device, **overrides)
    if lean:
        methods = lean_off_policy_methods(model)
        assert set(methods) == (expect - {"_on_step"} if algo in ("SAC", "TD3", "DDPG") else expect)
        for name, method in methods.items():
            override_method(model, name, method)
    recorder = _recorder()
    model.learn(steps, callback=CallbackList([recorder, *([callback()] if callback else [])]), log_interval=log_interval)
    if lean:
        for name in methods:
            remove_override(model, name)
    buffer = model.replay_buffer
    return {"steps": recorder.steps, "locals": recorder.locals_seen,
            "buffer": {k: getattr(buffer, k)[: buffer.buffer_size if buffer.full else buffer.pos].copy() for k in
                       ("observations", "next_observations", "actions", "rewards", "dones", "timeouts")
                       if getattr(buffer, k, None) is not None},
            "buffer_position": (getattr(buffer, "pos", None), getattr(buffer, "full", None)),
            "parameters": dict(model.policy.state_dict()), "episodes": _without_clock(list(model.ep_info_buffer)),
            "num_timesteps": model.num_timesteps, "episode_num": model._episode_num,
            "logged": _without_clock(dict(model.logger.name_to_value)),
            "rng": (np.random.get_state()[1].copy(), torch.get_rng_state())}


@pytest.mark.parametrize(("algo", "steps", "n_envs"), [
    ("DQN", 2_000, 1), ("DQN", 2_000, 4), ("QRDQN", 1_000, 1), ("SAC", 600, 1), ("TD3", 600, 2), ("DDPG", 600, 1)])
def test_lean_collection_is_sb3s_collection_step_by_step(algo, steps, n_envs):
    stock, lean = _learn(algo, False, steps, n_envs), _learn(algo, True, steps, n_envs)
    assert len(stock["steps"]) == len(lean["steps"]) == steps // n_envs
    assert stock["locals"] == lean["locals"] and SB3_LOCALS <= lean["locals"]
    assert differences(stock, lean) == []


def _stop_at(n_calls: int):
    from stable_baselines3.common.callbacks import BaseCallback

    class StopAt(BaseCallback):
        def _on_step(self) -> bool:
            return self.n_calls < n_calls

    return lambda: StopAt()


@pytest.mark.parametrize(("algo", "steps", "n_envs", "overrides"), [
    ("DQN", 1_500, 2, dict(tau=0.3, target_update_interval=7)),  # a Polyak update that blends
    ("DQN", 1_500, 1, dict(optimize_memory_usage=True, replay_buffer_kwargs=dict(handle_timeout_termination=False))),
    ("DQN", 1_500, 1, dict(n_steps=3)),  # SB3's NStepReplayBuffer
    ("DQN", 1_500, 2, dict(buffer_size=301, replay_buffer_kwargs=dict(handle_timeout_termination=False))),  # wraps
    ("SAC", 500, 1, dict(buffer_size=170)),  # the ring wraps, timeouts kept
    ("DQN", 1_500, 1, dict(train_freq=(2, "episode"), log_interval=1)),  # episodic rollouts, logs every episode
    ("DQN", 1_500, 1, dict(replay_buffer_class="tiered")),
    ("SAC", 500, 2, dict(train_freq=(3, "step"))),
    # its first greedy action creates the lazy layer's weights: under no_grad, as SB3's, not inference mode;
    # the target update is SB3's own while the target's lazy layer has no weights at install
    ("DQN", 1_500, 1, dict(policy_kwargs=dict(net_arch=[32, 32], features_extractor_class=_lazy_features),
                           expect=LEAN - {"_on_step"})),
])
def test_lean_collection_keeps_sb3s_buffers_cadence_and_target_updates(algo, steps, n_envs, overrides):
    if overrides.get("replay_buffer_class") == "tiered":
        from rlaccel_sb3 import TieredReplayBuffer

        overrides.update(replay_buffer_class=TieredReplayBuffer, replay_buffer_kwargs=dict(preset="classic_control"))
    stock, lean = _learn(algo, False, steps, n_envs, **overrides), _learn(algo, True, steps, n_envs, **overrides)
    assert len(stock["steps"]) == len(lean["steps"]) >= steps // n_envs
    assert differences(stock, lean) == []


def test_lean_collection_stops_where_a_callback_stops_it():
    stock = _learn("DQN", False, 2_000, callback=_stop_at(777))
    lean = _learn("DQN", True, 2_000, callback=_stop_at(777))
    assert len(stock["steps"]) == len(lean["steps"]) == 777 and differences(stock, lean) == []


def test_lean_collection_with_vecnormalize_stores_sb3s_original_observations():
    """VecNormalize: SB3's own _store_transition (the original observations), the rest lean."""
    from stable_baselines3.common.vec_env import VecNormalize

    def learn(lean: bool) -> dict:
        from rlaccel_sb3.overrides import override_method
        from rlaccel_sb3.rollouts import lean_off_policy_methods

        model = _model("SAC")
        model.set_env(VecNormalize(model.get_env(), gamma=model.gamma))
        for name, method in (lean_off_policy_methods(model) if lean else {}).items():
            override_method(model, name, method)
        recorder = _recorder()
        model.learn(500, callback=recorder)
        return {"steps": recorder.steps, "buffer": model.replay_buffer.observations[:500].copy(),
                "parameters": dict(model.policy.state_dict()), "rng": np.random.get_state()[1].copy()}

    assert differences(learn(False), learn(True)) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)")
@pytest.mark.parametrize("algo", ["DQN", "SAC"])
def test_lean_collection_is_sb3s_collection_on_cuda(algo):
    """On a GPU too (SB3's train() on both sides: only collection differs)."""
    stock, lean = _learn(algo, False, 800, device="cuda"), _learn(algo, True, 800, device="cuda")
    assert differences(stock, lean) == []


def test_a_changed_action_breaks_the_equivalence(monkeypatch):
    """The test sees a difference in one greedy action: a lean path that took argmin would fail."""
    from rlaccel_sb3 import collection

    original = collection._policy_predict

    def flipped(model, epsilon_greedy):
        predict = original(model, epsilon_greedy)
        return lambda observation: 1 - predict(observation)

    monkeypatch.setattr(collection, "_policy_predict", flipped)
    assert differences(_learn("DQN", False, 800), _learn("DQN", True, 800))


def test_the_callback_installs_lean_collection_for_learn_only_and_never_saves_it(tmp_path):
    from rlaccel_sb3 import AccelerateCallback
    from stable_baselines3 import DQN, PPO

    model = _model("DQN")
    seen = []

    class Spy(AccelerateCallback):
        def _on_step(self) -> bool:
            if self.n_calls == 500:
                self.model.save(tmp_path / "mid.zip")
            seen.append(self.lean_collection)
            return True

    model.learn(1_000, callback=Spy(preset="classic_control"))
    assert seen and all(seen) and "_sample_action" not in model.__dict__
    with zipfile.ZipFile(tmp_path / "mid.zip") as saved:
        data = saved.read("data").decode()
    assert "_sample_action" not in data and "_excluded_save_params" not in data
    DQN.load(tmp_path / "mid.zip", env=model.get_env()).learn(200)  # SB3's own model again
    off = Spy(preset="classic_control", fused_collection=False)
    model.learn(600, callback=off)
    assert not any(seen[-100:])
    ppo = PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, n_epochs=1)
    on_policy = []

    class PolicySpy(AccelerateCallback):
        def _on_step(self) -> bool:
            on_policy.append(self.lean_collection and "forward" in self.model.policy.__dict__)
            return True

    ppo.learn(128, callback=PolicySpy(preset="classic_control"))  # on-policy: the policy's forward
    assert on_policy and all(on_policy) and "forward" not in ppo.policy.__dict__
    ppo.save(tmp_path / "ppo.zip")
    PPO.load(tmp_path / "ppo.zip", env=ppo.get_env()).learn(64)


def _on_policy_learn(algo: str, lean: bool, steps: int, env_id: str = "CartPole-v1") -> dict:
    from rlaccel_sb3.flat_actor_critic import lean_policy_forward_for
    from rlaccel_sb3.overrides import override_policy_forward, remove_policy_forward
    from stable_baselines3 import A2C, PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    env = make_vec_env(env_id, n_envs=8, seed=3)
    if algo == "PPO":  # RL Zoo's CartPole settings
        model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=4,
                    learning_rate=1e-3, seed=3, device="cpu")
    else:
        model = A2C("MlpPolicy", env, seed=3, device="cpu")
    if lean:
        forward = lean_policy_forward_for(model)
        assert forward is not None
        override_policy_forward(model.policy, forward)
    seen = []

    class Recorder(BaseCallback):
        def _on_step(self) -> bool:
            seen.append({k: copy.deepcopy(self.locals[k]) for k in
                         ("actions", "values", "log_probs", "clipped_actions", "new_obs", "rewards", "dones")})
            return True

    model.learn(steps, callback=Recorder())
    if lean:
        remove_policy_forward(model.policy)
    buffer = model.rollout_buffer
    return {"steps": seen, "parameters": dict(model.policy.state_dict()),
            "buffer": {k: getattr(buffer, k).copy() for k in
                       ("observations", "actions", "rewards", "returns", "values", "log_probs", "advantages")},
            "episodes": _without_clock(list(model.ep_info_buffer)), "num_timesteps": model.num_timesteps,
            "logged": _without_clock(dict(model.logger.name_to_value)),
            "rng": (np.random.get_state()[1].copy(), torch.get_rng_state())}


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_a_changed_draw_breaks_the_on_policy_equivalence(monkeypatch, env_id):
    """A lean forward that took the distribution's mode instead of its draw fails."""
    from rlaccel_sb3 import flat_actor_critic

    original = flat_actor_critic.lean_policy_forward_for

    def greedy_forward(model):
        forward = original(model)
        return lambda obs, deterministic=False: forward(obs, deterministic=True)

    monkeypatch.setattr(flat_actor_critic, "lean_policy_forward_for", greedy_forward)
    assert differences(_on_policy_learn("PPO", False, 512, env_id), _on_policy_learn("PPO", True, 512, env_id))


@pytest.mark.parametrize(("algo", "env_id"), [("PPO", "CartPole-v1"), ("A2C", "CartPole-v1"), ("PPO", "Pendulum-v1"),
                                              ("A2C", "Pendulum-v1")])
def test_lean_on_policy_collection_is_sb3s_step_by_step(algo, env_id):
    """PPO/A2C, Discrete and Box actions: every vector step's actions, values, log-probabilities,
    observations, rewards and dones, the rollout buffer (returns, advantages), weights after training on
    it, and the RNG: bit-identical."""
    stock, lean = _on_policy_learn(algo, False, 2_048, env_id), _on_policy_learn(algo, True, 2_048, env_id)
    assert len(stock["steps"]) == len(lean["steps"]) >= 2_048 // 8
    assert differences(stock, lean) == []


def test_a_changed_transition_or_target_update_breaks_the_equivalence(monkeypatch):
    """The test sees a stored terminal observation left unreplaced, and a target update that copies
    instead of blending: lean pieces that did either would fail."""
    from rlaccel_sb3 import rollouts

    original_store, original_on_step = rollouts._lean_store_transition, rollouts._lean_target_update_on_step

    def without_terminal_observations(model):
        store = original_store(model)
        return lambda buffer, action, new_obs, reward, dones, infos: store(
            buffer, action, new_obs, reward, dones, [{k: v for k, v in i.items() if k != "terminal_observation"}
                                                     for i in infos])

    monkeypatch.setattr(rollouts, "_lean_store_transition", without_terminal_observations)
    assert differences(_learn("DQN", False, 800), _learn("DQN", True, 800))
    monkeypatch.setattr(rollouts, "_lean_store_transition", original_store)

    def copying_target_update(model):
        model.tau = 1.0  # what the lean update reads; SB3's reads 0.3
        return original_on_step(model)

    monkeypatch.setattr(rollouts, "_lean_target_update_on_step", copying_target_update)
    assert differences(_learn("DQN", False, 800, tau=0.3), _learn("DQN", True, 800, tau=0.3))


@pytest.mark.parametrize("algo", ["DQN", "QRDQN", "SAC", "TD3", "PPO", "A2C"])
def test_the_flat_training_mode_switch_sets_sb3s_flags(algo):
    """``set_training_mode(policy, mode)`` leaves every module's ``training`` flag where SB3's own
    ``policy.set_training_mode(mode)`` does (target networks stay in eval mode), from a mixed start;
    a policy or module with its own switch gets it run."""
    import sb3_contrib
    import stable_baselines3
    from rlaccel_sb3.training_mode import set_training_mode

    module = sb3_contrib if algo == "QRDQN" else stable_baselines3
    env = "Pendulum-v1" if algo in ("SAC", "TD3") else "CartPole-v1"
    policy = getattr(module, algo)("MlpPolicy", env, seed=0).policy
    for i, m in enumerate(policy.modules()):  # a mixed start: every third module in train mode
        m.training = i % 3 == 0
    twin = copy.deepcopy(policy)
    for mode in (True, False, True):
        policy.set_training_mode(mode)
        set_training_mode(twin, mode)
        assert [m.training for m in policy.modules()] == [m.training for m in twin.modules()]
    assert any(m.training for m in twin.modules()) and not all(m.training for m in twin.modules()) \
        or algo in ("PPO", "A2C")  # off-policy targets stay in eval mode

    calls = []
    twin.set_training_mode = lambda mode: calls.append(mode)  # the instance's own switch runs
    set_training_mode(twin, False)
    assert calls == [False]
    del twin.set_training_mode

    class OwnSwitch(torch.nn.Linear):
        def train(self, mode=True):
            calls.append(("own", mode))
            return super().train(mode)

    twin.extra = OwnSwitch(1, 1) if algo in ("PPO", "A2C") else None
    if twin.extra is None:
        subtree = twin.critic if algo in ("SAC", "TD3") else getattr(twin, "q_net", None) or twin.quantile_net
        subtree.extra = OwnSwitch(1, 1)
    set_training_mode(twin, True)
    assert ("own", True) in calls
