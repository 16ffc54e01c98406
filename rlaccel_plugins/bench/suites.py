"""What each benchmark suite runs: tasks, and the variants compared on each."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from rlaccel_plugins.errors import ConfigError, did_you_mean


@dataclass(frozen=True)
class Variant:
    """One way of training a task: a framework's stock settings, or rlaccel with a preset.

    ``role``: ``yardstick`` (what speed-ups are measured against), ``accelerated``, ``reference``
    (another stock option, reported beside) or ``ablation``.
    """

    name: str
    framework: str
    algo: str = "dqn"
    stock: bool = False
    dropin: bool = False              # the stock recipe plus only the README's drop-in (with ``preset``)
    preset: str = "classic_control"
    overrides: dict[str, Any] = field(default_factory=dict)
    hyperparams: dict[str, Any] = field(default_factory=dict)
    steps: int | None = None          # this variant's own cap (default: the task's)
    role: str = "accelerated"


@dataclass(frozen=True)
class Task:
    env_id: str
    steps: int                        # cap on env steps per run
    eval_freq: int
    variants: tuple[Variant, ...]
    fixed_steps: bool = False         # throughput suites: run the whole budget, no early stop
    requires: str | None = None       # a module the task needs (skipped, with the reason, when missing)

    def missing(self) -> str | None:
        """Why this task cannot run here, or None."""
        import importlib.util

        if self.requires == "Box2D":  # gymnasium's box2d envs import pygame too
            absent = [m for m in ("Box2D", "pygame") if importlib.util.find_spec(m) is None]
            # binary wheels: gymnasium[box2d] pins box2d-py, which builds from source with SWIG
            return f"{self.env_id} needs the {' and '.join(map(repr, absent))} module (pip install box2d pygame)" \
                if absent else None
        if self.requires and importlib.util.find_spec(self.requires) is None:
            return f"{self.env_id} needs the {self.requires!r} module"
        return None


STOCK_SB3 = Variant("sb3 stock (RL Zoo)", "sb3", stock=True, role="yardstick")
STOCK_TIANSHOU = Variant("tianshou stock (example settings)", "tianshou", stock=True, role="reference")
PPO_SB3 = Variant("sb3 PPO stock (RL Zoo)", "sb3", algo="ppo", stock=True, role="reference")


# Measured on CartPole-v1: Tianshou's DQN did not reach 475 within 60k env steps at classic_control's
# batch 256 / 16 samples per env step (2 seeds, two learning rates), and did at batch 64 / 32.
FRAMEWORK_OVERRIDES = {("tianshou", "classic_control"): {"batch_size": 64, "replay_ratio": 32}}


def drop_in(framework: str, preset: str, algo: str = "dqn", **overrides: Any) -> Variant:
    """The framework's stock recipe with only the drop-in the README shows (tiered buffer, and the
    callback / wrapper with fused updates) for ``preset``, plus config ``overrides`` (named in the
    variant, e.g. ``fused_optimizer=True``); no hyper-parameter changed."""
    shown = f"{framework} {algo.upper() + ' ' if algo != 'dqn' else ''}drop-in[{preset}]"
    shown += "".join(f" + {key}" if value is True else f" + {key}={value}" for key, value in overrides.items())
    return Variant(shown, framework, algo=algo, dropin=True, preset=preset, overrides=overrides)


def accelerated(framework: str, preset: str) -> Variant:
    overrides = FRAMEWORK_OVERRIDES.get((framework, preset), {})
    shown = "".join(f", {k}={v}" for k, v in overrides.items())
    return Variant(f"{framework} rlaccel[{preset}{shown}]", framework, preset=preset, overrides=dict(overrides))


# Each ablation switches on one technique over the preset's training settings (batch, learning rate,
# replay ratio): "settings only" is that base, "all" is the preset itself.
# UNIFORM_REPLAY stands for one uniform level of the preset's total capacity.
UNIFORM_REPLAY = "uniform_replay"
ABLATIONS = {
    "settings only": {UNIFORM_REPLAY: True, "sparse_update_interval": 1, "parallel_envs": 1},
    "tiers only": {"sparse_update_interval": 1, "parallel_envs": 1},
    # the article's interval, whatever the preset says (classic_control turns sparse/dense off)
    "sparse/dense only": {UNIFORM_REPLAY: True, "parallel_envs": 1, "sparse_update_interval": 100},
    "parallel only": {UNIFORM_REPLAY: True, "sparse_update_interval": 1},
}


def ablations(framework: str, preset: str) -> tuple[Variant, ...]:
    base = FRAMEWORK_OVERRIDES.get((framework, preset), {})
    return tuple(Variant(f"{framework} {name}", framework, preset=preset, overrides={**base, **overrides},
                         role="ablation") for name, overrides in ABLATIONS.items())


def _classic(env_id: str, steps: int, eval_freq: int = 1_000, requires: str | None = None) -> Task:
    variants = (STOCK_SB3, drop_in("sb3", "classic_control"), accelerated("sb3", "classic_control"),
                accelerated("tianshou", "classic_control"), STOCK_TIANSHOU, drop_in("tianshou", "classic_control"))
    return Task(env_id, steps, eval_freq, variants, requires=requires)


def _in_precision(framework: str, dtype: str, preset: str = "classic_control") -> Variant:
    base = accelerated(framework, preset)
    role = "yardstick" if (framework, dtype) == ("sb3", "fp32") else "accelerated"
    return replace(base, name=f"{base.name} {dtype}", overrides={**base.overrides, "dtype": dtype}, role=role)


SUITES: dict[str, tuple[str, tuple[Task, ...]]] = {
    "quick": ("CartPole-v1 DQN, SB3 and Tianshou (about 10 minutes on 2 cores with 5 seeds)", (
        Task("CartPole-v1", 100_000, 1_000, (
            STOCK_SB3, drop_in("sb3", "classic_control"), accelerated("sb3", "classic_control"),
            accelerated("tianshou", "classic_control"), replace(STOCK_TIANSHOU, steps=40_000),
            replace(drop_in("tianshou", "classic_control"), steps=40_000), PPO_SB3,
            drop_in("sb3", "classic_control", algo="ppo"))),)),
    "dropin": (("CartPole-v1: the quick suite's variants plus the SB3 DQN drop-in with the off preset (one "
                "uniform level: SB3's sampling, so fused updates and lean collection alone) and with "
                "training.fused_optimizer"), (
        Task("CartPole-v1", 100_000, 1_000, (
            STOCK_SB3, drop_in("sb3", "classic_control"), drop_in("sb3", "off"),
            drop_in("sb3", "classic_control", fused_optimizer=True), accelerated("sb3", "classic_control"),
            accelerated("tianshou", "classic_control"), replace(STOCK_TIANSHOU, steps=40_000),
            replace(drop_in("tianshou", "classic_control"), steps=40_000), PPO_SB3,
            drop_in("sb3", "classic_control", algo="ppo"))),)),
    "ppo": (("CartPole-v1 PPO, SB3: RL Zoo's settings, stock against the drop-in (the same math bit for bit: "
             "the same env steps, so time to threshold is the speed difference)"), (
        Task("CartPole-v1", 100_000, 1_000, (
            replace(PPO_SB3, role="yardstick"), drop_in("sb3", "classic_control", algo="ppo"))),)),
    "precision": ("CartPole-v1 DQN with the update path in fp32, bf16 and fp16 (loss-scaled): same results?", (
        Task("CartPole-v1", 60_000, 1_000, tuple(
            _in_precision(fw, dtype) for fw in ("sb3", "tianshou") for dtype in ("fp32", "bf16", "fp16"))),)),
    # MinAtar Breakout is not in it yet: minatar is not installable here to test its registration
    "classic": ("CartPole, Acrobot, LunarLander-v3 (if Box2D is installed) with DQN", (
        _classic("CartPole-v1", 100_000),
        _classic("Acrobot-v1", 100_000),
        _classic("LunarLander-v3", 300_000, eval_freq=10_000, requires="Box2D"),
    )),
    # drop-in[off]: one uniform replay level (SB3's sampling distribution), so fused updates and lean
    # collection alone: the 5-seed run measured the mujoco preset's tiers costing env steps here
    "mujoco": (("InvertedPendulum-v5 SAC: SB3's stock settings and its drop-in, with the mujoco and the off "
                "preset (20k env steps at most)"), (
        Task("InvertedPendulum-v5", 20_000, 1_000, (
            Variant("sb3 SAC stock", "sb3", algo="sac", stock=True, role="yardstick"),
            drop_in("sb3", "mujoco", algo="sac"), drop_in("sb3", "off", algo="sac")), requires="mujoco"),)),
    "atari": ("Pong, Breakout, SpaceInvaders DQN to threshold: a GPU job (budget: 10M frames per run)", tuple(
        Task(game, 2_500_000, 50_000, (STOCK_SB3, accelerated("sb3", "atari")))
        for game in ("Pong-v5", "Breakout-v5", "SpaceInvaders-v5"))),
    # RL Zoo's Atari DQN draws batch 32 every 4 env steps: 8 samples per env step, held for every variant
    # + channels_last: the same with training.channels_last (the opt-in CPU convolution layout); the drop-in
    # rows are RL Zoo's settings (batch 32, every update full) with the drop-in under the off preset
    "atari-fps": ("Pong DQN, whole training loop for a fixed budget: agent steps/s at equal samples per env step", (
        Task("Pong-v5", 20_000, 10_000_000, tuple(replace(variant, hyperparams={"learning_starts": 1_000}) for variant in (
            STOCK_SB3,
            replace(accelerated("sb3", "atari"), overrides={"replay_ratio": 8.0}),
            replace(accelerated("sb3", "atari"), name="sb3 rlaccel[atari] + channels_last",
                    overrides={"replay_ratio": 8.0, "channels_last": True}),
            drop_in("sb3", "off"), drop_in("sb3", "off", channels_last=True))), fixed_steps=True),)),
}


def _under_preset(variant: Variant, preset: str) -> Variant:
    """``variant`` with ``preset`` in place of the suite's: stock and ``off`` variants stay as they are."""
    if variant.stock or variant.preset == "off":
        return variant
    if variant.dropin:
        return drop_in(variant.framework, preset, variant.algo, **variant.overrides)
    if "dtype" in variant.overrides:
        return _in_precision(variant.framework, variant.overrides["dtype"], preset)
    return accelerated(variant.framework, preset)


def get_suite(name: str, frameworks: tuple[str, ...] = ("sb3", "tianshou"), ablate: bool = False,
              preset: str | None = None) -> tuple[Task, ...]:
    """The tasks of suite ``name``, keeping the variants of ``frameworks`` (plus ablations if asked);
    ``preset`` replaces the suite's preset in every rlaccel variant."""
    if name not in SUITES:
        raise ConfigError(f"suite must be one of {sorted(SUITES)}, got suite={name!r}."
                          f"{did_you_mean(name, SUITES)}")
    unknown = set(frameworks) - {"sb3", "tianshou"}
    if unknown or not frameworks:
        raise ConfigError(f"frameworks must be a comma-separated subset of sb3,tianshou, got "
                          f"frameworks={','.join(frameworks)!r}.")
    tasks = []
    for task in SUITES[name][1]:
        variants = [v for v in task.variants if v.framework in frameworks or v.role == "yardstick"]
        if preset is not None:
            from rlaccel_plugins.loader import get_preset

            get_preset(preset)  # unknown names fail here, with a suggestion
            variants = [_under_preset(v, preset) for v in variants]
        if ablate:
            base = preset or next((v.preset for v in task.variants if v.role == "accelerated"), "default")
            variants += [a for fw in frameworks for a in ablations(fw, base)]
        tasks.append(replace(task, variants=tuple(variants)))
    return tuple(tasks)
