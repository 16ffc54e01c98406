"""The reference parts of the docs, generated from the code: every config key (its default and its
docstring in :mod:`rlaccel_plugins.config`), every registered preset, every CLI command and flag.

The docs site calls these through its build hook (``docs/hooks.py``), so a page never copies a
default or a flag by hand; ``tests/core/test_docs.py`` fails when a key or a flag has no documentation.

Examples:
    >>> from rlaccel_plugins.reference import config_keys
    >>> key = next(k for k in config_keys() if k.name == "batch_size")
    >>> key.section, key.default
    ('training', '512')
"""

from __future__ import annotations

import argparse
import ast
import inspect
import itertools
import json
from dataclasses import MISSING, dataclass, fields
from typing import Any

from rlaccel_plugins import config as config_module


@dataclass(frozen=True)
class ConfigKey:
    """One configuration key: its section, name, default (as YAML would write it) and docstring."""

    section: str
    name: str
    default: str
    doc: str


def _attribute_docs(cls: type) -> dict[str, str]:
    """The docstrings written under a dataclass's fields (the string literal after each field)."""
    body = ast.parse(inspect.getsource(cls)).body[0].body  # type: ignore[attr-defined]
    docs = {}
    for field_node, after in itertools.pairwise(body):
        if (isinstance(field_node, ast.AnnAssign) and isinstance(field_node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[field_node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _yaml_value(value: Any) -> str:
    if isinstance(value, tuple):
        value = list(value)
    return json.dumps(value) if not isinstance(value, str) else value


def config_keys() -> list[ConfigKey]:
    """Every key of every config section, in declaration order."""
    keys = []
    for section, cls in config_module.SECTIONS.items():
        docs = _attribute_docs(cls)
        for f in fields(cls):
            default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc,operator]
            keys.append(ConfigKey(section, f.name, _yaml_value(default), docs.get(f.name, "")))
    return keys


def config_markdown() -> str:
    """One table per section: key, default, what it does."""
    out, section = [], None
    for key in config_keys():
        if key.section != section:
            section = key.section
            doc = inspect.cleandoc(config_module.SECTIONS[section].__doc__ or "")
            out += ["", f"### `{section}`", "", doc, "", "| key | default | what it does |", "|---|---|---|"]
        out.append(f"| `{key.name}` | `{key.default}` | {key.doc.replace('|', '&#124;')} |")
    return "\n".join(out).strip() + "\n"


def presets_markdown() -> str:
    """Every registered preset: its description and the values it sets on top of the defaults."""
    from rlaccel_plugins.plugins import get_plugin_manager

    registry = get_plugin_manager().presets
    rows = ["| preset | what it is for | values it sets |", "|---|---|---|"]
    for name in registry.names():
        values = registry._presets[name][1]
        flat = "; ".join(f"`{section}.{key}: {_yaml_value(value)}`" for section, table in values.items()
                         for key, value in table.items()) or "none: the defaults"
        rows.append(f"| `{name}` | {registry.describe(name)} | {flat} |")
    return "\n".join(rows) + "\n"


def _subcommands(parser: argparse.ArgumentParser, prefix: str) -> list[tuple[str, str, argparse.ArgumentParser]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                found.append((f"{prefix} {name}", helps.get(name) or "", sub))
                found += _subcommands(sub, f"{prefix} {name}")
    return found


def cli_options(parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
    """(flags, help as ``--help`` prints it) of each option and positional of ``parser`` (not its
    sub-commands, not ``--help``)."""
    formatter = parser._get_formatter()
    out = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        flags = ", ".join(action.option_strings) or action.dest
        out.append((flags, formatter._expand_help(action) if action.help else ""))
    return out


def cli_commands() -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(command line, one-line help, parser) of every ``rlaccel`` sub-command, plugins' included."""
    from rlaccel_plugins.cli import build_parser

    return _subcommands(build_parser(), "rlaccel")


def cli_markdown() -> str:
    """Each command: what it does, then a table of its flags with their help."""
    out = []
    for command, summary, parser in cli_commands():
        out += [f"### `{command}`", "", summary[:1].upper() + summary[1:] + ".", ""]
        options = cli_options(parser)
        if options:
            out += ["| flag | what it does |", "|---|---|"]
            out += [f"| `{flags}` | {text.replace('|', '&#124;')} |" for flags, text in options]
            out.append("")
    return "\n".join(out)


def verified_markdown() -> str:
    """Per adapter: the framework versions its fused and lean paths were verified against, and the
    framework methods each path replaces or mirrors (their fingerprints are in ``verified.json``)."""
    from rlaccel_plugins.fused.fingerprints import Record, _adapters_code

    out = []
    for name, code in _adapters_code().items():
        record = Record.load(code.record_path)
        versions = "; ".join(f"{dist} {', '.join(v)}" for dist, v in sorted(record.versions.items()))
        out += [f"### {name}", "", f"Verified against {versions}.", "", "| path | framework methods |", "|---|---|"]
        for key, replacement in code.replacements.items():
            targets = ", ".join(f"`{t.split(':', 1)[1]}`" for t in replacement.targets)
            out.append(f"| `{key}` | {targets} |")
        out.append("")
    return "\n".join(out)


PUBLIC_PACKAGES = ("rlaccel_plugins", "rlaccel_sb3", "rlaccel_tianshou")


def public_names() -> dict[str, list[str]]:
    """Each public package's public names as ``module.name`` paths of where they are defined."""
    import importlib

    out = {}
    for package in PUBLIC_PACKAGES:
        try:
            module = importlib.import_module(package)
        except ImportError:  # an adapter whose framework is not installed
            continue
        paths = []
        for name in module.__all__:
            obj = getattr(module, name)
            home = getattr(obj, "__module__", None) or package
            if not home.startswith(PUBLIC_PACKAGES):  # re-exported from elsewhere (pluggy's hookimpl)
                continue
            paths.append(f"{home}.{getattr(obj, '__qualname__', name)}")
        out[package] = paths
    return out


def api_markdown() -> str:
    """mkdocstrings directives for every public name, package by package, then the plugin hooks."""
    out = []
    for package, paths in public_names().items():
        out += [f"## `{package}`", ""]
        for path in paths:
            out += [f"::: {path}", "    options:", "      heading_level: 3", ""]
    out += ["## Plugin hooks", "", "::: rlaccel_plugins.hookspecs", "    options:", "      heading_level: 3",
            "      show_root_heading: false", ""]
    return "\n".join(out)
