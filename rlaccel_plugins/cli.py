"""The ``rlaccel`` command line. Sub-commands come from the ``rlaccel_add_commands`` hook."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rlaccel_plugins.errors import ConfigError


def build_parser() -> argparse.ArgumentParser:
    from rlaccel_plugins.plugins import get_plugin_manager

    parser = argparse.ArgumentParser(
        prog="rlaccel", description="Make existing SB3 and Tianshou agents train faster.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    get_plugin_manager().hook.rlaccel_add_commands(subparsers=subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rlaccel`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except (ConfigError, TypeError, ImportError) as exc:
        print(f"rlaccel {args.command}: error: {exc}", file=sys.stderr)
        return 2


# --------------------------------------------------------------------------- core commands
def add_core_commands(subparsers: argparse._SubParsersAction) -> None:
    presets = subparsers.add_parser("presets", help="list presets, or show one resolved as YAML",
                                    description="List the registered presets; `show NAME` prints one as YAML.")
    presets_sub = presets.add_subparsers(dest="presets_command", metavar="ACTION")
    show = presets_sub.add_parser("show", help="print a preset's resolved configuration as YAML",
                                  description="Print the resolved configuration of preset NAME as YAML.")
    show.add_argument("name", help="preset name, e.g. atari")
    show.set_defaults(func=cmd_presets_show)
    presets.set_defaults(func=cmd_presets_list)

    plugins = subparsers.add_parser("plugins", help="list loaded plugins, their versions and hooks",
                                    description="List loaded plugins (name, version, hooks) and adapters.")
    plugins.set_defaults(func=cmd_plugins)

    env = subparsers.add_parser("env", help="versions, hardware and the resolved 'auto' values",
                                description="Show library versions, cores, GPU and what 'auto' resolves to.")
    env.set_defaults(func=cmd_env)


def cmd_presets_list(args: argparse.Namespace) -> int:
    from rlaccel_plugins.presets import registry

    reg = registry()
    width = max(len(n) for n in reg.names())
    for name in reg.names():
        print(f"{name:<{width}}  {reg.describe(name)}")
    return 0


def cmd_presets_show(args: argparse.Namespace) -> int:
    import yaml

    from rlaccel_plugins.presets import get_preset

    print(yaml.safe_dump(get_preset(args.name).to_dict(), sort_keys=False, default_flow_style=None), end="")
    return 0


def cmd_plugins(args: argparse.Namespace) -> int:
    from rlaccel_plugins.plugins import get_plugin_manager

    manager = get_plugin_manager()
    print("plugins:")
    for name, version, hooks in manager.plugin_rows():
        print(f"  {name} {version}: {', '.join(hooks)}")
    for failure in manager.failures:
        print(f"  {failure.name}: NOT LOADED ({failure.reason})")
    print("adapters:")
    for adapter in manager.adapters:
        state = "available" if adapter.available else f"unavailable: {adapter.unavailable_reason}"
        print(f"  {adapter.name} ({adapter.framework}) {state}")
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    from rlaccel_plugins.plugins import get_plugin_manager

    report: dict[str, str] = {}
    for answer in reversed(get_plugin_manager().hook.rlaccel_env_report()):
        report.update(answer)
    width = max(len(k) for k in report)
    for key, value in report.items():
        print(f"{key:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
