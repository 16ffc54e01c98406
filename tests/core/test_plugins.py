import contextlib
import importlib
import inspect
import io
import subprocess
import sys
import textwrap

import pytest

import rlaccel_plugins as rla
from rlaccel_plugins import hookspecs
from rlaccel_plugins.plugins import get_plugin_manager, reset_plugin_manager

pytestmark = pytest.mark.usefixtures("fresh_plugins")

FAKE_PLUGIN = textwrap.dedent('''
    import rlaccel_plugins as rla

    class Toy:
        """An object of a framework only this plugin knows."""

    @rla.hookimpl
    def rlaccel_register_presets(registry):
        registry.add("toy", {"batch_size": 7}, "a third-party preset")

    @rla.hookimpl
    def rlaccel_register_adapters(registry):
        from rlaccel_plugins.plugins import AdapterSpec
        registry.add(AdapterSpec(name="toy", framework="json", supports="Toy objects",
                                 accelerate="rlaccel_fake_plugin:toy_accelerate"))
        registry.add(AdapterSpec(name="ghost", framework="no_such_framework_xyz", supports="ghosts",
                                 accelerate="nowhere:nothing", install_hint="pip install ghost"))

    @rla.hookimpl
    def rlaccel_detect_framework(obj):
        return "toy" if isinstance(obj, Toy) else None

    def toy_accelerate(obj, preset=None, **overrides):
        return ("accelerated", rla.load_config(preset=preset, **overrides).training.batch_size)

    @rla.hookimpl
    def rlaccel_make_env(env_id, num_envs, backend, seed, config, env_kwargs):
        return ("toy-env", env_id, num_envs) if backend == "toy" else None

    @rla.hookimpl
    def rlaccel_add_commands(subparsers):
        p = subparsers.add_parser("toy", help="a plugin command")
        p.set_defaults(func=lambda args: print("toy command ran") or 0)

    @rla.hookimpl
    def rlaccel_env_report():
        return {"toy plugin": "present"}
''')


@contextlib.contextmanager
def installed_fake_plugin(directory):
    """Install a real (on-disk) distribution with an ``rlaccel`` entry point, plus a broken one."""
    (directory / "rlaccel_fake_plugin.py").write_text(FAKE_PLUGIN)
    dist = directory / "rlaccel_fake_plugin-1.2.3.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: rlaccel-fake-plugin\nVersion: 1.2.3\n")
    (dist / "entry_points.txt").write_text("[rlaccel]\ntoy = rlaccel_fake_plugin\nbroken = rlaccel_missing_mod\n")
    sys.path.insert(0, str(directory))
    importlib.invalidate_caches()
    reset_plugin_manager()
    try:
        yield
    finally:
        sys.path.remove(str(directory))
        sys.modules.pop("rlaccel_fake_plugin", None)
        reset_plugin_manager()


@pytest.fixture
def fake_entry_point(tmp_path):
    with installed_fake_plugin(tmp_path):
        yield


def run_cli(*argv):
    from rlaccel_plugins.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(argv))
    return code, out.getvalue()


def test_rlaccel_register_presets(fake_entry_point):
    assert rla.get_preset("toy").training.batch_size == 7
    assert rla.preset_names()[0] == "default"  # built-ins first


def test_rlaccel_register_adapters(fake_entry_point):
    adapters = {a.name: a for a in get_plugin_manager().adapters}
    assert {"sb3", "tianshou", "toy", "ghost"} <= set(adapters)
    assert adapters["toy"].available
    assert not adapters["ghost"].available
    assert "no_such_framework_xyz is not installed" in adapters["ghost"].unavailable_reason
    with pytest.raises(rla.ConfigError, match="pip install ghost"):
        adapters["ghost"].load("accelerate")


def test_rlaccel_detect_framework(fake_entry_point):
    import rlaccel_fake_plugin

    assert rla.accelerate(rlaccel_fake_plugin.Toy(), preset="atari", batch_size=9) == ("accelerated", 9)
    assert get_plugin_manager().hook.rlaccel_detect_framework(obj=object()) is None


def test_rlaccel_make_env(fake_entry_point):
    assert rla.make_vec_env("Anything-v0", num_envs=3, backend="toy") == ("toy-env", "Anything-v0", 3)
    env = rla.make_vec_env("CartPole-v1", num_envs=2, backend="gymnasium", seed=1)
    try:
        obs, _ = env.reset(seed=1)
        assert obs.shape == (2, 4)
    finally:
        env.close()
    with pytest.raises(rla.ConfigError, match="backend must be one a plugin provides"):
        rla.make_vec_env("CartPole-v1", num_envs=2, backend="nope")


def test_rlaccel_add_commands(fake_entry_point):
    code, out = run_cli("toy")
    assert code == 0 and "toy command ran" in out


def test_rlaccel_env_report(fake_entry_point):
    code, out = run_cli("env")
    assert code == 0 and "toy plugin" in out and "auto parallel_envs" in out and "torch" in out


HOOK_TESTS = {
    "rlaccel_register_presets": test_rlaccel_register_presets,
    "rlaccel_register_adapters": test_rlaccel_register_adapters,
    "rlaccel_detect_framework": test_rlaccel_detect_framework,
    "rlaccel_make_env": test_rlaccel_make_env,
    "rlaccel_add_commands": test_rlaccel_add_commands,
    "rlaccel_env_report": test_rlaccel_env_report,
}


def _hookspecs():
    return {name: fn for name, fn in vars(hookspecs).items()
            if name.startswith("rlaccel_") and callable(fn)}


def test_every_hookspec_is_documented_annotated_and_tested(tmp_path):
    specs = _hookspecs()
    assert set(specs) == set(HOOK_TESTS), "each hookspec needs a test in HOOK_TESTS (and vice versa)"
    for name, fn in specs.items():
        doc = inspect.getdoc(fn) or ""
        assert "Called" in doc, f"{name}'s docstring must say when it is called"
        assert "Return" in doc, f"{name}'s docstring must say what it returns"
        assert "return" in fn.__annotations__, f"{name} needs a return annotation"
    # run each hook's test and check, with pluggy's call monitor, that it really calls that hook
    for name, test in HOOK_TESTS.items():
        called = []
        with installed_fake_plugin(tmp_path):
            manager = get_plugin_manager()
            undo = manager.add_hookcall_monitoring(lambda hook, impls, kw, called=called: called.append(hook),
                                                   lambda *a: None)
            test(None)
            undo()
        assert name in called, f"{test.__name__} does not call {name}"


def test_broken_entry_point_is_skipped_and_reported(fake_entry_point):
    manager = get_plugin_manager()
    assert [f.name for f in manager.failures] == ["broken"]
    code, out = run_cli("plugins")
    assert code == 0
    assert "toy 1.2.3" in out and "broken: NOT LOADED" in out and "ghost (no_such_framework_xyz) unavailable" in out


def test_autoload_can_be_disabled(fake_entry_point, monkeypatch):
    monkeypatch.setenv("RLACCEL_DISABLE_PLUGIN_AUTOLOAD", "1")
    names = [name for name, _ in get_plugin_manager().list_name_plugin()]
    assert "toy" not in names and "sb3" not in names
    assert "rlaccel_plugins.presets" in names
    with pytest.raises(rla.ConfigError, match="Known presets"):
        rla.get_preset("toy")


class PresetPlugin:
    """A plugin that registers one preset."""

    def __init__(self, name, values):
        self.name, self.values = name, values

    @rla.hookimpl
    def rlaccel_register_presets(self, registry):
        registry.add(self.name, self.values, "from a plugin")


@pytest.mark.parametrize("name, values, message", [
    ("atari", {"batch_size": 3}, "preset name must be new, got name='atari', which is already registered"),
    ("mine", {"batch_size": 0}, "batch_size must be >= 1"),
])
def test_a_plugin_cannot_replace_a_builtin_preset_or_register_a_bad_one(name, values, message):
    manager = get_plugin_manager()
    manager.register(PresetPlugin(name, values), name="preset-plugin")
    with pytest.raises(rla.ConfigError, match=message):
        rla.get_preset("atari")
    manager.unregister(name="preset-plugin")
    assert rla.get_preset("atari").training.batch_size == 512  # the built-in, untouched


def test_a_plugin_preset_is_served_by_the_plugin_manager():
    get_plugin_manager().register(PresetPlugin("mine", {"batch_size": 3}), name="preset-plugin")
    assert rla.get_preset("mine").training.batch_size == 3 and "mine" in rla.preset_names()


def test_accelerate_unknown_object_names_supported_types():
    with pytest.raises(TypeError) as info:
        rla.accelerate(42)
    message = str(info.value)
    assert "'int'" in message and "Stable-Baselines3" in message and "Tianshou" in message


def test_import_is_light():
    code = ("import sys, rlaccel_plugins; "
            "heavy = [m for m in ('torch', 'stable_baselines3', 'tianshou', 'envpool', 'gymnasium') if m in sys.modules]; "
            "print(heavy)")
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    for module in ("stable_baselines3", "tianshou", "envpool"):
        assert f"| {module}\n" not in out.stderr


def test_loading_the_adapters_imports_no_framework():
    code = ("import sys; from rlaccel_plugins.plugins import get_plugin_manager; "
            "assert len(get_plugin_manager().adapters) >= 2; "
            "print([m for m in ('stable_baselines3', 'tianshou', 'envpool') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
