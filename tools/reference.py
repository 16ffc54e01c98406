"""The reference parts of the docs, generated from the code: every config key (its default and its
docstring in :mod:`rlaccel_plugins.config`), every registered preset, every CLI command and flag.

The docs site calls these through its build hook (``docs/hooks.py``), so a page never copies a
default or a flag by hand; ``tests/core/test_docs.py`` fails when a key or a flag has no documentation.

Examples:
    >>> from tools.reference import config_keys
    >>> key = next(k for k in config_keys() if k.name == "batch_size")
    >>> key.section, key.default
    ('training', '512')
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import inspect
import itertools
import json
import re
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
    from rlaccel_plugins.fused.fingerprints import Record, adapters_code

    out = []
    for name, code in adapters_code().items():
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


# ------------------------------------------------------------------ the problems page
@dataclass(frozen=True)
class Problem:
    """One message the package can print or raise: its kind, where, and its text (``…`` where a value goes)."""

    kind: str        # "error", "warning" (RlaccelWarning) or "log" (a warning logged on the ``rlaccel`` logger)
    where: str       # the module, e.g. "rlaccel_sb3.buffers"
    text: str


def _template(node: ast.AST) -> str | None:
    """The text of a message expression: constants kept, every computed part shown as ``…``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(str(v.value) if isinstance(v, ast.Constant) else "…" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _template(node.left), _template(node.right)
        return None if left is None and right is None else (left or "…") + (right or "…")
    return None


def _message(call: ast.Call) -> tuple[str, str] | None:
    """``(kind, text)`` of a call that raises or prints a message, or None."""
    name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
    if name == "invalid" and len(call.args) >= 2:
        param, must = _template(call.args[0]) or "…", _template(call.args[1]) or "…"
        fix = _template(call.args[3]) if len(call.args) > 3 else ""
        return "error", f"{param} must {must}, got {param}=…. {fix or ''}".strip()
    if name == "ConfigError" and call.args:
        return "error", _template(call.args[0]) or "…"
    if name == "warn" and len(call.args) >= 2 and getattr(call.args[1], "id", "") == "RlaccelWarning":
        return "warning", _template(call.args[0]) or "…"
    if name == "warning" and isinstance(call.func, ast.Attribute) and call.args:
        text = _template(call.args[0]) or "…"
        return "log", re.sub(r"%[-0-9.]*[sdrf]", "…", text)
    return None


def problems() -> list[Problem]:
    """Every error, RlaccelWarning and logged warning the core and both adapters can produce, read from their
    source (so the page lists what the code says, not a copy)."""
    from pathlib import Path

    import rlaccel_plugins

    roots = [Path(rlaccel_plugins.__file__).parent]
    for adapter in ("rlaccel_sb3", "rlaccel_tianshou"):
        spec = importlib.util.find_spec(adapter)
        if spec is not None and spec.origin:
            roots.append(Path(spec.origin).parent)
    found = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            module = ".".join((root.name, *path.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and (message := _message(node)):
                    found.append(Problem(message[0], module, " ".join(message[1].split())))
    return list(dict.fromkeys(found))


def problems_markdown() -> str:
    """One table per kind: where the message comes from and what it says (its fix is part of it)."""
    titles = {"warning": "Warnings (`RlaccelWarning`)", "log": "Logged warnings (the `rlaccel` logger)",
              "error": "Errors (`ConfigError`, a `ValueError`)"}
    out = []
    every = problems()
    for kind, title in titles.items():
        # a message built wholly elsewhere (a helper's ``ConfigError(message)``) shows there, with its words
        rows = [p for p in every if p.kind == kind and re.search(r"[A-Za-z]", p.text)]
        out += ["", f"### {title}", "", "| from | message (… stands for a value) |", "|---|---|"]
        out += [f"| `{p.where}` | {_table_text(p.text)} |" for p in rows]
    return "\n".join(out).lstrip("\n")


def _table_text(text: str) -> str:
    """A message as a table cell: pipes and angle brackets escaped, and a word joiner after a placeholder glued
    to a word (``…=auto``), where a browser would otherwise break the line."""
    joined = re.sub(r"…(?=[^\s.,:;)])", "…\u2060", text)
    return joined.replace("|", "&#124;").replace("<", "&lt;")


# ------------------------------------------------------------------ the support table
def support_markdown(adapter: str = "rlaccel_sb3") -> str:
    """An adapter's fused-path registry as a table (``<adapter>.fused.registry``), or a note without it."""
    try:  # the adapters are optional: the core never imports one by name
        registry = importlib.import_module(f"{adapter}.fused.registry")
    except ImportError:
        return f"*({adapter} is not installed here)*"
    return registry.support_markdown()


# ------------------------------------------------------------------ the installation page
DISTRIBUTION = "rlaccel-plugins"


def install_markdown() -> str:
    """What ``pip install rlaccel-plugins[...]`` brings: the Python it needs, the core requirements and each
    extra's, read from the installed package's metadata."""
    from importlib import metadata

    info = metadata.metadata(DISTRIBUTION)
    core: list[str] = []
    extras: dict[str, list[str]] = {name: [] for name in info.get_all("Provides-Extra") or []}
    for line in metadata.requires(DISTRIBUTION) or []:
        requirement, _, marker = line.partition(";")
        found = re.search(r'extra == "([^"]+)"', marker)
        if found:
            extras[found.group(1)].append(requirement.strip())
        else:
            core.append(line.strip())
    out = [f"{platform_markdown()} Always installed: " + ", ".join(f"`{r}`" for r in core) + ".", "",
           "| extra | installs |", "|---|---|"]
    out += [f"| `{name}` | " + ", ".join(f"`{r}`" for r in requirements) + " |" for name, requirements in extras.items()]
    return "\n".join(out)


def platform_markdown() -> str:
    """Where rlaccel runs, from the package's classifiers: the operating systems and the Python versions."""
    from importlib import metadata

    classifiers = metadata.metadata(DISTRIBUTION).get_all("Classifier") or []
    systems = [c.split(" :: ")[-1] for c in classifiers if c.startswith("Operating System ::")]
    pythons = [c.split(" :: ")[-1] for c in classifiers if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)]
    import sys

    tested = f"{sys.version_info.major}.{sys.version_info.minor}"
    return (f"Python {', '.join(pythons)} on {' and '.join(systems)}: what the package's metadata lists (this "
            f"site was built, and its tests run, on Python {tested}; macOS and Windows are not tested).")


# ------------------------------------------------------------------ the algorithms page
def algorithms_markdown() -> str:
    """One section per algorithm with a fused update, from the adapters' registries: what its drop-in runs."""
    from rlaccel_plugins.replay.evidence import default_sampling

    out: list[str] = []
    for adapter, framework in (("rlaccel_sb3", "sb3"), ("rlaccel_tianshou", "tianshou")):
        try:
            registry = importlib.import_module(f"{adapter}.fused.registry")
        except ImportError:
            out += [f"*({adapter} is not installed here)*", ""]
            continue
        title = "Stable-Baselines3" if framework == "sb3" else "Tianshou"
        out += [f"## {title}", ""]
        for entry in registry.ALGORITHMS:
            names = " / ".join((entry.name, *getattr(entry, "runs_for", ())))
            compiled = getattr(entry, "compiled", None)
            break_even = getattr(entry, "break_even", None)
            if not compiled:
                compiled_text = "none: every gradient step runs the eager fused update"
            elif framework == "tianshou":
                compiled_text = "with `compiled_updates: true` (`auto` keeps Tianshou's updates eager)"
            elif break_even:
                compiled_text = (f"`compiled_updates: auto` compiles a `learn()` call that plans {break_even:,} "
                                 "gradient steps or more")
            else:
                compiled_text = "with `compiled_updates: true` only (no learning check for `auto` yet)"
            if framework == "tianshou":
                collection = "`LeanCollector` (any algorithm)"
            elif getattr(entry, "collects", ()):
                collection = "lean action selection and storage in SB3's `collect_rollouts`"
            else:
                collection = "a lean `policy.forward` for MLP policies (on-policy collection)"
            if entry.family == "on_policy":
                sampling_text = "none: on-policy, no replay buffer (the rollout as the framework collects it)"
            else:
                sampling_text = (f"`{default_sampling(framework, entry.name.lower())}` on vector observations, "
                                 f"`{default_sampling(framework, entry.name.lower(), pixels=True)}` on images")
            out += [f"### {names}", "",
                    f"- **Fused update**: `{adapter}.fused.{entry.family}`"
                    + (f", {entry.covers}" if getattr(entry, "covers", None) else "")
                    + f"; the same math as `{entry.replaces[0].split(':')[1]}`, verified against "
                    f"{len(entry.replaces)} framework methods.",
                    f"- **Compiled step**: {compiled_text}.",
                    f"- **Collection**: {collection}.",
                    f"- **Default sampling** (`sampling: auto`): {sampling_text}.", ""]
    return "\n".join(out).rstrip() + "\n"


def examples_code_markdown() -> str:
    """Each runnable script in ``examples/``, its docstring's first line as a heading and its code whole."""
    from pathlib import Path

    out = []
    for path in sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        out += [f"## `{path.name}`", "", doc.splitlines()[0] if doc else "", "",
                "```python", path.read_text().rstrip(), "```", ""]
    return "\n".join(out)


# ------------------------------------------------------------------ the examples
def examples_markdown() -> str:
    """Each runnable script in ``examples/`` with the first line of its docstring (each runs in the tests)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    rows = ["| run | what it shows |", "|---|---|"]
    for path in sorted((root / "examples").glob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        rows.append(f"| `python examples/{path.name}` | {doc.splitlines()[0] if doc else ''} |")
    return "\n".join(rows)


# ------------------------------------------------------------------ the README's support table
def _display(name: str) -> str:
    return {"QRDQN": "QR-DQN"}.get(name, name)


def support_matrix_markdown() -> str:
    """The README's "What is supported" table: the algorithm lists from the adapters' registries, the rest
    the features each adapter has (``python -m tools.reference --readme`` writes it into the README)."""
    from rlaccel_sb3.fused import registry as sb3
    from rlaccel_tianshou.fused import registry as tianshou

    def names(entries) -> str:
        return ", ".join(_display(n) for a in entries for n in (a.name, *getattr(a, "runs_for", ())))

    sb3_off = [a for a in sb3.ALGORITHMS if a.family != "on_policy"]
    tianshou_off = [a for a in tianshou.ALGORITHMS if not a.on_policy]
    by_default = [a for a in sb3.ALGORITHMS if a.compiled and a.break_even]
    when_asked = [a for a in sb3.ALGORITHMS if a.compiled and not a.break_even]
    compiled_sb3 = f"{names(by_default)} by default" + (f"; {names(when_asked)} with `compiled_updates=true`"
                                                        if when_asked else "")
    rows = [
        ("tiered buffer (drop-in)", f"{names(sb3_off)}; Dict observations; n-step",
         f"{names(tianshou_off)} (vector and single buffers)"),
        ("fused update, bit-identical", f"{names(sb3.ALGORITHMS)} (CUDA graphs on GPU)", names(tianshou.ALGORITHMS)),
        ("lean collection", f"{names(sb3.ALGORITHMS)} (MLP policies)", "`LeanCollector`"),
        ("compiled updates (CPU, MLP policies)", compiled_sb3,
         f"{names([a for a in tianshou.ALGORITHMS if a.compiled])} with `compiled_updates=true`"),
        ("sparse/dense updates", "every algorithm (`SparseDenseCallback`)", "`SparseDenseWrapper`, on-policy wrapper"),
        ("mixed precision, gradient clipping, NaN guard", "yes", "yes"),
        ("crash-safe checkpoints and resume, ONNX export", "`rlaccel train`, `rlaccel export`",
         "`rlaccel train`, `rlaccel export`"),
        ("envpool, RL Zoo YAML, Ray collection", "yes", "envpool"),
    ]
    return "\n".join(["| | SB3 | Tianshou 2.0 |", "|---|---|---|", *(f"| {a} | {b} | {c} |" for a, b, c in rows)])


README_SUPPORT = re.compile(r"(<!-- --8<-- \[start:support\] -->\n)(.*?)(\n<!-- --8<-- \[end:support\] -->)", re.DOTALL)


def readme_with_support(readme: str) -> str:
    """``readme`` with its support table replaced by :func:`support_matrix_markdown`."""
    return README_SUPPORT.sub(lambda m: m.group(1) + support_matrix_markdown() + m.group(3), readme)


if __name__ == "__main__":
    from pathlib import Path

    parser = argparse.ArgumentParser(description="Write the README's generated support table.")
    parser.add_argument("--readme", action="store_true", help="rewrite README.md's support table")
    if parser.parse_args().readme:
        path = Path(__file__).resolve().parents[1] / "README.md"
        path.write_text(readme_with_support(path.read_text()))
        print(f"written: {path}")
