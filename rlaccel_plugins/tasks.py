"""What rlaccel knows about a task, in one place: resolved once per env id, carried on a run's spec.

Examples:
    >>> from rlaccel_plugins.tasks import task_info
    >>> info = task_info("CartPole-v1")
    >>> info.threshold, info.cheap, info.family, info.recipe
    (475.0, True, 'classic_control', 'CartPole-v1')
    >>> task_info("MinAtar/Breakout-v1").family, task_info("MinAtar/Breakout-v1").recipe  # the MinAtar paper's DQN
    ('minatar', 'minatar')
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


# families whose games share one published recipe (the key of their hyper-parameters) and image observations
PIXEL_FAMILIES = ("atari", "minatar")


@dataclass(frozen=True)
class TaskInfo:
    """One task: ``threshold`` (None: none known), ``cheap`` (a step of microseconds: one envpool thread,
    in-process below 8 envs), ``family`` and ``recipe``, the key of its published hyper-parameters (RL Zoo's:
    ``atari`` for every Atari game; the MinAtar paper's: ``minatar`` for every MinAtar game; else the env id).

    ``family`` is ``atari`` (an ale-py game, envpool style ``Pong-v5``), ``minatar`` (``MinAtar/<Game>-v1``:
    10x10 boolean images with a channel per object kind), gymnasium's own group for its tasks
    (``classic_control``, ``box2d``, ``mujoco``, ``toy_text``) or ``other``."""

    env_id: str
    threshold: float | None
    cheap: bool

    @cached_property
    def family(self) -> str:  # resolved on first use: it looks gymnasium's and ale-py's registries up
        if self.env_id.startswith(MINATAR_PREFIX):
            return "minatar"
        if is_atari(self.env_id):
            return "atari"
        import gymnasium as gym

        entry = getattr(gym.registry.get(self.env_id), "entry_point", None)
        parts = entry.split(":")[0].split(".") if isinstance(entry, str) else []
        return parts[2] if parts[:2] == ["gymnasium", "envs"] and len(parts) > 2 else "other"

    @property
    def atari(self) -> bool:
        return self.family == "atari"

    @property
    def minatar(self) -> bool:
        return self.family == "minatar"

    @property
    def pixels(self) -> bool:
        """Image observations: a family with a recipe (and a network) of its own."""
        return self.family in PIXEL_FAMILIES

    @property
    def recipe(self) -> str:
        return self.family if self.pixels else self.env_id


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
    """The :class:`TaskInfo` of ``env_id`` (resolved once per process): every fact rlaccel keeps about a task.

    Examples:
        >>> task_info("Pendulum-v1").threshold, task_info("HalfCheetah-v5").family
        (-200.0, 'mujoco')
    """
    return TaskInfo(env_id, THRESHOLDS.get(env_id), env_id in CHEAP_TASKS)
