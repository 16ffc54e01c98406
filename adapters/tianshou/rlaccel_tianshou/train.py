"""`rlaccel train --framework tianshou`: a Tianshou DQN agent, stock or with rlaccel (sync or ``--async``).

Stock (``--stock``): the settings of Tianshou's own ``test/discrete/test_dqn.py`` (10 envs, lr 1e-3,
gamma 0.9, n-step 3, target update 320, 0.1 gradient steps per env step, batch 64, 20k buffer,
[128]*4 net), a plain ``VectorReplayBuffer``. Accelerated: the recipe of
``examples/tianshou_dqn_cartpole.py`` with the preset's tiers, batch size, learning rate, env count and
replay ratio (default 0.5 gradient steps per env step), the
tiered buffer, the sparse/dense wrapper and envpool envs when envpool supports the task.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from tianshou.algorithm import DQN
from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.data import Collector, VectorReplayBuffer
from tianshou.trainer import OffPolicyTrainerParams
from tianshou.utils.net.common import Net

from rlaccel_plugins.cadence import EnvStepCadence
from rlaccel_plugins.hardware import resolve_auto
from rlaccel_plugins.metrics import FpsMeter, collect_metrics
from rlaccel_plugins.replay.sizing import tiers_for_capacity
from rlaccel_plugins.tasks import ensure_registered
from rlaccel_plugins.training import EvalClock, Learned, TrainSpec, bytes_per_transition, replay_sampling
from rlaccel_tianshou.buffers import TieredVectorReplayBuffer
from rlaccel_tianshou.checkpointing import Checkpoints, StoppedBySignal
from rlaccel_tianshou.collector import LeanCollector
from rlaccel_tianshou.envs import make_envs
from rlaccel_tianshou.networks import MinAtarQNetwork
from rlaccel_tianshou.wrapper import SparseDenseWrapper

NUM_ENVS = 10  # Tianshou's test_dqn.py; rlaccel uses the preset's parallel_envs


class TianshouTraining:
    """One ``rlaccel train --framework tianshou`` run (the core template's :class:`TrainingRun`): the
    DQN agent, its buffer and collectors are built from the spec, ``learn`` trains it in sync, async
    or Ray mode, ``save`` writes ``algorithm.pt`` and the ``model.json`` that ``rlaccel export`` reads."""

    def __init__(self, spec: TrainSpec) -> None:
        self.spec = spec
        torch.manual_seed(spec.seed)
        np.random.seed(spec.seed)
        ensure_registered(spec.env_id)
        probe = gym.make(spec.env_id)
        self.obs_dim, self.n_actions = int(np.prod(probe.observation_space.shape)), int(probe.action_space.n)
        training, hardware = spec.config.training, resolve_auto(spec.config)
        if spec.own_recipe:
            self.num_envs = NUM_ENVS
            self.hidden = [128] * 4
            self.eps, lr, gamma, target, self.batch, self.ups = 0.1, 1e-3, 0.9, 320, 64, 0.1
            if spec.dropin:  # the README's drop-in: the same size, tiered by the preset
                replay = tiers_for_capacity(spec.config.replay_buffer, 20_000, self.num_envs, preset=spec.config.preset)
                self.buffer = TieredVectorReplayBuffer(20_000, self.num_envs, replay_config=replay)
            else:
                self.buffer = VectorReplayBuffer(20_000, self.num_envs)
        else:
            self.num_envs = hardware.parallel_envs
            self.hidden = [256, 256] if training.net_arch == "auto" else list(training.net_arch)
            self.batch = training.batch_size
            self.ups = 0.5 if training.replay_ratio == "auto" else training.replay_ratio / self.batch
            # the target net is refreshed every 256 env steps whatever the replay ratio (RL Zoo's CartPole
            # DQN refreshes it between training rounds of 256 env steps)
            self.eps, lr, gamma, target = 1.0, training.learning_rate, 0.99, max(1, round(256 * self.ups))
            rb = spec.config.replay_buffer
            self.buffer = TieredVectorReplayBuffer(rb.capacity, self.num_envs, replay_config=rb, random_seed=spec.seed)
        if spec.task.minatar:  # the MinAtar paper's network, whatever the hidden sizes
            net = MinAtarQNetwork(probe.observation_space.shape, self.n_actions)
        else:
            net = Net(state_shape=self.obs_dim, action_shape=self.n_actions, hidden_sizes=self.hidden)
        net = net.to(hardware.device)  # training.device
        self.policy = DiscreteQLearningPolicy(model=net, action_space=probe.action_space, eps_training=self.eps,
                                              eps_inference=0.0)
        n_step = 3 if spec.own_recipe or spec.config.replay_buffer.n_step == "auto" else spec.config.replay_buffer.n_step
        algorithm = DQN(policy=self.policy, optim=AdamOptimizerFactory(lr=lr), gamma=gamma,
                        n_step_return_horizon=n_step, target_update_freq=target)
        self.algorithm = algorithm if spec.stock else SparseDenseWrapper(algorithm, config=spec.config)

    def learn(self, progress, clock: EvalClock) -> Learned:
        spec, algorithm, policy, buffer = self.spec, self.algorithm, self.policy, self.buffer
        batch, ups, num_envs = self.batch, self.ups, self.num_envs
        checkpoints = Checkpoints(spec, algorithm, clock)
        offset = 0  # env steps done before this process's trainer: a resumed run's, then the warm-up's
        if spec.resume:
            buffer, saved = checkpoints.resume()
            self.buffer = buffer
            offset = saved["env_steps"]
            policy.set_eps_training(saved.get("eps_training", self.eps))
        collector_class = Collector if spec.stock else LeanCollector  # LeanCollector: same transitions, leaner
        training_collector = collector_class(algorithm, make_envs(spec.env_id, num_envs, spec.seed + offset,
                                                                  not spec.own_recipe), buffer, exploration_noise=True)
        eval_collector = Collector(algorithm, make_envs(spec.env_id, spec.eval_episodes, spec.seed + 10_000, False))
        training_collector.reset(reset_buffer=not spec.resume)
        if not spec.resume:  # the random warm-up counts toward --steps, and takes at most half of them
            warm_up = max(num_envs, min(batch * num_envs, spec.steps // 2))
            offset += training_collector.collect(n_step=warm_up, random=True).n_collected_steps
        counter = _count_updates(algorithm)
        monitor = _Monitor(spec, progress, algorithm, buffer, every=spec.config.monitoring.log_interval)
        checkpoints.start(buffer, offset)
        run = _Run(spec, monitor, checkpoints, policy, clock, offset, began=saved["env_steps"] if spec.resume else 0)
        ray_metrics = {}
        try:
            if spec.ray is not None:
                env_steps, ray_metrics = _learn_ray(run, buffer, batch, ups, eval_collector)
            elif spec.async_mode:
                env_steps = _learn_async(run, buffer, batch, ups, eval_collector)
            else:
                env_steps = _train_sync(run, algorithm, training_collector, eval_collector, batch, ups)
            checkpoints.finish(env_steps, {"eps_training": policy.eps_training})
        except StoppedBySignal:
            env_steps = checkpoints.last.step
        finally:
            monitor.close()
        updater, guard = getattr(algorithm, "updater", None), getattr(algorithm, "guard", None)
        return Learned(env_steps=env_steps, gradient_steps=counter["updates"],
                       stats={**(updater.stats if updater is not None else {}),
                              **(guard.stats if guard is not None else {}), **ray_metrics},
                       replay_bytes_per_transition=bytes_per_transition(_arrays(buffer._meta), buffer.maxsize),
                       replay_sampling=replay_sampling(buffer, getattr(buffer, "replay_config", None)),
                       checkpoint=str(checkpoints.last.path) if checkpoints.last is not None else None)

    def save(self, out: Path) -> Path:
        torch.save(self.algorithm.state_dict(), out / "algorithm.pt")
        (out / "model.json").write_text(json.dumps({  # what `rlaccel export` needs to rebuild the network
            "algo": self.spec.algo, "env_id": self.spec.env_id, "obs_dim": self.obs_dim,
            "n_actions": self.n_actions, "hidden_sizes": self.hidden}))
        return out / "algorithm.pt"


def _count_updates(algorithm) -> dict[str, int]:
    """Count ``algorithm.update`` calls (one gradient step each for off-policy DQN)."""
    counter = {"updates": 0}
    update = algorithm.update

    def counted(*args, **kwargs):
        counter["updates"] += 1
        return update(*args, **kwargs)

    algorithm.update = counted
    return counter


def _arrays(batch) -> list[np.ndarray]:
    """Every numpy array in a (nested) Tianshou ``Batch``."""
    out = []
    for value in batch.values():
        out.extend(_arrays(value) if hasattr(value, "values") else [value])
    return out


def _epsilon(env_step: int) -> float:
    """The accelerated recipe's exploration: 1.0 down to 0.04 over the first 8k env steps (as RL Zoo's)."""
    return max(0.04, 1.0 - env_step / 8_000)


class _Monitor:
    """The progress line, and TensorBoard logs in ``--logdir``: Tianshou's own (losses, rewards) through
    its ``TensorboardLogger``, plus ``rlaccel/*`` (fps, full/dense updates, level fill and samples)."""

    def __init__(self, spec: TrainSpec, progress, algorithm, buffer, every: int) -> None:
        self.progress, self.algorithm, self.buffer, self.every = progress, algorithm, buffer, every
        self.writer = self.logger = None
        if spec.logdir and spec.config.monitoring.tensorboard:
            from tianshou.utils import TensorboardLogger
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(Path(spec.logdir) / "tensorboard"))
            self.logger = TensorboardLogger(self.writer, write_flush=False)
        self._fps, self._next_write = FpsMeter(), 0

    def _updater(self):
        updater = getattr(self.algorithm, "updater", None)
        return updater if updater is not None and updater.attachments else None

    def report(self, env_step: int) -> None:
        updater = self._updater()
        counts = updater.stats if updater is not None else {}
        self.progress.update(env_step, full=counts.get("full_updates"), dense=counts.get("dense_updates"))
        if self.writer is not None and env_step >= self._next_write:
            self._next_write = env_step + self.every
            replay = self.buffer if hasattr(self.buffer, "stats") else None
            for key, value in collect_metrics(updater, replay, self._fps.read(env_step)).items():
                self.writer.add_scalar(key, value, env_step)

    def scalars(self, values: dict[str, float], env_step: int) -> None:
        """Extra ``rlaccel/*`` scalars (e.g. the Ray metrics) in TensorBoard."""
        if self.writer is not None:
            for key, value in values.items():
                self.writer.add_scalar(f"rlaccel/{key}", value, env_step)

    def evaluated(self, env_step: int, mean_reward: float) -> None:
        self.progress.update(env_step, eval=mean_reward)
        if self.writer is not None:
            self.writer.add_scalar("eval/mean_reward", mean_reward, env_step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _evaluate_fn(spec: TrainSpec, eval_collector):
    def evaluate() -> float:
        eval_collector.reset()
        with torch.no_grad():
            return eval_collector.collect(n_episode=spec.eval_episodes).returns_stat.mean
    return evaluate


class _Run:
    """What the trainer callbacks share: env-step offset of a resumed run, exploration, evaluation
    bookkeeping on our clock, checkpoints."""

    def __init__(self, spec: TrainSpec, monitor: _Monitor, checkpoints: Checkpoints, policy, clock: EvalClock,
                 offset: int, began: int) -> None:
        self.spec, self.monitor, self.checkpoints, self.policy, self.clock = spec, monitor, checkpoints, policy, clock
        self.offset, self.began = offset, began  # ``began``: the env step this process started at
        self.env_step = offset

    def collected(self, env_step: int) -> None:
        """Before each collection step (``env_step`` counts the steps collected since ``offset``)."""
        self.env_step = self.offset + env_step
        if not self.spec.own_recipe:
            self.policy.set_eps_training(_epsilon(self.env_step))
        self.monitor.report(self.env_step)
        self.checkpoints.poll(self.env_step, {"eps_training": self.policy.eps_training})

    def evaluated(self, mean_reward: float) -> bool:
        """After an evaluation: record it; whether the threshold is reached."""
        self.monitor.evaluated(self.env_step, mean_reward)
        return self.spec.threshold is not None and mean_reward >= self.spec.threshold

    @property
    def remaining(self) -> int:
        return max(0, self.spec.steps - self.offset)


def _collection_step(collector, gradient_steps_per_sample: float) -> int:
    """Env steps per collection: one vector step, or as many as one gradient step needs (Tianshou
    rejects a collection that earns zero gradient steps)."""
    num_envs = collector.buffer.buffer_num
    return num_envs * max(1, math.ceil(1 / (gradient_steps_per_sample * num_envs) - 1e-9))


def _train_sync(run: _Run, algorithm, training_collector, eval_collector, batch, ups) -> int:
    """Tianshou's own trainer; its evaluations are taken off our clock through test_fn / stop_fn."""
    spec = run.spec

    def training_fn(epoch: int, env_step: int) -> None:
        run.collected(env_step)
        if run.env_step >= spec.steps:  # --steps is a cap: leave the last epoch early (as SB3's learn does)
            raise _StepsDone

    def test_fn(epoch: int, env_step: int | None) -> None:  # Tianshou evaluates: stop our clock
        if env_step is not None:
            run.env_step = run.offset + env_step
        run.clock.begin_eval()

    def stop_fn(mean_reward: float) -> bool:  # called right after each evaluation
        run.clock.end_eval(run.env_step, mean_reward)
        return run.evaluated(mean_reward)

    epoch = min(spec.eval_freq, run.remaining)  # Tianshou evaluates once per epoch
    if not run.remaining:
        return run.offset
    try:
        algorithm.run_training(OffPolicyTrainerParams(
            training_collector=training_collector, test_collector=eval_collector,
            test_step_num_episodes=spec.eval_episodes, max_epochs=max(1, math.ceil(run.remaining / epoch)),
            epoch_num_steps=epoch, collection_step_num_env_steps=_collection_step(training_collector, ups),
            batch_size=batch, update_step_num_gradient_steps_per_sample=ups, training_fn=training_fn,
            test_fn=test_fn, stop_fn=stop_fn, logger=run.monitor.logger, show_progress=False, verbose=False))
    except _StepsDone:
        pass
    return run.offset + int(training_collector.collect_step)  # the trainer reset the collector's counts


class _StepsDone(Exception):
    """Raised in Tianshou's trainer loop to leave it once ``--steps`` env steps are collected."""


class _ChunkEvaluation:
    """For chunked training (async, Ray): after each stored chunk, the run's schedules and progress, and an
    evaluation (off the clock) every ``eval_freq`` env steps; :attr:`stop` once the threshold is reached."""

    def __init__(self, run: _Run, eval_collector) -> None:
        self.run, self.evaluate = run, _evaluate_fn(run.spec, eval_collector)
        self.cadence = EnvStepCadence(run.spec.eval_freq)
        self.cadence.start(run.began)  # evaluations at the same multiples with or without the warm-up
        self.stop = False

    def __call__(self, env_steps: int, _collected=None) -> None:
        run = self.run
        run.collected(env_steps)
        if self.cadence.due(run.env_step):
            self.stop = run.evaluated(run.clock.evaluate(run.env_step, self.evaluate))


def _learn_async(run: _Run, buffer, batch, ups, eval_collector) -> int:
    """Collection in an actor thread (see :mod:`rlaccel_tianshou.async_learn`)."""
    from rlaccel_tianshou.async_learn import learn_async

    spec, on_chunk = run.spec, _ChunkEvaluation(run, eval_collector)
    envs = make_envs(spec.env_id, buffer.buffer_num, spec.seed + 1 + run.offset, True)
    return run.offset + learn_async(run.monitor.algorithm, envs, buffer, run.remaining, batch_size=batch,
                                    gradient_steps_per_sample=ups, sync_interval=spec.config.training.sync_interval,
                                    on_chunk=on_chunk, should_stop=lambda: on_chunk.stop)


def _learn_ray(run: _Run, buffer, batch, ups, eval_collector) -> tuple[int, dict]:
    """Collection on Ray actors (see :mod:`rlaccel_tianshou.ray_learn`)."""
    from rlaccel_tianshou.ray_learn import learn_ray

    spec, on_chunk = run.spec, _ChunkEvaluation(run, eval_collector)

    def on_metrics(metrics: dict) -> None:
        run.monitor.progress.update(run.env_step, actors=spec.ray["actors"], lag=metrics.get("ray/policy_lag"),
                                    actor_fps=metrics.get("ray/env_steps_per_s"))
        run.monitor.scalars(metrics, run.env_step)

    ray_run = learn_ray(run.monitor.algorithm, spec.env_id, buffer, run.remaining, actors=spec.ray["actors"],
                        chunk_steps=spec.ray["chunk_steps"], max_in_flight=spec.ray["max_in_flight"],
                        batch_size=batch, gradient_steps_per_sample=ups, address=spec.ray["address"],
                        sync_interval=spec.config.training.sync_interval, on_chunk=on_chunk,
                        should_stop=lambda: on_chunk.stop, on_metrics=on_metrics,
                        ordered=spec.ray.get("ordered", False))
    return run.offset + ray_run.stored_steps, ray_run.metrics
