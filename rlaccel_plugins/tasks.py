"""What rlaccel knows about a task, in one place: resolved once per env id, carried on a run's spec.

Examples:
    >>> from rlaccel_plugins.tasks import task_info
    >>> info = task_info("CartPole-v1")
    >>> info.threshold, info.cheap, info.atari, info.recipe
    (475.0, True, False, 'CartPole-v1')
    >>> task_info("MinAtar/Breakout-v1").recipe  # the MinAtar paper's DQN settings, for every game
    'minatar'
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import cache, cached_property

# the return a run counts as solved at (time to threshold, early stop, the study's normalised 1)
THRESHOLDS = {"CartPole-v1": 475.0, "Acrobot-v1": -100.0, "LunarLander-v3": 200.0, "Pendulum-v1": -200.0,
              "InvertedPendulum-v5": 950.0, "InvertedDoublePendulum-v5": 9_100.0, "Pong-v5": 18.0,
              "PongNoFrameskip-v4": 18.0}
# Tasks whose step costs microseconds: envpool's worker threads cost more in hand-offs than they save
# (the measurement: docs/notes/constants.md).
CHEAP_TASKS = frozenset({"CartPole-v0", "CartPole-v1", "Acrobot-v1", "MountainCar-v0", "MountainCarContinuous-v0",
                         "Pendulum-v1"})


@dataclass(frozen=True)
class TaskInfo:
    """One task: ``atari`` (an ale-py game, envpool style ``Pong-v5``), ``minatar`` (a MinAtar game,
    ``MinAtar/<Game>-v1``: 10x10 boolean images with a channel per object kind), ``threshold`` (None: none
    known), ``cheap`` (a step of microseconds: one envpool thread, in-process below 8 envs) and ``recipe``,
    the key of its published hyper-parameters (RL Zoo's: ``atari`` for every Atari game; the MinAtar
    paper's: ``minatar`` for every MinAtar game; else the env id)."""

    env_id: str
    threshold: float | None
    cheap: bool

    @cached_property
    def atari(self) -> bool:  # resolved on first use: it looks ale-py's registry up
        return is_atari(self.env_id)

    @property
    def minatar(self) -> bool:
        return self.env_id.startswith(MINATAR_PREFIX)

    @property
    def recipe(self) -> str:
        return "atari" if self.atari else "minatar" if self.minatar else self.env_id


MINATAR_PREFIX = "MinAtar/"


def register_minatar() -> None:
    """Make MinAtar's games known to gymnasium (``MinAtar/Breakout-v1``: the ``minatar`` package's own
    gymnasium environments, which it registers through an entry point gymnasium no longer loads by itself).
    Without the package: a ``ConfigError`` saying which extra installs it."""
    import gymnasium as gym

    from rlaccel_plugins.errors import missing_dependency

    if f"{MINATAR_PREFIX}Breakout-v1" in gym.registry:
        return
    try:
        from minatar.gym import register_envs
    except ModuleNotFoundError as error:
        raise (missing_dependency(error) or error) from None
    register_envs()


def ensure_registered(env_id: str) -> None:
    """Register the package behind ``env_id`` with gymnasium where it does not register itself (MinAtar)."""
    if env_id.startswith(MINATAR_PREFIX):
        register_minatar()


def register_ale() -> None:
    """Make ale-py's games known to gymnasium (``ALE/Pong-v5``)."""
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)


def is_atari(env_id: str) -> bool:
    """Whether ``env_id`` (envpool style, e.g. ``"Pong-v5"``) is an Atari game ale-py can run."""
    if importlib.util.find_spec("ale_py") is None:
        return False
    import gymnasium as gym

    register_ale()
    return f"ALE/{env_id}" in gym.registry


@cache
def task_info(env_id: str) -> TaskInfo:
    """The :class:`TaskInfo` of ``env_id`` (resolved once per process)."""
    return TaskInfo(env_id, THRESHOLDS.get(env_id), env_id in CHEAP_TASKS)
