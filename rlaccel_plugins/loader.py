"""`load_config`: a configuration from every source, and preset names resolved through the plugins.

Sources, later wins (values): preset -> config file (``RLACCEL_CONFIG`` or ``[tool.rlaccel]`` in the
nearest ``pyproject.toml``) -> keyword overrides. The preset itself is chosen by, first match wins:
the ``preset=`` argument, the ``RLACCEL_PRESET`` environment variable, the file's ``preset`` key,
else ``"default"`` (the article's values). Presets live in the plugin manager's registry, which the
``rlaccel_register_presets`` hook fills (built-ins first).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from rlaccel_plugins.config import AccelConfig, ReplayBufferConfig, find_project_config, read_config_file
from rlaccel_plugins.errors import ConfigError
from rlaccel_plugins.plugins import get_plugin_manager


def get_preset(name: str) -> AccelConfig:
    """The :class:`AccelConfig` of a preset.

    Examples:
        >>> import rlaccel_plugins as rla
        >>> rla.get_preset("atari").replay_buffer.level_capacity
        (1000, 5000, 20000, 100000)
    """
    return get_plugin_manager().presets.get(name)


def preset_names() -> list[str]:
    """Names of every registered preset, built-ins first."""
    return get_plugin_manager().presets.names()


def load_config(src: Any = None, *, preset: str | None = None, **overrides: Any) -> AccelConfig:
    """Load a configuration from every source, later wins.

    Args:
        src: ``None`` (look at ``RLACCEL_CONFIG`` then ``[tool.rlaccel]`` in the nearest
            pyproject.toml), a path to a YAML/TOML file, a mapping, or an :class:`AccelConfig`.
        preset: preset name; beats ``RLACCEL_PRESET`` and the file's ``preset`` key.
        **overrides: flat (``batch_size=64``) or section (``training={...}``) values, applied last.

    Examples:
        >>> import rlaccel_plugins as rla
        >>> rla.load_config(preset="atari", batch_size=256).training.batch_size
        256
    """
    if isinstance(src, AccelConfig):
        if preset is not None:
            raise ConfigError(f"preset must be None when src is a ready AccelConfig (it would be discarded), got "
                              f"preset={preset!r} with src=AccelConfig(preset={src.preset!r}). Pass one of the two.")
        return src.merged(overrides)
    file_values: dict[str, Any] = {}
    path = None  # the file the values come from, named in their errors
    if isinstance(src, Mapping):
        file_values = dict(src)
    else:
        source, path = (str(src), str(src)) if src is not None else _ambient_file()
        if source is not None:
            file_values = read_config_file(source)
    name = preset or _preset_set_by_user(file_values) or "default"
    file_values.pop("preset", None)
    base = get_preset(name)
    try:
        from_file = base.merged(file_values)
    except ConfigError as exc:
        if path is None:
            raise
        raise ConfigError(f"{exc} (in the config file {path})") from None
    return from_file.merged(overrides)


def _ambient_file() -> tuple[str | None, str | None]:
    """The config file a user set without code, and how its errors name it: ``RLACCEL_CONFIG``'s, else the nearest
    ``pyproject.toml`` with a ``[tool.rlaccel]`` table; (None, None) where there is none."""
    if os.environ.get("RLACCEL_CONFIG"):
        source = os.environ["RLACCEL_CONFIG"]
        return source, f"{source} (RLACCEL_CONFIG)"
    found = find_project_config()
    return (str(found), f"{found} [tool.rlaccel]") if found is not None else (None, None)


def _preset_set_by_user(file_values: Mapping[str, Any]) -> str | None:
    """The preset named outside the code: ``RLACCEL_PRESET``, else the config file's ``preset`` key."""
    return os.environ.get("RLACCEL_PRESET") or file_values.get("preset")


def ambient_preset() -> str | None:
    """The preset a user chose without code (``RLACCEL_PRESET``, the ``preset`` key of ``RLACCEL_CONFIG``'s file
    or of ``[tool.rlaccel]``), or None where they chose none.

    Examples:
        >>> import os
        >>> os.environ["RLACCEL_PRESET"] = "atari"
        >>> ambient_preset()
        'atari'
        >>> del os.environ["RLACCEL_PRESET"]
    """
    if os.environ.get("RLACCEL_PRESET"):
        return os.environ["RLACCEL_PRESET"]
    source, _ = _ambient_file()
    return _preset_set_by_user(read_config_file(source)) if source is not None else None


def resolve_replay_config(capacity: int, num_envs: int = 1, preset: str | None = None,
                          **overrides: Any) -> ReplayBufferConfig:
    """The tiers a framework buffer of ``capacity`` transitions gets from the ambient configuration.

    For buffers SB3 or Tianshou build from a class name (the config-flag feature: ``RLACCEL_PRESET``,
    ``RLACCEL_CONFIG``, ``[tool.rlaccel]``): the preset in effect is :func:`load_config`'s (the argument,
    then the environment, then the file). ``level_capacity`` in ``overrides`` wins and sets the capacity;
    else the tiers are sized by :func:`~rlaccel_plugins.replay.sizing.tiers_for_capacity`. Other overrides
    (ratios, schedule, beta) apply on top.
    """
    from rlaccel_plugins.replay.sizing import tiers_for_capacity

    given = {k: v for k, v in overrides.items() if v is not None}
    config = load_config(preset=preset, **given)
    if "level_capacity" in given:
        return config.replay_buffer
    return tiers_for_capacity(config.replay_buffer, capacity, num_envs, preset=config.preset)
