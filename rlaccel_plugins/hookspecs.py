"""Hook specifications of rlaccel's plugin system (pluggy project ``"rlaccel"``).

Built-in features register through these same hooks, and so can third-party packages: expose a
module with ``@rlaccel_plugins.hookimpl`` functions under the entry-point group ``rlaccel``.
No hook is called per gradient step or per env step: they run at start-up and set-up time only.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from rlaccel_plugins.config import AccelConfig
    from rlaccel_plugins.plugins import AdapterRegistry
    from rlaccel_plugins.presets import PresetRegistry

PROJECT = "rlaccel"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def rlaccel_register_presets(registry: PresetRegistry) -> None:
    """Add named presets with ``registry.add(name, values, description)``.

    Called once, when the preset registry is first needed. Returns nothing.
    """


@hookspec
def rlaccel_register_adapters(registry: AdapterRegistry) -> None:
    """Add framework adapters with ``registry.add(AdapterSpec(...))``.

    Called once, when the adapter registry is first needed. An adapter whose framework is not
    installed is kept but marked unavailable, with the reason logged. Returns nothing.
    """


@hookspec(firstresult=True)
def rlaccel_detect_framework(obj: Any) -> str | None:
    """Name the adapter that handles ``obj``.

    Called by :func:`rlaccel_plugins.accelerate` for each object it is given; the first non-None
    answer wins. Implementations must not import their framework just to answer.
    Returns the adapter's registry name (e.g. ``"sb3"``), or ``None``.
    """


@hookspec(firstresult=True)
def rlaccel_make_env(env_id: str, num_envs: int, backend: str, seed: int, config: AccelConfig,
                     env_kwargs: dict[str, Any]) -> Any | None:
    """Build a vectorised environment for ``env_id`` with ``num_envs`` copies, or return ``None``.

    Called by :func:`rlaccel_plugins.make_vec_env`; the first non-None answer wins. ``backend`` is
    the requested backend (``"auto"``, ``"envpool"``, ``"gymnasium"`` or a plugin's own name).
    Returns a gymnasium-API vector env, or ``None`` to let the next plugin answer.
    """


@hookspec
def rlaccel_add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Add sub-commands to the ``rlaccel`` command line.

    Called once when the CLI starts. Use ``subparsers.add_parser(name, help=...)`` and set the
    parser's ``func`` default to a callable ``func(args) -> int`` (the exit code). Returns nothing.
    """


@hookspec
def rlaccel_env_report() -> dict[str, str]:  # type: ignore[empty-body]  # a hook specification
    """Describe this plugin's view of the machine for ``rlaccel env``.

    Called once per ``rlaccel env``; answers are shown in plugin registration order.
    Returns ``{label: value}`` lines (versions, hardware, resolved ``auto`` values).
    """
