"""The plugin manager: built-ins, entry points (group ``rlaccel``), adapters and ``accelerate``."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pluggy

from rlaccel_plugins import hookspecs
from rlaccel_plugins.errors import ConfigError, did_you_mean
from rlaccel_plugins.presets import PresetRegistry

logger = logging.getLogger("rlaccel")

ENTRY_POINT_GROUP = "rlaccel"
DISABLE_AUTOLOAD_ENV = "RLACCEL_DISABLE_PLUGIN_AUTOLOAD"
BUILTIN_PLUGINS = ("rlaccel_plugins.presets", "rlaccel_plugins.builtins")


@dataclass
class AdapterSpec:
    """A framework adapter: what it handles and where its code lives (imported only when used).

    Attributes:
        name: short registry key, e.g. ``"sb3"``.
        framework: import name of the framework, e.g. ``"stable_baselines3"``.
        supports: human description of the objects it accelerates (for error messages).
        accelerate: ``"module:function"`` implementing ``accelerate(obj, preset=None, **overrides)``.
        install_hint: the pip command that installs the framework.
        train: ``"module:callable"`` that builds a :class:`~rlaccel_plugins.training.TrainingRun` from a
            ``TrainSpec``, for ``rlaccel train`` (optional; the core's template runs it).
        export: ``"module:function"`` implementing ``export(model_path, onnx_path) -> dict`` for
            ``rlaccel export`` (optional).
        algos: what ``rlaccel train --algo`` may name, each ``"module:Class"`` (imported only when
            used): checked before the framework is imported.
        verified: ``"module:attribute"`` naming the adapter's
            :class:`~rlaccel_plugins.fused.fingerprints.VerifiedCode`: the framework methods its fused and
            lean paths replace or mirror, and the record of the code they were verified against (optional).
        recipes: ``"module:function"`` implementing ``recipes(algo, env_id) -> dict``: the published
            hyper-parameters the adapter trains a task with (SB3's: RL Zoo's), where the core needs them
            (the learning study's replay-volume sweep) (optional).
    """

    name: str
    framework: str
    supports: str
    accelerate: str
    install_hint: str = ""
    train: str | None = None
    export: str | None = None
    verified: str | None = None
    recipes: str | None = None
    algos: Mapping[str, str] = field(default_factory=dict)
    unavailable_reason: str | None = field(default=None, init=False)

    @property
    def available(self) -> bool:
        return self.unavailable_reason is None

    def check_algo(self, algo: str, elsewhere: str = "") -> None:
        """Refuse an ``algo`` ``rlaccel train`` cannot build with this adapter, before the framework is imported
        (``elsewhere``: the adapter that can, for the hint).

        Examples:
            >>> AdapterSpec("x", "x", "", "", algos={"dqn": "m:DQN"}).check_algo("dqnn")
            Traceback (most recent call last):
            ...
            rlaccel_plugins.errors.ConfigError: algo must be one of ['dqn'] for --framework x, got algo='dqnn'. Did you mean 'dqn'?
        """
        if algo not in self.algos:
            hint = f" Use --framework {elsewhere} for it." if elsewhere else did_you_mean(algo, self.algos)
            raise ConfigError(f"algo must be one of {sorted(self.algos)} for --framework {self.name}, got "
                              f"algo={algo!r}.{hint}")

    def algo_class(self, algo: str) -> type:
        """The class ``algo`` names (see :meth:`check_algo`)."""
        self.check_algo(algo)
        module, _, name = self.algos[algo].partition(":")
        return getattr(importlib.import_module(module), name)

    def load(self, entry: str = "accelerate") -> Callable[..., Any]:
        """Import the adapter object named by ``entry`` (``"accelerate"``, ``"train"``, ``"export"``,
        ``"verified"`` or ``"recipes"``)."""
        if not self.available:
            raise ConfigError(f"framework {self.name!r} must be installed to use it, got {self.unavailable_reason}. "
                              f"{self.install_hint}".rstrip())
        target = getattr(self, entry)
        if target is None:
            raise ConfigError(f"framework {self.name!r} must support {entry!r}, got an adapter without it. "
                              "Use another framework for this command.")
        module, _, attr = target.partition(":")
        return getattr(importlib.import_module(module), attr)


class AdapterRegistry:
    """Registry filled by ``rlaccel_register_adapters``; marks adapters whose framework is missing."""

    def __init__(self) -> None:
        self._adapters: dict[str, AdapterSpec] = {}

    def add(self, spec: AdapterSpec) -> None:
        if importlib.util.find_spec(spec.framework) is None:
            spec.unavailable_reason = f"{spec.framework} is not installed"
            logger.info("rlaccel: skipping adapter %r: %s", spec.name, spec.unavailable_reason)
        self._adapters[spec.name] = spec

    def check_algo(self, name: str, algo: str) -> None:
        """:meth:`AdapterSpec.check_algo` of adapter ``name``, naming another adapter that builds ``algo``."""
        elsewhere = next((other for other, spec in self._adapters.items() if other != name and algo in spec.algos), "")
        self.get(name).check_algo(algo, elsewhere)

    def get(self, name: str) -> AdapterSpec:
        if name not in self._adapters:
            raise KeyError(f"no adapter named {name!r}.{did_you_mean(name, self._adapters)}")
        return self._adapters[name]

    def __iter__(self):
        return iter(self._adapters.values())

    def __len__(self) -> int:
        return len(self._adapters)


@dataclass
class PluginFailure:
    name: str
    reason: str


class RlaccelPluginManager(pluggy.PluginManager):
    """pluggy's manager plus the registries and a record of plugins that failed to load."""

    def __init__(self) -> None:
        super().__init__(hookspecs.PROJECT)
        self.add_hookspecs(hookspecs)
        self.failures: list[PluginFailure] = []
        self.versions: dict[str, str] = {}
        self._adapters: AdapterRegistry | None = None
        self._presets: PresetRegistry | None = None

    def load_builtins(self) -> None:
        for module_name in BUILTIN_PLUGINS:
            self.register(importlib.import_module(module_name), name=module_name)

    def load_entry_points(self) -> None:
        """Load every ``rlaccel`` entry point; one that fails to import is skipped and logged."""
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            if self.has_plugin(ep.name) or self.is_blocked(ep.name):
                continue
            try:
                plugin = ep.load()
            except Exception as exc:  # noqa: BLE001 - a broken third-party plugin must not break rlaccel
                self.failures.append(PluginFailure(ep.name, f"{type(exc).__name__}: {exc}"))
                logger.warning("rlaccel: skipping plugin %r: %s", ep.name, exc)
                continue
            self.register(plugin, name=ep.name)
            dist = getattr(ep, "dist", None)
            if dist is not None:
                self.versions[ep.name] = dist.version

    @property
    def adapters(self) -> AdapterRegistry:
        if self._adapters is None:
            self._adapters = AdapterRegistry()
            self.hook.rlaccel_register_adapters(registry=self._adapters)
        return self._adapters

    @property
    def presets(self) -> PresetRegistry:
        """Every preset, filled through ``rlaccel_register_presets`` (built-ins first)."""
        if self._presets is None:
            presets = PresetRegistry()
            self.hook.rlaccel_register_presets(registry=presets)  # a bad plugin preset raises here, every time
            self._presets = presets
        return self._presets

    def plugin_rows(self) -> list[tuple[str, str, list[str]]]:
        """``(name, version, hooks)`` of every registered plugin, for ``rlaccel plugins``."""
        rows = []
        for name, plugin in self.list_name_plugin():
            hooks = sorted(h.name for h in self.get_hookcallers(plugin) or [])
            rows.append((name, self.versions.get(name) or _own_version(), hooks))
        return rows


def _own_version() -> str:
    try:
        return importlib.metadata.version("rlaccel-plugins")
    except importlib.metadata.PackageNotFoundError:
        return "dev"


_manager: RlaccelPluginManager | None = None


def get_plugin_manager() -> RlaccelPluginManager:
    """The process-wide plugin manager (built on first use).

    Entry points are loaded unless ``RLACCEL_DISABLE_PLUGIN_AUTOLOAD`` is set to a non-empty value
    other than ``0``.
    """
    global _manager
    if _manager is None:
        manager = RlaccelPluginManager()
        manager.load_builtins()
        if os.environ.get(DISABLE_AUTOLOAD_ENV, "") in ("", "0"):
            manager.load_entry_points()
        _manager = manager
    return _manager


def reset_plugin_manager() -> None:
    """Forget the manager and every registry (the next use rebuilds them); for tests and notebooks."""
    global _manager
    _manager = None


def accelerate(obj: Any, preset: str | None = None, **overrides: Any) -> Any:
    """Accelerate an SB3 model or a Tianshou algorithm with the adapter that recognises it.

    Args:
        obj: e.g. a ``stable_baselines3.DQN`` or a ``tianshou.algorithm.DQN``.
        preset: preset name (see :func:`rlaccel_plugins.preset_names`).
        **overrides: config values on top of the preset.

    Returns:
        Whatever the adapter returns (see ``rlaccel_sb3.accelerate``, ``rlaccel_tianshou.accelerate``).

    Raises:
        TypeError: no adapter recognises ``obj``; the message lists the supported types.

    Examples:
        >>> import rlaccel_plugins as rla
        >>> rla.accelerate(object())
        Traceback (most recent call last):
        ...
        TypeError: accelerate() does not know objects of type 'object'. ...
    """
    manager = get_plugin_manager()
    name = manager.hook.rlaccel_detect_framework(obj=obj)
    if name is None:
        supported = "; ".join(f"{a.supports} ({a.name})" for a in manager.adapters) or "none registered"
        raise TypeError(f"accelerate() does not know objects of type {type(obj).__qualname__!r}. "
                        f"Supported: {supported}. Pass a model or algorithm of an installed framework.")
    return manager.adapters.get(name).load("accelerate")(obj, preset=preset, **overrides)


def mro_names(obj: Any) -> set[str]:
    """``{"module.QualName", ...}`` for the class of ``obj`` and its bases, without importing anything."""
    return {f"{cls.__module__}.{cls.__qualname__}" for cls in type(obj).__mro__}
