"""What rlaccel knows about a task, in one place: resolved once per env id, carried on a run's spec.

Examples:
    >>> from rlaccel_plugins.tasks import task_info
    >>> info = task_info("CartPole-v1")
    >>> info.threshold, info.cheap, info.atari, info.recipe
    (475.0, True, False, 'CartPole-v1')
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
    """One task: ``atari`` (an ale-py game, envpool style ``Pong-v5``), ``threshold`` (None: none known),
    ``cheap`` (a step of microseconds: one envpool thread, in-process below 8 envs) and ``recipe``, the key
    of its published hyper-parameters (RL Zoo's: ``atari`` for every Atari game, else the env id)."""

    env_id: str
    threshold: float | None
    cheap: bool

    @cached_property
    def atari(self) -> bool:  # resolved on first use: it looks ale-py's registry up
        return is_atari(self.env_id)

    @property
    def recipe(self) -> str:
        return "atari" if self.atari else self.env_id


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
