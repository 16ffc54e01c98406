import os

# The suite runs on pytest-xdist workers, one per core: with PyTorch's default of one OpenMP thread per core in
# every worker, libgomp's spin-waits oversubscribe the cores (tests/equivalence/test_sb3_fused.py on 2 workers,
# 2 cores, same run: 229-329 s with two threads a worker, 47-56 s with one). Set before any test imports torch;
# a developer's own value is kept, and tests that need two threads set them.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import subprocess
import sys
from pathlib import Path

import pytest

from rlaccel_plugins.plugins import reset_plugin_manager

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def built_site(tmp_path_factory) -> Path:
    """The docs site built strictly (``mkdocs build --strict``): the one ``.ci/run`` built a moment before
    (``RLACCEL_BUILT_SITE``), else built once per test process."""
    given = os.environ.get("RLACCEL_BUILT_SITE")
    if given and (Path(given) / "index.html").is_file():
        return Path(given)
    site = tmp_path_factory.mktemp("site")
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=ROOT,
                           capture_output=True, text=True, timeout=300, check=False,
                           env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert build.returncode == 0, build.stderr[-2000:]
    return site


@pytest.fixture
def fresh_plugins(monkeypatch):
    """A plugin manager rebuilt for the test and forgotten after it."""
    reset_plugin_manager()
    yield
    reset_plugin_manager()


@pytest.fixture(autouse=True)
def _clean_rlaccel_env(monkeypatch, tmp_path):
    # a developer's own RLACCEL_* settings or pyproject must not leak into the tests
    for var in ("RLACCEL_PRESET", "RLACCEL_CONFIG", "RLACCEL_DISABLE_PLUGIN_AUTOLOAD"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def short_host_probes(monkeypatch):
    """The raw env rate that `rlaccel bench` and `rlaccel demo` measure (for 1-3 s) measured for 0.3 s:
    for tests of what they report and write, not of the rate's precision."""
    from rlaccel_plugins.bench import runner

    measure = runner.raw_env_steps_per_s
    monkeypatch.setattr(runner, "raw_env_steps_per_s", lambda env_id, seconds=3.0: measure(env_id, min(seconds, 0.3)))
