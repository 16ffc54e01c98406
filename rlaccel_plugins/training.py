"""What `rlaccel train` and `rlaccel demo` run: a framework-neutral spec, result and evaluation clock.

Adapters implement ``run(spec, progress) -> TrainResult`` (registered as ``AdapterSpec.train``); the
core never imports a framework. Time-to-threshold follows DESIGN.md §8: training wall time with the
evaluation time excluded, until a deterministic 10-episode evaluation reaches the task's threshold.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlaccel_plugins.config import AccelConfig

THRESHOLDS = {"CartPole-v1": 475.0, "Acrobot-v1": -100.0, "LunarLander-v3": 200.0, "Pendulum-v1": -200.0,
              "Pong-v5": 18.0, "PongNoFrameskip-v4": 18.0}


@dataclass
class TrainSpec:
    """One training run, as the command line describes it."""

    framework: str
    algo: str
    env_id: str
    config: AccelConfig
    steps: int = 100_000
    seed: int = 0
    logdir: str | None = None
    stock: bool = False               # the framework's own settings, no rlaccel at all
    eval_freq: int = 2_000            # env steps between evaluations
    eval_episodes: int = 10
    stop_at: float | None = None      # stop when the evaluation mean reaches this (default: the task's threshold)
    wandb: bool = False
    progress: bool = True
    hyperparams: dict[str, Any] = field(default_factory=dict)  # the framework's own, applied last
    async_mode: bool = False          # collect in an actor thread while the learner trains

    @property
    def threshold(self) -> float | None:
        return self.stop_at if self.stop_at is not None else THRESHOLDS.get(self.env_id)

    @property
    def variant(self) -> str:
        return "stock" if self.stock else f"rlaccel[{self.config.preset}]"


@dataclass
class EvalPoint:
    env_steps: int
    train_seconds: float   # wall time spent training so far, evaluations excluded
    mean_reward: float


@dataclass
class TrainResult:
    spec: dict[str, Any]
    curve: list[EvalPoint] = field(default_factory=list)
    env_steps: int = 0
    train_seconds: float = 0.0
    model_path: str | None = None
    stats: dict[str, float] = field(default_factory=dict)
    gradient_steps: int = 0                          # optimizer steps on the main network
    replay_bytes_per_transition: float | None = None  # replay memory / capacity (None: no replay buffer)

    def time_to_threshold(self, threshold: float | None) -> tuple[float | None, int | None]:
        """``(train seconds, env steps)`` at the first evaluation reaching ``threshold``; None if never."""
        for point in self.curve:
            if threshold is not None and point.mean_reward >= threshold:
                return point.train_seconds, point.env_steps
        return None, None

    @property
    def final_eval(self) -> float | None:
        return self.curve[-1].mean_reward if self.curve else None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2, default=str))


class EvalClock:
    """Training wall time with evaluations cut out, and the evaluation curve."""

    def __init__(self) -> None:
        self._start = time.perf_counter()
        self._excluded = 0.0
        self.curve: list[EvalPoint] = []

    def train_seconds(self) -> float:
        return time.perf_counter() - self._start - self._excluded

    def evaluate(self, env_steps: int, evaluate_fn) -> float:
        """Run ``evaluate_fn() -> mean reward`` off the clock and record the point."""
        self.begin_eval()
        return self.end_eval(env_steps, float(evaluate_fn()))

    def begin_eval(self) -> None:
        """Stop the training clock (for frameworks that run the evaluation themselves)."""
        self._eval_started_at, self._eval_clock_value = time.perf_counter(), self.train_seconds()

    def end_eval(self, env_steps: int, mean_reward: float) -> float:
        """Restart the training clock and record the evaluation point."""
        self._excluded += time.perf_counter() - self._eval_started_at
        self.curve.append(EvalPoint(env_steps=env_steps, train_seconds=self._eval_clock_value,
                                    mean_reward=float(mean_reward)))
        return float(mean_reward)


def update_cadence(replay_ratio: float, batch_size: int, num_envs: int, train_freq: int = 1) -> tuple[int, int]:
    """``(train_freq, gradient_steps)`` — vector steps between updates and gradient steps per update —
    that draw ``replay_ratio`` samples per env step (as closely as integers allow), keeping the recipe's
    ``train_freq`` unless one update per ``train_freq`` would draw too many samples.

    Examples:
        >>> update_cadence(8, batch_size=32, num_envs=1, train_freq=4)       # RL Zoo's Atari DQN
        (4, 1)
        >>> update_cadence(8, batch_size=512, num_envs=256)                  # 2048 samples per vector step
        (1, 4)
        >>> update_cadence(32, batch_size=256, num_envs=4, train_freq=64)
        (64, 32)
    """
    per_update = replay_ratio * train_freq * num_envs / batch_size
    if per_update >= 1:
        return train_freq, round(per_update)
    return max(1, round(batch_size / (replay_ratio * num_envs))), 1


def bytes_per_transition(arrays, capacity: int) -> float | None:
    """Bytes of the numpy ``arrays`` a replay buffer holds, per transition of its ``capacity``.

    Examples:
        >>> import numpy as np
        >>> bytes_per_transition([np.zeros((10, 4), np.float32), np.zeros(10, np.int64)], 10)
        24.0
    """
    import numpy as np

    total = sum(a.nbytes for a in arrays if isinstance(a, np.ndarray))
    return total / capacity if capacity and total else None


def run_training(spec: TrainSpec) -> TrainResult:
    """Run ``spec`` with the adapter of ``spec.framework`` (see ``AdapterSpec.train``)."""
    from rlaccel_plugins.plugins import get_plugin_manager
    from rlaccel_plugins.progress import TrainingProgress

    adapter = get_plugin_manager().adapters.get(spec.framework)
    run = start_wandb(spec) if spec.wandb else None
    try:
        with TrainingProgress(total=spec.steps, label=f"{spec.framework} {spec.algo} {spec.env_id} {spec.variant}",
                              enabled=spec.progress) as progress:
            result = adapter.load("train")(spec, progress)
    finally:
        if run is not None:
            run.finish()
    if spec.logdir:
        Path(spec.logdir).mkdir(parents=True, exist_ok=True)
        result.save(Path(spec.logdir) / "result.json")
    return result


def start_wandb(spec: TrainSpec):
    """A wandb run that mirrors the run's TensorBoard logs (``WANDB_MODE=offline`` needs no account).

    Started before the adapter creates its TensorBoard writer, as wandb's ``sync_tensorboard`` requires.
    """
    from rlaccel_plugins.errors import ConfigError

    try:
        import wandb
    except ImportError:
        raise ConfigError("--wandb needs the wandb package, which is not installed. "
                          "Fix: pip install wandb (or drop --wandb).") from None
    if not spec.logdir:
        raise ConfigError("--wandb mirrors the TensorBoard logs, so it needs --logdir DIR.")
    Path(spec.logdir).mkdir(parents=True, exist_ok=True)
    try:
        return wandb.init(project="rlaccel", config=spec.config.to_dict(), sync_tensorboard=True, dir=spec.logdir,
                          name=f"{spec.framework}-{spec.algo}-{spec.env_id}-{spec.variant}-seed{spec.seed}")
    except wandb.errors.UsageError as exc:
        raise ConfigError(f"--wandb could not start a run: {exc} Fix: `wandb login`, or log offline with "
                          "WANDB_MODE=offline (sync later with `wandb sync`).") from None
