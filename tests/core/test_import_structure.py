"""The import structure the project keeps (the core imports no framework, no cycles), checked by walking every import statement.

Function-level imports count (a lazy import is still a dependency); imports under
``if TYPE_CHECKING:`` do not. Importing ``a.b.c`` also imports the packages ``a`` and ``a.b``,
except the importing module's own packages (Python has run those before the module itself).
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"rlaccel_plugins": ROOT / "rlaccel_plugins", "rlaccel_sb3": ROOT / "adapters/sb3/rlaccel_sb3",
            "rlaccel_tianshou": ROOT / "adapters/tianshou/rlaccel_tianshou"}
FRAMEWORKS = ("stable_baselines3", "sb3_contrib", "tianshou", "rl_zoo3")


def module_files() -> dict[str, Path]:
    modules = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


MODULES = module_files()


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imported_names(module: str) -> set[str]:
    """Every module name ``module`` imports (absolute), with the packages on the way."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import submodule`
    own = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
    out = set()
    for name in names:
        parts = name.split(".")
        out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return (out - own) | (names & own)


def project_edges() -> dict[str, set[str]]:
    return {m: {n for n in imported_names(m) if n in MODULES and n != m} for m in MODULES}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_walk_sees_function_level_imports():
    assert "rlaccel_plugins.plugins" in imported_names("rlaccel_plugins.loader")
    assert "rlaccel_plugins.parallel.ray_actors" in imported_names("rlaccel_plugins.training")  # inside a function
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


@pytest.mark.parametrize("package", list(PACKAGES))
def test_no_import_cycle_inside_a_package(package):
    edges = project_edges()
    inside = {m: {n for n in e if n.split(".")[0] == package} for m, e in edges.items()
              if m.split(".")[0] == package}
    assert cycles(inside) == []


def test_the_core_imports_no_framework_and_the_adapters_not_each_other():
    for module in MODULES:
        imported = {name.split(".")[0] for name in imported_names(module)}
        if module.startswith("rlaccel_plugins"):
            assert not imported & {*FRAMEWORKS, "rlaccel_sb3", "rlaccel_tianshou"}, module
        elif module.startswith("rlaccel_sb3"):
            assert "rlaccel_tianshou" not in imported and "tianshou" not in imported, module
        else:
            assert "rlaccel_sb3" not in imported and "stable_baselines3" not in imported, module


def test_config_is_a_leaf():
    project = {n for n in imported_names("rlaccel_plugins.config") if n in MODULES and n != "rlaccel_plugins"}
    assert project <= {"rlaccel_plugins.errors"}
