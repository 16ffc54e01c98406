import pytest

from rlaccel_plugins.plugins import reset_plugin_manager


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
