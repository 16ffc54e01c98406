"""A core-only install (``pip install -e .`` plus pytest and hypothesis) runs the core tests.

Files whose top-level imports need an optional package that is not installed (a framework, an
extra) are not collected, doctests included; a test that imports one inside its body is skipped
with the package's name. With everything installed (CI) nothing is skipped.

Under pytest-xdist (``-n auto --dist loadgroup``, the README's command) each worker gets one torch thread
and the ``slow`` tests start first.
"""

import ast
import atexit
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# optional packages (the extras of pyproject.toml) and the adapters that need them
OPTIONAL = ("stable_baselines3", "sb3_contrib", "tianshou", "gymnasium", "envpool", "ale_py", "cv2", "ray",
            "scipy", "matplotlib", "rl_zoo3", "onnx", "onnxruntime", "tensorboard", "wandb", "rich", "tqdm")
ADAPTERS = {"rlaccel_sb3": "stable_baselines3", "rlaccel_tianshou": "tianshou"}
MISSING = {name for name in OPTIONAL if importlib.util.find_spec(name) is None}
MISSING |= {adapter for adapter, framework in ADAPTERS.items() if framework in MISSING}

if not os.environ.get("PYTEST_XDIST_WORKER"):
    # compiled steps are kept on disk (rlaccel_plugins.fused.compiled_cache): one folder for the session, which
    # the workers inherit, so a step compiles once per run and never reads a developer's own cache
    os.environ["RLACCEL_CACHE_DIR"] = tempfile.mkdtemp(prefix="rlaccel-test-cache-")
    atexit.register(shutil.rmtree, os.environ["RLACCEL_CACHE_DIR"], ignore_errors=True)
else:
    # `pytest -n auto` runs one worker per core: a worker's torch (and the processes it starts) takes one
    # thread, so two workers don't fight over the cores. Set before anything imports torch.
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_collection_modifyitems(config, items):
    """Under ``pytest -n``, the ``slow`` tests go first, so that no worker starts a two-minute run when the
    other has nothing left to do."""
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the workers' collection order is the schedule's
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def _top_level_imports(path: Path) -> set[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return set()
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def pytest_ignore_collect(collection_path: Path, config):
    if not MISSING:
        return None
    parts = set(collection_path.parts)
    if parts & set(ADAPTERS) & MISSING:  # an adapter package whose framework is missing
        return True
    if collection_path.suffix == ".py" and _top_level_imports(collection_path) & MISSING:
        return True
    return None


def pytest_runtest_setup(item):
    """``@pytest.mark.needs("tianshou", ...)``: for tests that reach an optional package other than
    by an import in their own body (a CLI call, a subprocess)."""
    for mark in item.iter_markers("needs"):
        missing = sorted(set(mark.args) & MISSING)
        if missing:
            pytest.skip(f"needs {', '.join(missing)}, which is not installed")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    outcome = yield
    error = outcome.excinfo[1] if outcome.excinfo else None
    error = getattr(error, "exc_info", (None, error))[1]  # a doctest wraps the error it met
    if isinstance(error, ModuleNotFoundError) and (error.name or "").split(".")[0] in MISSING:
        outcome.force_exception(pytest.skip.Exception(f"needs {error.name}, which is not installed"))
