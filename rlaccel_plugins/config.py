"""`AccelConfig`: the article's YAML as a validated, immutable object, and its loaders.

The layout mirrors the article's YAML so a user can paste its block::

    replay_buffer:
      levels: 4
      level_capacity: [1000, 5000, 20000, 100000]
      sampling_ratio: [0.7, 0.2, 0.08, 0.02]
    training:
      batch_size: 512
      sparse_update_interval: 100
      ...

Two defaults depart from the article where the learning study measured them (docs, "Learning study"):
``sampling: auto`` (the tiers' ratios only for the algorithm families they help) and ``sparse_update_interval: 1``
(every update trains the whole network). The article's values are still one setting away.

This module is the schema: sections, their validation, and reading config files. It imports
nothing of the project but its errors. :func:`rlaccel_plugins.loader.load_config` puts the sources
together (a preset, which plugins may register, then files, then overrides).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from rlaccel_plugins.errors import ConfigError, did_you_mean, invalid

AUTO = "auto"
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
RATIO_SCHEDULES = ("constant", "anneal")
RATIO_TOLERANCE = 1e-6
# settings that only the tiers' sampling reads: values that set one of them (and not ``sampling``) set
# ``sampling: tiers`` too, so ratios a user writes are never silently unused
TIER_SETTINGS = ("sampling_ratio", "ratio_schedule", "importance_beta")
ERE_SETTINGS = ("ere_eta", "ere_c_min", "ere_updates")  # the settings only ERE reads
# How a batch is drawn, each scheme with the settings it alone reads: uniform over everything stored (the
# frameworks' own distribution), the tiers' per-level ratios, ERE (Wang & Ross 2019) or CER (Zhang & Sutton
# 2017). The one list of schemes: replay/schemes.py builds a sampler for each name here (a test holds them equal);
# the tiers read ``anneal_steps`` only under ``ratio_schedule: anneal``; a scheme that does not read
# ``importance_beta`` refuses it (``uniform`` ignores it: its weights are all 1).
SCHEME_SETTINGS: dict[str, tuple[str, ...]] = {
    "uniform": (),
    "tiers": TIER_SETTINGS,
    "ere": (*ERE_SETTINGS, "anneal_steps"),
    "cer": (),
}
SAMPLING_SCHEMES = (AUTO, *SCHEME_SETTINGS)  # ``auto``: the learning study's choice for the algorithm family
SCHEME_READ_SETTINGS = (*TIER_SETTINGS, "anneal_steps", *ERE_SETTINGS)  # every setting some scheme alone reads


# --------------------------------------------------------------------------- value checks
def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def checked_int(name: str, value: Any, minimum: int | None = None, auto: bool = False) -> int | str:
    """``value`` when it is an integer of at least ``minimum`` (or ``"auto"`` where ``auto``), else the
    ``ConfigError`` that names the setting ``name``.

    Examples:
        >>> checked_int("batch_size", 64, minimum=1)
        64
        >>> checked_int("batch_size", 0, minimum=1)
        Traceback (most recent call last):
            ...
        rlaccel_plugins.errors.ConfigError: batch_size must be >= 1, got batch_size=0.
    """
    if auto and value == AUTO:
        return AUTO
    if not _is_int(value):
        raise invalid(name, 'be an integer or "auto"' if auto else "be an integer", value)
    if minimum is not None and value < minimum:
        raise invalid(name, f"be >= {minimum}", value)
    return value


def _float(name: str, value: Any, positive: bool = False, minimum: float | None = None) -> float:
    if not _is_number(value) or not math.isfinite(value):
        raise invalid(name, "be a finite number", value)
    if positive and value <= 0:
        raise invalid(name, "be > 0", value)
    if minimum is not None and value < minimum:
        raise invalid(name, f"be >= {minimum}", value)
    return float(value)


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        hint = did_you_mean(value, choices) if isinstance(value, str) else ""
        raise invalid(name, f"be one of {list(choices)}", value, hint.strip())
    return value


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise invalid(name, "be true or false", value)
    return value


def _sequence(name: str, value: Any) -> tuple:
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
        raise invalid(name, "be a list", value)
    return tuple(value)


# --------------------------------------------------------------------------- sections
@dataclass(frozen=True)
class ReplayBufferConfig:
    """``replay_buffer:`` — tiered replay."""

    levels: int = 4
    """Number of levels, L0 (newest) to L(n-1) (long-term)."""
    level_capacity: tuple[int, ...] = (1000, 5000, 20000, 100000)
    """Transitions each level holds, newest level first; their sum is the buffer's capacity."""
    sampling_ratio: tuple[float, ...] = (0.7, 0.2, 0.08, 0.02)
    """Share of every batch drawn from each level under `sampling: tiers` (sums to 1)."""
    ratio_schedule: str = "constant"
    """`constant`, or `anneal`: the ratios move toward uniform over `anneal_steps`."""
    anneal_steps: int = 1_000_000
    """Updates over which `anneal` (and ERE's `ere_eta`) reach uniform."""
    importance_beta: float | None = None
    """A number turns on importance weights (N·P)^-beta / max for `sampling: tiers`; null: off."""
    dedup_frames: bool | str = AUTO
    """Store each stacked 84x84 frame once (`auto`: for stacked-frame observations; true / false to force)."""
    n_step: int | str = AUTO
    """n-step returns where rlaccel builds the agent (`rlaccel train`); `auto`: the recipe's own (RL Zoo: 1, Tianshou's example: 3)."""
    sampling: str = "auto"
    """How a batch is drawn: `uniform` (the frameworks' own distribution), `tiers` (the ratios above), `ere` or `cer`; `auto`: `tiers` for the algorithm families the learning study showed them to help (SB3 DQN and QR-DQN), `uniform` for the others. The levels are kept, and reported, whatever it is."""
    ere_eta: float = 0.996
    """ERE: the recency exponent's base, annealed to 1 over `anneal_steps`."""
    ere_c_min: int = 5000
    """ERE: the smallest window of newest transitions an update draws from."""
    ere_updates: int = 1000
    """ERE: K, the updates of one sweep from the whole buffer to the newest window."""

    def unread(self) -> list[str]:
        """The keys this configuration's sampling does not read (``rlaccel presets show`` leaves them out).

        Examples:
            >>> ReplayBufferConfig(sampling="uniform").unread()[:3]
            ['sampling_ratio', 'ratio_schedule', 'importance_beta']
        """
        reads = set(SCHEME_SETTINGS.get(self.sampling, TIER_SETTINGS))  # auto may resolve to the tiers
        if "ratio_schedule" in reads and self.ratio_schedule == "anneal":
            reads.add("anneal_steps")
        return [name for name in SCHEME_READ_SETTINGS if name not in reads]

    def sampled(self) -> dict[str, Any]:
        """What a batch is drawn by: the scheme, the levels and (for ``tiers``) the ratios and their schedule.

        Examples:
            >>> ReplayBufferConfig(levels=1, level_capacity=[100], sampling_ratio=[1.0], sampling="uniform").sampled()
            {'sampling': 'uniform', 'level_capacity': [100]}
        """
        scheme = "uniform" if self.sampling == "tiers" and self.levels == 1 else self.sampling  # one level: uniform
        out: dict[str, Any] = {"sampling": scheme, "level_capacity": list(self.level_capacity)}
        if scheme == "tiers":
            out.update(sampling_ratio=list(self.sampling_ratio), ratio_schedule=self.ratio_schedule)
        return out

    def __post_init__(self) -> None:
        levels = checked_int("levels", self.levels, minimum=1)
        _choice("sampling", self.sampling, SAMPLING_SCHEMES)
        eta = _float("ere_eta", self.ere_eta, positive=True)
        if eta > 1:
            raise invalid("ere_eta", "be in (0, 1]", self.ere_eta, "The paper's value is 0.996.")
        checked_int("ere_c_min", self.ere_c_min, minimum=1)
        checked_int("ere_updates", self.ere_updates, minimum=1)
        if (self.importance_beta is not None and self.sampling not in (AUTO, "uniform")
                and "importance_beta" not in SCHEME_SETTINGS[self.sampling]):
            raise invalid("importance_beta", f"be unset with sampling={self.sampling!r} (weights correct the tiers' "
                          "ratios only)", self.importance_beta, "Drop importance_beta or use sampling: tiers.")
        checked_int("n_step", self.n_step, minimum=1, auto=True)
        caps = _sequence("level_capacity", self.level_capacity)
        for cap in caps:
            if not _is_int(cap) or cap < 1:
                raise invalid("level_capacity", "be a list of positive integers", list(caps))
        ratios = _sequence("sampling_ratio", self.sampling_ratio)
        for ratio in ratios:
            if not _is_number(ratio) or not math.isfinite(ratio) or ratio < 0:
                raise invalid("sampling_ratio", "be a list of numbers >= 0", list(ratios))
        if len(caps) != levels:
            raise invalid("level_capacity", f"have one entry per level (levels={levels})", list(caps),
                          "Set levels to len(level_capacity) or add/remove capacities.")
        if len(ratios) != levels:
            raise invalid("sampling_ratio", f"have one entry per level (levels={levels})", list(ratios),
                          "Give one ratio per entry of level_capacity.")
        if abs(sum(ratios) - 1.0) > RATIO_TOLERANCE:
            raise invalid("sampling_ratio", "sum to 1", list(ratios),
                          f"Divide each ratio by their sum ({sum(ratios):.6g}).")
        _choice("ratio_schedule", self.ratio_schedule, RATIO_SCHEDULES)
        checked_int("anneal_steps", self.anneal_steps, minimum=1)
        if self.importance_beta is not None:
            _float("importance_beta", self.importance_beta, minimum=0.0)
        if self.dedup_frames != AUTO:
            _bool("dedup_frames", self.dedup_frames)
        object.__setattr__(self, "level_capacity", tuple(int(c) for c in caps))
        object.__setattr__(self, "sampling_ratio", tuple(float(r) for r in ratios))

    @property
    def capacity(self) -> int:
        """Total capacity in transitions (the sum of the level capacities)."""
        return sum(self.level_capacity)


@dataclass(frozen=True)
class TrainingConfig:
    """``training:`` — update and collection settings."""

    batch_size: int = 512
    """Batch size where rlaccel builds an off-policy agent."""
    sparse_update_interval: int = 1
    """Every N-th update trains the whole network; the others only `dense_layers`. 1 (the default): every update
    full, as the frameworks train; the article's is 100, which no study here found to pay (docs: Learning study)."""
    dense_layers: tuple[int | str, ...] = (-3, -2, -1)
    """The layers trained on every update: indices into the network's trainable layers (negative from the end) or name patterns."""
    learning_rate: float = 0.00025
    """Learning rate where rlaccel builds an off-policy agent."""
    parallel_envs: int | str = 256
    """Envs collected in parallel where rlaccel builds the agent (`auto`: from the cores and the env's speed)."""
    sync_interval: int = 50
    """Gradient steps between the learner's weight syncs to its collection actors (async and Ray collection)."""
    device: str = AUTO
    """The device of every model rlaccel builds (`auto`: the framework's choice)."""
    num_threads: int | str = AUTO
    """torch threads while training, put back after it (`auto`: the usable cores, or `OMP_NUM_THREADS`, and during `learn()` no more than the cores other processes leave free, re-read every second)."""
    replay_ratio: float | str = AUTO
    """Replay samples per env step (batch x gradient steps / env steps); `auto`: the recipe's own rate."""
    net_arch: tuple[int, ...] | str = AUTO
    """Hidden layer sizes of the MLP agents rlaccel builds; `auto`: the recipe's."""
    fused_updates: bool | str = AUTO
    """The framework's update run fused (the same math, tested equal); `auto`: where one exists and its code is verified; `true`: required; `false`: the framework's own."""
    fused_collection: bool | str = AUTO
    """Action selection during collection made lean (SB3: DQN, QR-DQN, SAC, TD3, DDPG, PPO, A2C; Tianshou: `LeanCollector`; the same actions and RNG draws, tested equal); `auto`: where tested; `true`: required."""
    fused_optimizer: bool = False
    """Fused updates step Adam/AdamW/SGD with PyTorch's single-kernel `fused=True` implementation: faster, equal within rtol 1e-4, not bit for bit."""
    compiled_updates: bool | str = AUTO
    """On the CPU, each gradient step runs as one compiled call (TorchInductor: gradients, clipping, guard and the optimizer's update fused), where the algorithm has one (the support tables of the fused-updates page): faster, equal within a derived tolerance, not bit for bit; compiled once per machine and kept on disk; `auto`: SB3 algorithms whose learning check has run, where the `learn()` call plans at least the algorithm's break-even of gradient steps (the fused-updates page lists them); Tianshou's stay eager; `true`: required (Tianshou: DQN, SAC); `false`: never."""
    channels_last: bool = False
    """The policy's Conv2d layers in channels-last memory format while training: faster CPU convolution gradients, equal within a derived tolerance, not bit for bit."""

    def __post_init__(self) -> None:
        checked_int("batch_size", self.batch_size, minimum=1)
        if self.replay_ratio != AUTO:
            _float("replay_ratio", self.replay_ratio, positive=True)
        if self.net_arch != AUTO:
            sizes = _sequence("net_arch", self.net_arch)
            if not sizes or not all(_is_int(n) and n > 0 for n in sizes):
                raise invalid("net_arch", 'be "auto" or a list of positive layer sizes', self.net_arch,
                              "Use e.g. [64, 64].")
            object.__setattr__(self, "net_arch", tuple(sizes))
        checked_int("sparse_update_interval", self.sparse_update_interval, minimum=1)
        layers = _sequence("dense_layers", self.dense_layers)
        if not layers:
            raise invalid("dense_layers", "name at least one layer", list(layers), "Use e.g. [-3, -2, -1].")
        for layer in layers:
            if _is_int(layer):
                if layer >= 0:
                    raise invalid("dense_layers", "hold negative layer indices (counted from the output) "
                                  "or parameter-name globs", list(layers), "Use e.g. [-3, -2, -1].")
            elif not isinstance(layer, str) or not layer:
                raise invalid("dense_layers", "hold negative integers or non-empty glob strings", list(layers))
        _float("learning_rate", self.learning_rate, positive=True)
        checked_int("parallel_envs", self.parallel_envs, minimum=1, auto=True)
        checked_int("sync_interval", self.sync_interval, minimum=1)
        if not isinstance(self.device, str) or not (
            self.device in (AUTO, "cpu", "cuda", "mps") or self.device.startswith("cuda:")
        ):
            raise invalid("device", 'be "auto", "cpu", "cuda", "cuda:N" or "mps"', self.device)
        checked_int("num_threads", self.num_threads, minimum=1, auto=True)
        for key in ("fused_updates", "fused_collection", "compiled_updates"):
            value = getattr(self, key)
            if value != AUTO and not isinstance(value, bool):
                raise invalid(key, 'be "auto", true or false', value)
        _bool("fused_optimizer", self.fused_optimizer)
        _bool("channels_last", self.channels_last)
        object.__setattr__(self, "dense_layers", tuple(layers))


@dataclass(frozen=True)
class MonitoringConfig:
    """``monitoring:`` — live fps, reward and update counts."""

    log_interval: int = 1000
    """Env steps between rlaccel's metric records (`rlaccel/*`)."""
    progress_bar: bool = True
    """The live line of `rlaccel train` (`--no-progress` overrides)."""
    tensorboard: bool = True
    """TensorBoard logs in the run's logdir."""
    wandb: bool = False
    """Mirror the logs to Weights & Biases (`--wandb` overrides)."""

    def __post_init__(self) -> None:
        checked_int("log_interval", self.log_interval, minimum=1)
        _bool("progress_bar", self.progress_bar)
        _bool("tensorboard", self.tensorboard)
        _bool("wandb", self.wandb)


@dataclass(frozen=True)
class CheckpointConfig:
    """``checkpoint:`` — crash-safe checkpoints: every ``every_steps`` env steps and every
    ``every_seconds`` of wall time (0 turns either off), on SIGTERM/SIGINT, and at the end of a run that
    checkpoints at all."""

    every_steps: int = 0
    """Checkpoint every N env steps (0: off)."""
    every_seconds: int = 300
    """Checkpoint every N seconds of wall time (0: off); the first after at most 30 s, so a short run can be resumed too."""
    keep: int = 3
    """Checkpoints kept; older ones are deleted once a newer one is complete."""
    on_signal: bool = True
    """Checkpoint on SIGTERM / SIGINT, then stop."""

    def __post_init__(self) -> None:
        checked_int("every_steps", self.every_steps, minimum=0)
        checked_int("every_seconds", self.every_seconds, minimum=0)
        checked_int("keep", self.keep, minimum=1)
        _bool("on_signal", self.on_signal)


@dataclass(frozen=True)
class PrecisionConfig:
    """``precision:`` — mixed precision and gradient safety."""

    dtype: str = "fp32"
    """Update precision: `fp32`, `bf16`, `fp16` (autocast, with a loss scaler) or `auto` (the device's best)."""
    max_grad_norm: float | None = None
    """Clip the gradients' global norm to this value; null: no clipping."""
    skip_nonfinite: bool = True
    """Skip an update whose loss or gradients are NaN/Inf (counted and logged)."""
    restore_last_good: bool = False
    """Weights made non-finite by a step go back to the last good ones."""

    def __post_init__(self) -> None:
        _choice("dtype", self.dtype, PRECISIONS)
        if self.max_grad_norm is not None:
            _float("max_grad_norm", self.max_grad_norm, positive=True)
        _bool("skip_nonfinite", self.skip_nonfinite)
        _bool("restore_last_good", self.restore_last_good)
        if self.dtype == "fp16" and not self.skip_nonfinite:
            raise ConfigError("skip_nonfinite must be true with dtype='fp16', got skip_nonfinite=False: loss "
                              "scaling skips the steps that overflow. Fix: drop skip_nonfinite, or use dtype: bf16.")


SECTIONS: dict[str, type] = {
    "replay_buffer": ReplayBufferConfig,
    "training": TrainingConfig,
    "monitoring": MonitoringConfig,
    "checkpoint": CheckpointConfig,
    "precision": PrecisionConfig,
}
# Every field name is unique across sections, so ``batch_size=512`` needs no section prefix.
FIELD_SECTION: dict[str, str] = {f.name: s for s, cls in SECTIONS.items() for f in fields(cls)}


@dataclass(frozen=True)
class AccelConfig:
    """The whole rlaccel configuration. Immutable; build variants with :meth:`merged`.

    Examples:
        >>> import rlaccel_plugins as rla
        >>> cfg = rla.AccelConfig()                      # the article's values
        >>> cfg.replay_buffer.sampling_ratio
        (0.7, 0.2, 0.08, 0.02)
        >>> cfg.merged({"batch_size": 64}).training.batch_size
        64
    """

    preset: str = "default"
    replay_buffer: ReplayBufferConfig = field(default_factory=ReplayBufferConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    monitoring: MonitoringConfig = field(default_factory=MonitoringConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AccelConfig:
        """Build a config from a (nested or flat) mapping on top of the defaults."""
        return cls().merged(data)

    def to_dict(self) -> dict[str, Any]:
        """Nested plain-Python dict (lists, not tuples), ready for YAML/JSON."""
        out: dict[str, Any] = {"preset": self.preset}
        for name in SECTIONS:
            section = dataclasses.asdict(getattr(self, name))
            out[name] = {k: list(v) if isinstance(v, tuple) else v for k, v in section.items()}
        return out

    def merged(self, data: Mapping[str, Any] | None) -> AccelConfig:
        """Return a copy with ``data`` applied on top; raises :class:`ConfigError` on any bad key/value."""
        if not data:
            return self
        updates = normalize_mapping(data)
        current = self.to_dict()
        for section, values in updates.items():
            if section == "preset":
                current["preset"] = values
            else:
                current[section].update(values)
        tiers = updates.get("replay_buffer", {})
        if "levels" not in tiers and isinstance(tiers.get("level_capacity"), (list, tuple)):
            current["replay_buffer"]["levels"] = len(tiers["level_capacity"])  # levels follows the capacities
        if "sampling" not in tiers and tiers.keys() & set(TIER_SETTINGS):
            current["replay_buffer"]["sampling"] = "tiers"  # ratios given are ratios meant to be used
        return _build(current)

    def diff(self, other: AccelConfig) -> dict[str, tuple[Any, Any]]:
        """``{"section.key": (mine, theirs)}`` for every value that differs."""
        mine, theirs = self.to_dict(), other.to_dict()
        out = {}
        for section in SECTIONS:
            for key, value in mine[section].items():
                if theirs[section][key] != value:
                    out[f"{section}.{key}"] = (value, theirs[section][key])
        return out


def normalize_mapping(data: Mapping[str, Any]) -> dict[str, Any]:
    """Turn flat (``batch_size``), dotted (``training.batch_size``) and nested keys into sections."""
    if not isinstance(data, Mapping):
        raise invalid("config", "be a mapping of sections to values", data)
    out: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise invalid("config key", "be a string", key)
        if key == "preset":
            if not isinstance(value, str):
                raise invalid("preset", "be a preset name", value)
            out["preset"] = value
        elif key == "precision" and isinstance(value, str):  # shorthand: precision: bf16
            out.setdefault("precision", {})["dtype"] = value
        elif key in SECTIONS:
            if not isinstance(value, Mapping):
                raise invalid(key, "be a mapping of settings", value, f"Write e.g. {key}: {{...}}.")
            allowed = [f.name for f in fields(SECTIONS[key])]
            for sub_key, sub_value in value.items():
                if sub_key not in allowed:
                    raise ConfigError(f"unknown key {key}.{sub_key!s}, got {key}.{sub_key}={sub_value!r}."
                                      f"{did_you_mean(str(sub_key), allowed)} Known keys: {allowed}.")
                out.setdefault(key, {})[sub_key] = sub_value
        elif "." in key:
            section, _, sub_key = key.partition(".")
            for s, values in normalize_mapping({section: {sub_key: value}}).items():
                out.setdefault(s, {}).update(values)
        elif key in FIELD_SECTION:
            out.setdefault(FIELD_SECTION[key], {})[key] = value
        else:
            known = ["preset", *SECTIONS, *FIELD_SECTION]
            raise ConfigError(f"unknown key {key}, got {key}={value!r}.{did_you_mean(key, known)}"
                              f" Known sections: {list(SECTIONS)}.")
    return out


def _build(nested: dict[str, Any]) -> AccelConfig:
    sections = {}
    for name, cls in SECTIONS.items():
        try:
            sections[name] = cls(**nested[name])
        except TypeError as exc:  # a malformed value that slipped past the checks
            raise ConfigError(f"{name} is malformed, got {name}={nested[name]!r}: {exc}.") from None
    return AccelConfig(preset=nested["preset"], **sections)


# --------------------------------------------------------------------------- files and loaders
def read_config_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read a YAML or TOML file; for a ``pyproject.toml`` only its ``[tool.rlaccel]`` table."""
    path = Path(path)
    if not path.is_file():
        raise invalid("config file", "exist", str(path), "Check RLACCEL_CONFIG or the path you passed.")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".toml":
            data = _toml_loads(text)
            if path.name == "pyproject.toml":
                data = data.get("tool", {}).get("rlaccel", {})
        elif path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            raise invalid("config file", "end in .yaml, .yml or .toml", str(path))
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - parser errors of either format, each its own class
        raise ConfigError(f"config file {str(path)!r} could not be parsed: {exc}. Fix the syntax.") from None
    if not isinstance(data, Mapping):
        raise invalid("config file", "hold a mapping at the top level", type(data).__name__, str(path))
    return dict(data)


def _toml_loads(text: str) -> dict[str, Any]:
    try:
        import tomllib  # type: ignore[import-not-found,unused-ignore]  # Python 3.11+
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef,unused-ignore]
    return tomllib.loads(text)


def find_project_config(start: str | os.PathLike | None = None) -> Path | None:
    """The nearest ``pyproject.toml`` (from ``start`` upward) that has a ``[tool.rlaccel]`` table."""
    here = Path(start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        candidate = directory / "pyproject.toml"
        if candidate.is_file() and "[tool.rlaccel" in candidate.read_text(encoding="utf-8"):
            return candidate
    return None
