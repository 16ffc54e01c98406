"""`rlaccel train --framework sb3`: build an SB3 agent from RL Zoo settings, with or without rlaccel.

Stock (``--stock``): RL Zoo's hyper-parameters for the task, SB3's own buffer and envs, nothing of
rlaccel. Accelerated: the same settings with the preset's training values applied to off-policy
agents (batch size, learning rate, env count — rlaccel builds this agent, so it may), the tiered
buffer, the sparse/dense callback and envpool when it supports the task. On-policy agents (PPO,
A2C) keep RL Zoo's batch size, learning rate and env count: the presets' values are tuned for
off-policy replay (``classic_control``'s learning rate would break PPO); they get the callback.
Every model gets ``training.device``. With several envs ``train_freq``
(which counts ``env.step`` calls) is divided by the env count, so gradient steps per collected
transition stay RL Zoo's — unless the config sets ``training.replay_ratio`` (samples drawn per env
step), which then sets the gradient steps per update.
"""

from __future__ import annotations

import copy
import inspect
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.callbacks import BaseCallback, CallbackList
from stable_baselines3.common.evaluation import evaluate_policy

from rlaccel_plugins.cadence import EnvStepCadence
from rlaccel_plugins.errors import ConfigError
from rlaccel_plugins.hardware import resolve_auto
from rlaccel_plugins.plugins import get_plugin_manager
from rlaccel_plugins.replay.sizing import tiers_for_capacity
from rlaccel_plugins.tasks import TaskInfo, task_info
from rlaccel_plugins.training import (
    EvalClock,
    Learned,
    TrainSpec,
    bytes_per_transition,
    replay_sampling,
    update_cadence,
)
from rlaccel_sb3.buffers import TieredReplayBuffer
from rlaccel_sb3.callback import AccelerateCallback, SparseDenseCallback
from rlaccel_sb3.envs import make_env
from rlaccel_sb3.extractors import MinAtarCNN


def _linear(start: float):
    return lambda progress: progress * start


# RL Zoo 2.9 hyper-parameters (rl_zoo3/hyperparams/*.yml) for the tasks the demo and bench use (MinAtar: its paper's);
# n_timesteps is kept because exploration schedules are fractions of it
ZOO: dict[tuple[str, str], dict[str, Any]] = {
    ("dqn", "CartPole-v1"): dict(n_timesteps=50_000, learning_rate=2.3e-3, batch_size=64, buffer_size=100_000,
                                 learning_starts=1000, gamma=0.99, target_update_interval=10, train_freq=256,
                                 gradient_steps=128, exploration_fraction=0.16, exploration_final_eps=0.04,
                                 policy_kwargs=dict(net_arch=[256, 256])),
    ("qrdqn", "CartPole-v1"): dict(n_timesteps=50_000, learning_rate=2.3e-3, batch_size=64, buffer_size=100_000,
                                   learning_starts=1000, gamma=0.99, target_update_interval=10, train_freq=256,
                                   gradient_steps=128, exploration_fraction=0.16, exploration_final_eps=0.04,
                                   policy_kwargs=dict(net_arch=[256, 256], n_quantiles=10)),
    ("dqn", "Acrobot-v1"): dict(n_timesteps=100_000, learning_rate=6.3e-4, batch_size=128, buffer_size=50_000,
                                learning_starts=0, gamma=0.99, target_update_interval=250, train_freq=4,
                                gradient_steps=-1, exploration_fraction=0.12, exploration_final_eps=0.1,
                                policy_kwargs=dict(net_arch=[256, 256])),
    ("dqn", "LunarLander-v3"): dict(n_timesteps=100_000, learning_rate=6.3e-4, batch_size=128, buffer_size=50_000,
                                    learning_starts=0, gamma=0.99, target_update_interval=250, train_freq=4,
                                    gradient_steps=-1, exploration_fraction=0.12, exploration_final_eps=0.1,
                                    policy_kwargs=dict(net_arch=[256, 256])),
    ("ppo", "CartPole-v1"): dict(n_timesteps=100_000, n_envs=8, n_steps=32, batch_size=256, gae_lambda=0.8,
                                 gamma=0.98, n_epochs=20, ent_coef=0.0, learning_rate=_linear(1e-3),
                                 clip_range=_linear(0.2)),
    ("sac", "Pendulum-v1"): dict(n_timesteps=20_000, learning_rate=1e-3),
    ("sac", "HalfCheetah-v5"): dict(n_timesteps=1_000_000, learning_starts=10_000),
    ("td3", "Pendulum-v1"): dict(n_timesteps=20_000, gamma=0.98, buffer_size=200_000, learning_starts=10_000,
                                 learning_rate=1e-3, policy_kwargs=dict(net_arch=[400, 300])),
    # the MinAtar paper's DQN (Young & Tian 2019; RL Zoo has no MinAtar entry): its network, RMSprop (squared-gradient
    # momentum 0.95, min squared gradient 0.01: PyTorch's centered RMSprop with eps=0.01), epsilon 1 -> 0.1 over
    # the first 100k frames, 5M frames
    ("dqn", "minatar"): dict(n_timesteps=5_000_000, learning_rate=2.5e-4, batch_size=32, buffer_size=100_000,
                             learning_starts=5_000, gamma=0.99, target_update_interval=1_000, train_freq=1,
                             gradient_steps=1, exploration_fraction=0.02, exploration_final_eps=0.1,
                             policy_kwargs=dict(features_extractor_class=MinAtarCNN, net_arch=[],
                                                optimizer_class=torch.optim.RMSprop,
                                                optimizer_kwargs=dict(alpha=0.95, eps=0.01, centered=True))),
    ("dqn", "atari"): dict(n_timesteps=10_000_000, buffer_size=100_000, learning_rate=1e-4, batch_size=32,
                           learning_starts=100_000, target_update_interval=1000, train_freq=4, gradient_steps=1,
                           exploration_fraction=0.1, exploration_final_eps=0.01, optimize_memory_usage=False),
}


def zoo_settings(algo: str, task: str | TaskInfo) -> dict[str, Any]:
    """RL Zoo's settings for the task, an env id or its :class:`~rlaccel_plugins.tasks.TaskInfo` (its ``atari``
    entry for Atari games; the MinAtar paper's for MinAtar games; SB3's defaults otherwise).

    Examples:
        >>> zoo_settings("dqn", "CartPole-v1")["gradient_steps"]
        128
    """
    info = task if isinstance(task, TaskInfo) else task_info(task)
    return copy.deepcopy(ZOO.get((algo, info.recipe), {}))


def build(spec: TrainSpec):
    """The model and its extra callbacks for ``spec``."""
    cls = get_plugin_manager().adapters.get("sb3").algo_class(spec.algo)
    kwargs = zoo_settings(spec.algo, spec.task)
    zoo_steps = kwargs.pop("n_timesteps", spec.steps)
    n_envs = kwargs.pop("n_envs", 1)
    if "exploration_fraction" in kwargs:  # keep RL Zoo's absolute exploration length whatever the budget
        kwargs["exploration_fraction"] = min(1.0, kwargs["exploration_fraction"] * zoo_steps / spec.steps)
    callbacks: list[BaseCallback] = []
    if spec.config.training.device != "auto":  # training.device, on every model rlaccel builds
        kwargs["device"] = spec.config.training.device  # ("auto": SB3's own choice, as without rlaccel)
    is_off_policy = cls not in (PPO, A2C)
    if not spec.own_recipe:
        training = spec.config.training
        hw = resolve_auto(spec.config)
        if is_off_policy:
            kwargs.update(batch_size=training.batch_size, learning_rate=training.learning_rate)
            old_envs, n_envs = n_envs, hw.parallel_envs
            if isinstance(kwargs.get("train_freq"), int):
                kwargs["train_freq"] = max(1, kwargs["train_freq"] * old_envs // n_envs)
            if training.replay_ratio != "auto":
                kwargs["train_freq"], kwargs["gradient_steps"] = update_cadence(
                    training.replay_ratio, training.batch_size, n_envs, kwargs.get("train_freq", 1))
            rb = spec.config.replay_buffer
            kwargs.update(replay_buffer_class=TieredReplayBuffer,
                          replay_buffer_kwargs=dict(replay_config=rb, seed=spec.seed))
            kwargs["buffer_size"] = rb.capacity
            if rb.n_step != "auto":
                kwargs["n_steps"] = rb.n_step  # handed to the tiered buffer below
        if training.net_arch != "auto" and not spec.task.pixels:  # a recipe's own network
            kwargs["policy_kwargs"] = {**kwargs.get("policy_kwargs", {}), "net_arch": list(training.net_arch)}
    if spec.dropin and is_off_policy:  # the README's drop-in on the framework's own recipe: nothing else changes
        buffer_size = kwargs.get("buffer_size", inspect.signature(cls).parameters["buffer_size"].default)
        replay = tiers_for_capacity(spec.config.replay_buffer, buffer_size, n_envs, preset=spec.config.preset)
        kwargs.update(replay_buffer_class=TieredReplayBuffer, replay_buffer_kwargs=dict(replay_config=replay))
    if not spec.stock:
        callbacks.append(AccelerateCallback(config=spec.config))
    kwargs.update(spec.hyperparams)
    if kwargs.get("replay_buffer_class") is TieredReplayBuffer and kwargs.get("n_steps", 1) > 1:
        # SB3 ignores n_steps with a custom buffer class: hand it to ours, which computes the same returns
        kwargs["replay_buffer_kwargs"].update(n_steps=kwargs.pop("n_steps"), gamma=kwargs.get("gamma", 0.99))
    env = make_env(spec.env_id, n_envs, spec.seed, accelerated=not spec.own_recipe)
    tensorboard = spec.logdir if spec.logdir and spec.config.monitoring.tensorboard else None
    policy = "CnnPolicy" if spec.task.atari else "MlpPolicy"
    model = cls(policy, env, seed=spec.seed, tensorboard_log=tensorboard, verbose=0, **kwargs)
    return model, callbacks


class _EvalAndProgress(BaseCallback):
    """Deterministic evaluation every ``eval_freq`` env steps (off the clock), progress, early stop."""

    def __init__(self, spec: TrainSpec, progress, clock: EvalClock, sparse: SparseDenseCallback | None) -> None:
        super().__init__()
        self.spec, self.progress, self.clock, self.sparse = spec, progress, clock, sparse
        self.eval_env = make_env(spec.env_id, 1, spec.seed + 10_000, accelerated=not spec.own_recipe, evaluation=True)
        self.cadence = EnvStepCadence(spec.eval_freq)

    def _on_training_start(self) -> None:  # a resumed run continues the evaluation cadence
        self.cadence.start(self.num_timesteps)

    def _on_step(self) -> bool:
        steps = self.num_timesteps
        keep_going = steps < self.spec.steps or not self._caps_steps() or self._round_ends()
        if self.n_calls % 32 == 0:
            rewards = [ep["r"] for ep in self.model.ep_info_buffer] if self.model.ep_info_buffer else []
            counts = self.sparse.stats if self.sparse is not None else {}
            self.progress.update(steps, reward=float(np.mean(rewards)) if rewards else None,
                                 full=counts.get("full_updates"), dense=counts.get("dense_updates"))
        if not self.cadence.due(steps):
            return keep_going
        mean = self.clock.evaluate(steps, lambda: evaluate_policy(
            self.model, self.eval_env, n_eval_episodes=self.spec.eval_episodes, deterministic=True)[0])
        self.progress.update(steps, eval=mean)
        if self.logger is not None:
            self.logger.record("eval/mean_reward", mean)
        threshold = self.spec.threshold
        return keep_going and (threshold is None or mean < threshold)

    def _caps_steps(self) -> bool:
        """Whether the run stops at the env steps asked: SB3 collects whole rounds (5,000 asked at 256 env steps a
        round: 5,120), so a round that crosses them stops there, untrained. Ray and async runs count their own."""
        return self.spec.ray is None and not self.spec.async_mode

    def _round_ends(self) -> bool:
        """Whether SB3's collection round ends with this step (its gradient steps follow as SB3 runs them)."""
        from stable_baselines3.common.type_aliases import TrainFrequencyUnit

        frame = self.locals
        if "train_freq" in frame:  # off-policy: SB3's collect_rollouts (or rlaccel's, with the same locals)
            freq = frame["train_freq"]
            return freq.unit == TrainFrequencyUnit.STEP and frame.get("num_collected_steps", 0) >= freq.frequency
        if "n_rollout_steps" in frame:  # on-policy: n_steps counts the steps before this one
            return frame.get("n_steps", 0) + 1 >= frame["n_rollout_steps"]
        return False


def gradient_steps(model) -> int:
    """Optimizer steps so far (SB3's ``_n_updates`` counts epochs for on-policy algorithms)."""
    if isinstance(model, (PPO, A2C)):
        rollout = model.n_steps * model.n_envs
        per_epoch = 1 if isinstance(model, A2C) else -(-rollout // model.batch_size)
        return int(model._n_updates * per_epoch)
    return int(model._n_updates)


def replay_bytes_per_transition(model) -> float | None:
    buffer = getattr(model, "replay_buffer", None)
    if buffer is None:
        return None
    engine = getattr(buffer, "engine", None)
    if engine is not None:
        return engine.nbytes / engine.capacity
    arrays = [v for v in vars(buffer).values()] + [v for d in vars(buffer).values() if isinstance(d, dict)
                                                    for v in d.values()]
    return bytes_per_transition(arrays, buffer.buffer_size * buffer.n_envs)


DISCRETE_ONLY, CONTINUOUS_ONLY = {"dqn", "qrdqn"}, {"sac", "td3", "ddpg"}


def check_algo_fits(algo: str, env_id: str) -> None:
    """Refuse an algorithm that cannot act in the task's action space, before anything is built
    (an unknown ``algo`` is refused by :func:`build`)."""
    if algo not in DISCRETE_ONLY | CONTINUOUS_ONLY:
        return
    space = action_space_of(env_id)
    discrete = isinstance(space, gym.spaces.Discrete)
    if discrete != (algo in DISCRETE_ONLY):
        kind, fits = ("discrete", "dqn, qrdqn, ppo, a2c") if discrete else ("continuous", "sac, td3, ddpg, ppo, a2c")
        raise ConfigError(f"algo must fit the {kind} actions of {env_id} ({space}), got algo={algo!r}. "
                          f"Use one of: {fits}.")


def action_space_of(env_id: str):
    """The action space of ``env_id`` without building a training env."""
    if task_info(env_id).atari:
        return gym.spaces.Discrete(18)  # every Atari game's actions are discrete
    if env_id in gym.registry:
        env = gym.make(env_id)
        try:
            return env.action_space
        finally:
            env.close()
    import envpool

    return envpool.make_spec(env_id).gymnasium_action_space


class Sb3Training:
    """One ``rlaccel train`` run with SB3 (the core template's :class:`TrainingRun`): the model is built
    from the spec, ``learn`` trains it in sync, async or Ray mode, ``save`` writes ``model.zip``.

    With ``spec.logdir``: checkpoints every ``checkpoint.every_steps`` and on SIGTERM/SIGINT;
    ``spec.resume`` continues from the newest valid checkpoint there.
    """

    def __init__(self, spec: TrainSpec) -> None:
        self.spec = spec
        check_algo_fits(spec.algo, spec.env_id)
        self.model, self.callbacks = build(spec)
        self.sparse = next((c for c in self.callbacks if isinstance(c, SparseDenseCallback)), None)

    def learn(self, progress, clock: EvalClock) -> Learned:
        from rlaccel_sb3.checkpointing import CheckpointCallback, Checkpoints

        spec, sparse = self.spec, self.sparse
        checkpoints = Checkpoints(spec, clock, sparse)
        resumed = None
        if spec.resume:
            self.model, resumed = checkpoints.resume(type(self.model), self.model.get_env())
        model = self.model
        evaluation = _EvalAndProgress(spec, progress, clock, sparse)
        callback = CallbackList([*self.callbacks, evaluation, CheckpointCallback(checkpoints)])
        remaining = max(0, spec.steps - model.num_timesteps)
        ray_metrics = {}
        if spec.ray is not None:
            from rlaccel_sb3.ray_learn import learn_ray

            def show(metrics: dict) -> None:
                progress.update(model.num_timesteps, actors=spec.ray["actors"], lag=metrics.get("ray/policy_lag"),
                                actor_fps=metrics.get("ray/env_steps_per_s"))

            ray_metrics = learn_ray(model, remaining, spec.env_id, actors=spec.ray["actors"],
                                    chunk_steps=spec.ray["chunk_steps"], max_in_flight=spec.ray["max_in_flight"],
                                    sync_interval=spec.config.training.sync_interval, callback=callback,
                                    reset_num_timesteps=resumed is None, address=spec.ray["address"],
                                    accelerated=not spec.own_recipe, on_metrics=show,
                                    ordered=spec.ray.get("ordered", False)).metrics
        elif spec.async_mode:
            from rlaccel_sb3.async_learn import learn_async

            learn_async(model, remaining, callback=callback, sync_interval=spec.config.training.sync_interval)
        elif remaining:
            model.learn(remaining, callback=callback, reset_num_timesteps=resumed is None)
        checkpoints.finish(model)  # after a signal the newest checkpoint is already at the last step
        last = checkpoints.last
        buffer = getattr(model, "replay_buffer", None)
        engine = getattr(buffer, "engine", None)  # rlaccel's tiered buffer; SB3's own has none
        return Learned(env_steps=model.num_timesteps, gradient_steps=gradient_steps(model),
                       stats={**(sparse.stats if sparse is not None else {}), **ray_metrics},
                       replay_bytes_per_transition=replay_bytes_per_transition(model),
                       checkpoint=str(last.path) if last is not None else None,
                       replay_sampling=replay_sampling(buffer, engine.config if engine is not None else None))

    def learn_more(self, steps: int) -> tuple[int, int]:
        """Train ``steps`` more env steps with the run's own callbacks and no evaluation (the study's speed
        measure learns in segments); ``(env steps, gradient steps)`` so far."""
        if steps:
            self.model.learn(steps, callback=CallbackList(list(self.callbacks)),
                             reset_num_timesteps=self.model.num_timesteps == 0)
        return self.model.num_timesteps, gradient_steps(self.model)

    def save(self, out: Path) -> Path:
        self.model.save(out / "model.zip")
        return out / "model.zip"
