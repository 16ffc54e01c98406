"""What `rlaccel train` and `rlaccel demo` run: one template for every framework.

:func:`run_training` owns a run: checks, the logdir and ``spec.json``, signals, progress, the
evaluation clock, the result, the saved model, ``rlaccel.yaml`` and ``result.json``. An adapter
supplies only what knows its framework: its ``train`` entry (``AdapterSpec.train``) builds a
:class:`TrainingRun` from the spec (the agent), whose ``learn`` trains in sync, async or Ray mode and
whose ``save`` writes the model. The core never imports a framework. Time-to-threshold follows
the project's benchmark rules: training wall time with the evaluation time excluded, until a deterministic
10-episode evaluation reaches the task's threshold.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rlaccel_plugins.config import AccelConfig
from rlaccel_plugins.errors import ConfigError
from rlaccel_plugins.tasks import TaskInfo, ensure_registered, task_info


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
    dropin: bool = False              # the framework's own settings plus only the README's drop-in
    eval_freq: int = 2_000            # env steps between evaluations
    eval_episodes: int = 10
    stop_at: float | None = None      # stop when the evaluation mean reaches this (default: the task's threshold)
    wandb: bool = False
    progress: bool = True
    hyperparams: dict[str, Any] = field(default_factory=dict)  # the framework's own, applied last
    async_mode: bool = False          # collect in an actor thread while the learner trains
    resume: bool = False              # continue from the newest valid checkpoint in ``logdir``
    ray: dict[str, Any] | None = None  # Ray scale-out: address, actors, chunk_steps (ray_actors.ray_settings)
    stop: Any = field(default=None, repr=False, compare=False)  # set by run_training: a StopSignal
    resume_from: Any = field(default=None, repr=False, compare=False)  # set by run_training: the Checkpoint

    SAVED = ("framework", "algo", "env_id", "steps", "seed", "stock", "dropin", "eval_freq", "eval_episodes", "stop_at",
             "hyperparams", "async_mode", "ray")

    def __post_init__(self) -> None:
        from rlaccel_plugins.errors import invalid

        for name, flag in (("steps", "--steps"), ("eval_freq", "--eval-freq"), ("eval_episodes", "eval_episodes")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise invalid(flag, "be a positive integer", value)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise invalid("--seed", "be an integer >= 0 (the frameworks seed numpy, which takes no negatives)",
                          self.seed)
        if self.stock and self.dropin:
            raise invalid("--drop-in", "not be given with --stock (--stock runs without rlaccel)", True,
                          "Drop one of the two.")
        if self.logdir is not None and Path(self.logdir).exists() and not Path(self.logdir).is_dir():
            raise invalid("--logdir", "be a directory or a path that does not exist yet", str(self.logdir),
                          "It names an existing file: pick another path.")

    def save(self, path: str | Path) -> None:
        """Write what ``rlaccel train --resume`` needs to rebuild this spec (``spec.json``)."""
        data = {name: getattr(self, name) for name in self.SAVED}
        Path(path).write_text(json.dumps({**data, "config": self.config.to_dict()}, indent=2, default=str))

    @classmethod
    def load(cls, path: str | Path, **changes: Any) -> TrainSpec:
        from rlaccel_plugins.errors import ConfigError
        from rlaccel_plugins.loader import load_config

        try:
            data = json.loads(Path(path).read_text())
            config = load_config(data.pop("config"))
            defaults = {"wandb": config.monitoring.wandb, "progress": config.monitoring.progress_bar}
            changes = {k: defaults[k] if v is None and k in defaults else v for k, v in changes.items()}
            return cls(config=config, **{k: v for k, v in data.items() if k in cls.SAVED}, **changes)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"--resume needs the spec.json an `rlaccel train` run writes in its --logdir, "
                              f"got {str(path)!r}: {exc}") from None

    @property
    def threshold(self) -> float | None:
        return self.stop_at if self.stop_at is not None else self.task.threshold

    @property
    def task(self) -> TaskInfo:
        """What rlaccel knows about the run's env (:mod:`rlaccel_plugins.tasks`), resolved once."""
        return task_info(self.env_id)

    @property
    def own_recipe(self) -> bool:
        """Whether the framework's own hyper-parameters, envs and network are used (``stock``, ``dropin``)."""
        return self.stock or self.dropin

    @property
    def variant(self) -> str:
        if self.stock:
            return "stock"
        return f"drop-in[{self.config.preset}]" if self.dropin else f"rlaccel[{self.config.preset}]"

    def summary(self) -> dict[str, Any]:
        """What identifies the run in its result."""
        return {"framework": self.framework, "algo": self.algo, "env_id": self.env_id, "variant": self.variant,
                "seed": self.seed, "steps": self.steps}


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
    stopped_by_signal: int | None = None             # SIGTERM/SIGINT: checkpointed and stopped early
    checkpoint: str | None = None                    # the newest checkpoint written
    replay_bytes_per_transition: float | None = None  # replay memory / capacity (None: no replay buffer)
    replay_sampling: dict[str, Any] | None = None     # what batches were drawn by (ReplayBufferConfig.sampled)

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


@dataclass
class Learned:
    """What an adapter's :meth:`TrainingRun.learn` reports; the template builds the result from it."""

    env_steps: int
    gradient_steps: int = 0
    stats: dict[str, float] = field(default_factory=dict)
    replay_bytes_per_transition: float | None = None
    checkpoint: str | None = None      # the newest checkpoint written
    replay_sampling: dict[str, Any] | None = None  # ReplayBufferConfig.sampled; the framework's own buffer: uniform


def replay_sampling(buffer: Any, config: Any = None) -> dict[str, Any] | None:
    """What ``buffer``'s batches are drawn by, for :attr:`Learned.replay_sampling`: its resolved replay ``config``
    (``ReplayBufferConfig.sampled``), uniform for a framework's own buffer (no config), None without a buffer."""
    if buffer is None:
        return None
    return config.sampled() if config is not None else {"sampling": "uniform", "buffer": type(buffer).__name__}


class TrainingRun(Protocol):
    """The framework-specific part of one run, built by the adapter's ``train`` entry from a
    :class:`TrainSpec` (the agent is built then; ``spec.stop`` is the run's :class:`StopSignal`)."""

    def learn(self, progress: Any, clock: EvalClock) -> Learned:
        """Train (``spec.async_mode`` / ``spec.ray`` choose the mode; ``spec.resume`` continues from the
        newest checkpoint), evaluating every ``spec.eval_freq`` env steps on ``clock``."""

    def save(self, out: Path) -> Path:
        """Write the trained model into the directory ``out``; return its path."""


class EvalClock:
    """Training wall time with evaluations cut out, and the evaluation curve."""

    def __init__(self) -> None:
        self._start = time.perf_counter()
        self._excluded = 0.0
        self.curve: list[EvalPoint] = []

    def train_seconds(self) -> float:
        return time.perf_counter() - self._start - self._excluded

    def state(self) -> dict[str, Any]:
        return {"train_seconds": self.train_seconds(), "curve": [asdict(p) for p in self.curve]}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue a checkpointed run's clock and curve."""
        self._start, self._excluded = time.perf_counter() - state["train_seconds"], 0.0
        self.curve = [EvalPoint(**p) for p in state["curve"]]

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


def check_env_id(env_id: str) -> None:
    """Raise a ConfigError (with the closest ids) unless gymnasium, ale-py or envpool knows ``env_id``."""
    import gymnasium as gym

    from rlaccel_plugins.errors import ConfigError, did_you_mean
    from rlaccel_plugins.parallel.factory import envpool_env_ids

    ensure_registered(env_id)
    if env_id in gym.registry or env_id in envpool_env_ids() or task_info(env_id).atari:
        return
    known = [*gym.registry, *envpool_env_ids()]
    hint = did_you_mean(env_id, known) or " List them with: python -c \"import gymnasium; gymnasium.pprint_registry()\""
    raise ConfigError(f"env must be a registered gymnasium, Atari or envpool task id, got env={env_id!r}.{hint}")


def run_training(spec: TrainSpec) -> TrainResult:
    """Run ``spec`` with the adapter of ``spec.framework`` (see ``AdapterSpec.train``)."""
    from rlaccel_plugins.checkpoint import StopSignal
    from rlaccel_plugins.plugins import get_plugin_manager
    from rlaccel_plugins.progress import TrainingProgress

    adapters = get_plugin_manager().adapters
    adapters.check_algo(spec.framework, spec.algo)  # before any framework import
    adapter = adapters.get(spec.framework)
    check_env_id(spec.env_id)
    if spec.ray is not None:
        from rlaccel_plugins.parallel.ray_actors import require_ray

        require_ray()  # fail before building anything, saying how to install it
    if spec.resume:
        _find_resume_point(spec)
    run = None
    try:
        # only a run with a --logdir can checkpoint; without one a signal keeps its usual effect
        with torch_threads(spec.config), \
                StopSignal(enabled=bool(spec.logdir) and spec.config.checkpoint.on_signal) as stop, \
                TrainingProgress(total=spec.steps, label=f"{spec.framework} {spec.algo} {spec.env_id} {spec.variant}",
                                 enabled=spec.progress) as progress:
            spec.stop = stop
            # built first: a bad algorithm, env or setting is refused before the run folder exists
            training: TrainingRun = adapter.load("train")(spec)
            if spec.logdir and not spec.resume:
                Path(spec.logdir).mkdir(parents=True, exist_ok=True)
                spec.save(Path(spec.logdir) / "spec.json")
            run = start_wandb(spec) if spec.wandb else None
            clock = EvalClock()
            learned = training.learn(progress, clock)
            progress.steps = learned.env_steps  # the final line shows where the run ended
            result = _result(spec, training, clock, learned)
    finally:
        if run is not None:
            run.finish()
    if spec.logdir:
        Path(spec.logdir).mkdir(parents=True, exist_ok=True)
        result.save(Path(spec.logdir) / "result.json")
    return result


def _find_resume_point(spec: TrainSpec) -> None:
    """The checkpoint ``--resume`` continues from, verified once (its checksums read every file) and
    handed to the adapter. A run killed before its first checkpoint starts over; one whose
    checkpoints are all damaged fails here, before anything is built."""
    import logging

    from rlaccel_plugins.checkpoint import store_for

    finished = Path(spec.logdir or "") / "result.json"
    if spec.logdir and finished.exists():
        result = json.loads(finished.read_text())
        if result.get("stopped_by_signal") is None and result.get("env_steps", 0) >= spec.steps:
            raise ConfigError(f"resume must name an unfinished run, got --resume {spec.logdir}, which finished "
                              f"({result.get('env_steps', 0):,} of its {spec.steps:,} env steps; its model is kept as "
                              "it is). To train longer, raise `steps` in its spec.json, or start a new run.")
    store = store_for(spec)
    if not store.has_any():
        logging.getLogger("rlaccel").warning("rlaccel: %s has no checkpoint yet (the run stopped before its first "
                                             "one): starting it over", spec.logdir)
        spec.resume = False
        return
    spec.resume_from = store.require_latest()


@contextlib.contextmanager
def torch_threads(config: AccelConfig):
    """Torch's intra-op threads for the run: ``training.num_threads`` ("auto": the usable cores); the
    caller's count comes back after it."""
    import torch

    from rlaccel_plugins.hardware import resolve_auto

    previous = torch.get_num_threads()
    torch.set_num_threads(resolve_auto(config).num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _result(spec: TrainSpec, training: TrainingRun, clock: EvalClock, learned: Learned) -> TrainResult:
    """The run's result; a finished run with a logdir also saves its model and ``rlaccel.yaml``."""
    result = TrainResult(spec=spec.summary(), curve=clock.curve, env_steps=learned.env_steps,
                         train_seconds=clock.train_seconds(), model_path=None, stats=learned.stats,
                         gradient_steps=learned.gradient_steps, checkpoint=learned.checkpoint,
                         replay_bytes_per_transition=learned.replay_bytes_per_transition,
                         replay_sampling=learned.replay_sampling)
    if spec.stop is not None and spec.stop.received is not None:
        result.stopped_by_signal = spec.stop.received
        return result  # the checkpoint is the state to resume from; the final save is for finished runs
    if spec.logdir:
        out = Path(spec.logdir)
        out.mkdir(parents=True, exist_ok=True)
        result.model_path = str(training.save(out))
        (out / "rlaccel.yaml").write_text(config_yaml(spec.config))
    return result


UNIFORM_NOTE = ("# sampling: uniform draws every batch uniformly from all stored transitions, as the framework does:\n"
                "# the levels (level_capacity) are kept and reported; sampling_ratio applies only to sampling: tiers\n")


def config_yaml(config) -> str:
    """``config`` as the YAML a run saves, saying so where ``sampling: uniform`` leaves ``sampling_ratio`` unused.

    Examples:
        >>> from rlaccel_plugins.loader import load_config
        >>> print(config_yaml(load_config(preset="classic_control")).splitlines()[0])
        # sampling: uniform draws every batch uniformly from all stored transitions, as the framework does:
    """
    import yaml

    text = yaml.safe_dump(config.to_dict(), sort_keys=False)
    return UNIFORM_NOTE + text if config.replay_buffer.sampling == "uniform" else text


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
