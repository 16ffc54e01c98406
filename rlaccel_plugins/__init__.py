"""rlaccel: make existing Stable-Baselines3 and Tianshou agents train faster.

The public names load lazily, so ``import rlaccel_plugins`` stays light: it imports
neither torch, SB3, Tianshou nor envpool until a name that needs them is used.

Examples:
    >>> import rlaccel_plugins as rla
    >>> rla.get_preset("atari").training.batch_size
    512
"""

from __future__ import annotations

from rlaccel_plugins.hookspecs import hookimpl
from rlaccel_plugins.lazy import lazy_exports

__version__ = "0.2.0"

_LAZY = {
    "AccelConfig": "rlaccel_plugins.config",
    "ConfigError": "rlaccel_plugins.errors",
    "RlaccelWarning": "rlaccel_plugins.errors",
    "load_config": "rlaccel_plugins.loader",
    "get_preset": "rlaccel_plugins.loader",
    "preset_names": "rlaccel_plugins.loader",
    "accelerate": "rlaccel_plugins.plugins",
    "get_plugin_manager": "rlaccel_plugins.plugins",
    "make_vec_env": "rlaccel_plugins.parallel.factory",
    "TieredReplay": "rlaccel_plugins.replay",
    "SparseDenseUpdater": "rlaccel_plugins.updates",
}

__all__ = ["hookimpl", *_LAZY]  # noqa: PLE0604 - the lazy table is the one list of public names


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
