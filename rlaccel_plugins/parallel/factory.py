"""`make_vec_env`: one call for a batched environment, whichever backend can run the task."""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from typing import Any

from rlaccel_plugins.errors import ConfigError, did_you_mean, invalid
from rlaccel_plugins.tasks import task_info

BACKENDS = ("auto", "envpool", "gymnasium")


@lru_cache(maxsize=1)
def envpool_env_ids() -> frozenset[str]:
    """Task ids envpool can run here (empty when envpool is not installed)."""
    if importlib.util.find_spec("envpool") is None:
        return frozenset()
    import envpool

    return frozenset(envpool.list_all_envs())




def envpool_threads(env_id: str, num_envs: int) -> int:
    """Worker threads for an envpool of ``num_envs`` copies of ``env_id``: 1 for microsecond tasks,
    one per core (at most one per env) otherwise.

    Examples:
        >>> envpool_threads("CartPole-v1", 16)
        1
    """
    from rlaccel_plugins.hardware import cpu_count

    return 1 if task_info(env_id).cheap else max(1, min(num_envs, cpu_count()))


# Below this many envs a microsecond task steps faster in-process than through envpool's hand-offs (the
# measurement: docs/notes/constants.md)
ENVPOOL_MIN_ENVS_FOR_CHEAP_TASKS = 8


def envpool_pays(env_id: str, num_envs: int) -> bool:
    """Whether envpool is the faster way to step ``num_envs`` copies of ``env_id`` (and can run it)."""
    if env_id not in envpool_env_ids():
        return False
    return not task_info(env_id).cheap or num_envs >= ENVPOOL_MIN_ENVS_FOR_CHEAP_TASKS


def choose_backend(env_id: str, backend: str, num_envs: int | None = None) -> str:
    """The backend to use for ``env_id``: envpool when asked for, or for ``auto`` when it supports the
    task and pays at ``num_envs`` (unknown: assume it does); gymnasium otherwise."""
    if backend not in BACKENDS:
        raise invalid("backend", f"be one of {list(BACKENDS)}", backend, did_you_mean(backend, BACKENDS).strip())
    if backend == "envpool" and env_id not in envpool_env_ids():
        hint = did_you_mean(env_id, envpool_env_ids()) or " Use backend='gymnasium'."
        raise ConfigError(f"env_id must be a task envpool supports, got env_id={env_id!r}.{hint}")
    if backend == "auto":
        pays = env_id in envpool_env_ids() if num_envs is None else envpool_pays(env_id, num_envs)
        return "envpool" if pays else "gymnasium"
    return backend


def make_vec_env(env_id: str, num_envs: int | str = "auto", backend: str = "auto", seed: int = 0,
                 config: Any = None, **env_kwargs: Any) -> Any:
    """Build a gymnasium-API vector env of ``num_envs`` copies of ``env_id``.

    Plugins may answer first through the ``rlaccel_make_env`` hook; the built-in answer uses envpool
    when it supports the task, and gymnasium's vector envs otherwise.

    Examples:
        >>> import rlaccel_plugins as rla
        >>> env = rla.make_vec_env("CartPole-v1", num_envs=4, backend="gymnasium")
        >>> env.num_envs
        4
        >>> env.close()
    """
    from rlaccel_plugins.hardware import resolve_auto
    from rlaccel_plugins.loader import load_config
    from rlaccel_plugins.plugins import get_plugin_manager

    config = load_config(config) if config is not None else load_config(preset="default")
    if num_envs == "auto":
        num_envs = resolve_auto(config.merged({"parallel_envs": "auto"})).parallel_envs
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
        raise invalid("num_envs", 'be a positive integer or "auto"', num_envs)
    env = get_plugin_manager().hook.rlaccel_make_env(env_id=env_id, num_envs=num_envs, backend=backend,
                                                     seed=seed, config=config, env_kwargs=env_kwargs)
    if env is None:
        raise ConfigError(f"backend must be one a plugin provides, got backend={backend!r}. "
                          f"Built-in backends: {list(BACKENDS)}.")
    return env


def build_builtin_env(env_id: str, num_envs: int, backend: str, seed: int, env_kwargs: dict) -> Any:
    """The built-in answer to ``rlaccel_make_env`` (None for a backend it does not know).

    Atari games (envpool-style ids such as ``"Pong-v5"``) get the same preprocessing on both backends
    (:class:`~rlaccel_plugins.parallel.atari.AtariOptions`; pass ``atari=AtariOptions(...)`` or a dict);
    ``atari=False`` leaves it out (the caller's kwargs are the backend's own, e.g. envpool's).
    """
    from rlaccel_plugins.parallel.atari import AtariOptions

    if backend not in BACKENDS:
        return None
    atari = env_kwargs.pop("atari", None)
    if atari is False:
        atari = None
    elif atari is not None or task_info(env_id).atari:
        atari = atari if isinstance(atari, AtariOptions) else AtariOptions(**(atari or {}))
    if choose_backend(env_id, backend, num_envs) == "envpool":
        import envpool

        extra = atari.envpool_kwargs() if atari is not None else {}
        extra["num_threads"] = envpool_threads(env_id, num_envs)
        return _seeded_spaces(envpool.make_gymnasium(env_id, num_envs=num_envs, seed=seed, **{**extra, **env_kwargs}),
                              seed)
    import gymnasium as gym

    mode = env_kwargs.pop("vectorization_mode", "async" if atari is not None else "sync")
    if atari is not None:  # emulators are slow enough to pay for processes
        make = [lambda: atari.gymnasium_env(env_id) for _ in range(num_envs)]
        env: Any = gym.vector.AsyncVectorEnv(make) if mode == "async" else gym.vector.SyncVectorEnv(make)
        env.reset(seed=seed)
        return _seeded_spaces(env, seed)
    try:
        env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode=mode, **env_kwargs)
    except gym.error.Error as exc:
        raise ConfigError(f"env_id must be a registered gymnasium task, got env_id={env_id!r}: {exc}") from None
    env.reset(seed=seed)
    return _seeded_spaces(env, seed)


def _seeded_spaces(env: Any, seed: int) -> Any:
    """``env`` with its action space seeded too: a collector's random warm-up (Tianshou draws from a vector
    env's ``action_space``) then draws the same actions for the same ``seed``."""
    env.action_space.seed(seed)
    return env
