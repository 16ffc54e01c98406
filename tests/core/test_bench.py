"""`rlaccel bench`: suites, summaries, the table and the equal-samples rule, with tiny budgets."""

import json
import math
import re
import sys
from pathlib import Path

import pytest

from rlaccel_plugins.bench import report
from rlaccel_plugins.bench.runner import variant_config
from rlaccel_plugins.bench.suites import SUITES, get_suite
from rlaccel_plugins.cli import main
from rlaccel_plugins.errors import ConfigError
from rlaccel_plugins.training import update_cadence

ROOT = Path(__file__).resolve().parents[2]


def _record(variant, role, seed, seconds, steps=1000, train_seconds=10.0):
    return {"task": "CartPole-v1", "variant": variant, "role": role, "seed": seed, "cap": 5000,
            "threshold": 475.0, "seconds_to_threshold": seconds, "steps_to_threshold": steps if seconds else None,
            "final_eval": 480.0, "env_steps": 5000, "train_seconds": train_seconds, "env_steps_per_s": 500.0,
            "gradient_steps": 100, "gradient_steps_per_s": 10.0, "replay_bytes_per_transition": 52.0,
            "peak_rss_mb": 300.0, "curve": [{"env_steps": 1000, "train_seconds": 1.0, "mean_reward": 20.0},
                                            {"env_steps": 2000, "train_seconds": 2.0, "mean_reward": 480.0}]}


def test_a_run_that_misses_the_threshold_counts_as_infinitely_slow_in_the_median():
    records = [_record("stock", "yardstick", s, t) for s, t in enumerate([30.0, 20.0, None])] + \
              [_record("fast", "accelerated", s, t) for s, t in enumerate([4.0, 5.0, 6.0])]
    rows = {r["variant"]: r for r in report.summarize(records)}
    assert rows["stock"]["median_seconds_to_threshold"] == 30.0 and rows["stock"]["reached"] == 2
    assert rows["fast"]["speedup_vs_yardstick"] == pytest.approx(6.0) and rows["fast"]["speedup_bound"] == "exact"
    never = [_record("stock", "yardstick", s, None) for s in range(3)] + [_record("fast", "accelerated", 0, 2.0)]
    rows = {r["variant"]: r for r in report.summarize(never)}
    assert rows["stock"]["median_seconds_to_threshold"] == math.inf
    assert rows["fast"]["speedup_bound"] == "lower bound" and rows["fast"]["speedup_vs_yardstick"] == 5.0
    table = report.markdown({"machine": "test", "suite": "quick", "seeds": 3, "summary": report.summarize(never),
                             "raw_env_steps_per_s": {}, "thresholds": {"CartPole-v1": 475.0}})
    assert "not reached (> 5,000 steps)" in table and "> 5.00x" in table


def test_suites_filter_frameworks_keep_the_yardstick_and_add_ablations():
    assert {"quick", "classic", "atari", "atari-fps"} <= set(SUITES)
    (task,) = get_suite("quick", frameworks=("tianshou",), ablate=True)
    names = [v.name for v in task.variants]
    assert names[0] == "sb3 stock (RL Zoo)"  # the yardstick stays whatever the frameworks
    assert "tianshou rlaccel[classic_control, batch_size=64, replay_ratio=32]" in names
    assert "sb3 rlaccel[classic_control]" not in names
    assert {"tianshou tiers only", "tianshou sparse/dense only", "tianshou parallel only",
            "tianshou settings only"} <= set(names)
    settings_only = next(v for v in task.variants if v.name == "tianshou settings only")
    config = variant_config(settings_only)
    preset = variant_config(next(v for v in task.variants if v.role == "accelerated"))
    assert config.replay_buffer.sampling_ratio == (1.0,)
    assert config.replay_buffer.capacity == preset.replay_buffer.capacity
    assert config.training.sparse_update_interval == 1 and config.training.parallel_envs == 1
    assert config.training.batch_size == preset.training.batch_size == 64


def test_the_dropin_suite_keeps_its_off_preset_variant_under_another_preset():
    (task,) = get_suite("dropin", frameworks=("sb3",), preset="default")
    names = [v.name for v in task.variants]
    assert len(names) == len(set(names))
    assert {"sb3 drop-in[off]", "sb3 drop-in[default]", "sb3 rlaccel[default]",
            "sb3 drop-in[default] + fused_optimizer"} <= set(names)
    off = variant_config(next(v for v in task.variants if v.name == "sb3 drop-in[off]"))
    assert off.replay_buffer.sampling_ratio == (1.0,)
    fused = variant_config(next(v for v in task.variants if v.name.endswith("+ fused_optimizer")))
    assert fused.training.fused_optimizer and fused.preset == "default"


def test_the_ppo_suite_measures_the_drop_in_against_stock_ppo():
    (task,) = get_suite("ppo", frameworks=("sb3",))
    assert [(v.algo, v.stock, v.role) for v in task.variants] == [("ppo", True, "yardstick"), ("ppo", False, "accelerated")]


def test_bad_suite_and_frameworks_are_named():
    with pytest.raises(ConfigError, match="suite must be one of .* Did you mean 'quick'"):
        get_suite("quik")
    with pytest.raises(ConfigError, match="frameworks must be a comma-separated subset of sb3,tianshou"):
        get_suite("quick", frameworks=("sb4",))


def test_equal_samples_per_env_step():
    for ratio, batch, envs, freq in [(8, 32, 1, 4), (8, 512, 256, 1), (32, 256, 4, 64), (8, 512, 8, 1)]:
        train_freq, gradient_steps = update_cadence(ratio, batch, envs, freq)
        assert batch * gradient_steps / (train_freq * envs) == pytest.approx(ratio)
    # atari-fps holds RL Zoo's 8 samples per env step (batch 32 every 4 steps) for the rlaccel variant too
    (task,) = get_suite("atari-fps", frameworks=("sb3",))
    accelerated = [variant_config(v) for v in task.variants if v.role == "accelerated" and not v.dropin]
    assert [config.training.replay_ratio for config in accelerated] == [8.0, 8.0] and task.fixed_steps
    assert [config.training.channels_last for config in accelerated] == [False, True]
    dropins = [v for v in task.variants if v.dropin]  # RL Zoo's own cadence: no replay_ratio of ours
    assert [variant_config(v).training.channels_last for v in dropins] == [False, True]
    assert all(v.hyperparams == {"learning_starts": 1_000} for v in task.variants)


@pytest.mark.needs('tianshou')
@pytest.mark.filterwarnings("ignore::rlaccel_plugins.errors.RlaccelWarning")
@pytest.mark.slow
def test_bench_command_writes_results_table_and_plots(tmp_path, capsys, short_host_probes):
    args = ["bench", "--suite", "quick", "--seeds", "1", "--frameworks", "tianshou", "--steps", "1500",
            "--out", str(tmp_path)]
    assert main(args) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    variants = {r["variant"] for r in results["records"]}
    assert variants == {"sb3 stock (RL Zoo)", "tianshou rlaccel[classic_control, batch_size=64, replay_ratio=32]",
                        "tianshou stock (example settings)", "tianshou drop-in[classic_control]"}
    for record in results["records"]:
        assert record["env_steps"] >= 1500 or record["seconds_to_threshold"] is not None
        assert record["peak_rss_mb"] > 50 and record["gradient_steps"] > 0 and record["curve"]
    assert results["raw_env_steps_per_s"]["CartPole-v1"]["env_steps_per_s"] > 1000
    assert "| variant | reached |" in (tmp_path / "results.md").read_text()
    assert len(results["host"]["probe_rates"]) == 2  # before the seed and at the end
    assert results["command"] == f"rlaccel bench --suite quick --seeds 1 --frameworks tianshou --steps 1500 --out {tmp_path}"
    assert "Host: raw env steps/s before each seed and at the end" in (tmp_path / "results.md").read_text()
    assert (tmp_path / "CartPole-v1.png").stat().st_size > 10_000
    assert "written:" in capsys.readouterr().out


def test_classic_suite_skips_tasks_whose_dependencies_are_missing():
    tasks = {t.env_id: t for t in get_suite("classic")}
    assert set(tasks) == {"CartPole-v1", "Acrobot-v1", "LunarLander-v3"}
    assert tasks["CartPole-v1"].missing() is None and tasks["Acrobot-v1"].missing() is None
    import importlib.util

    if importlib.util.find_spec("Box2D") is None or importlib.util.find_spec("pygame") is None:
        assert "pip install box2d pygame" in tasks["LunarLander-v3"].missing()
    else:
        assert tasks["LunarLander-v3"].missing() is None
    from rlaccel_sb3.train import zoo_settings

    assert zoo_settings("dqn", "Acrobot-v1")["target_update_interval"] == 250  # RL Zoo's, not SB3's defaults


def test_bench_help_lists_every_suite(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert all(name in shown for name in SUITES) and "precision" in shown


def test_the_host_meter_counts_other_processes_cpu_and_the_hypervisors_steal(monkeypatch):
    from rlaccel_plugins.bench import host

    stats = iter([{"busy": 1_000, "steal": 50, "total": 10_000}, {"busy": 1_000 + 300, "steal": 50 + 20, "total": 10_400}])
    own = iter([10.0, 10.5])  # the suite's own CPU seconds (its reaped variant processes included)
    clock = iter([100.0, 102.0])
    monkeypatch.setattr(host, "_read_stat", lambda: next(stats))
    monkeypatch.setattr(host, "_own_cpu_seconds", lambda: next(own))
    monkeypatch.setattr(host.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(host.os, "sysconf", lambda name: 100)  # clock ticks per second
    meter = host.HostMeter()
    meter.probe(2_000.0)
    meter.probe(1_600.0)
    summary = meter.finish()
    assert summary["steal_share"] == pytest.approx(20 / 400)
    assert summary["others_cores"] == pytest.approx((3.0 - 0.5) / 2.0)  # 3 busy s, 0.5 of them ours, over 2 s
    line, unsteady = host.verdict(summary)
    assert unsteady and "spread 25%" in line and "1.25 cores" in line and "not steady" in line
    steady = ("Host: raw env steps/s before each seed and at the end: 2,000, 1,900 (spread 5%); CPU time stolen by "
              "the hypervisor: 1.0%; other processes: 0.10 cores on average.")
    assert host.verdict({"probe_rates": [2_000.0, 1_900.0], "steal_share": 0.01, "others_cores": 0.1}) == (steady, False)


def test_the_host_meter_sees_a_busy_process_that_is_not_the_suites():
    import subprocess
    import sys
    import time

    from rlaccel_plugins.bench.host import HostMeter

    if not Path("/proc/stat").exists():
        pytest.skip("needs Linux's /proc/stat")
    meter = HostMeter()
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 1.5: pass"])
    time.sleep(1.5)
    summary = meter.finish()  # before the busy process is reaped: not ours by rusage
    busy.wait()
    assert summary["others_cores"] > 0.3


def _busy_for_a_second():
    import time

    start = time.process_time()
    while time.process_time() - start < 1.0:
        pass


def test_the_host_meter_counts_a_run_forked_from_the_forkserver_as_the_suites_own():
    from concurrent.futures import ProcessPoolExecutor

    from rlaccel_plugins.bench import host
    from rlaccel_plugins.bench.processes import process_context

    context = process_context()
    if context.get_start_method() != "forkserver" or not Path("/proc/stat").exists():
        pytest.skip("needs Linux's forkserver and /proc")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        pool.submit(int).result()  # the forkserver up (its preload is not what is measured here)
    before = host._own_cpu_seconds()
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        pool.submit(_busy_for_a_second).result()
    # the run is the forkserver's child, reaped by it: counted through the forkserver, not as another process's
    assert host._own_cpu_seconds() - before >= 0.9


def test_the_results_index_names_every_results_folder_and_the_pages_that_cite_it(monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("results_index", ROOT / "benchmarks/results_index.py")
    index = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "results_index", index)  # its dataclasses look their module up
    spec.loader.exec_module(index)
    text = index.build_index()
    folders = [p.name for p in index.RESULTS.iterdir() if p.is_dir() and p.name != "archive"]
    assert folders and all(f"## `{name}/`" in text for name in folders)
    assert "`python benchmarks/allocator_bench.py" in text  # a text file's own command line
    assert index.cited_by("allocator", {"a.md": "see `benchmarks/results/allocator/`", "b.md": "nothing"}) == ["a.md"]
    assert index.cited_by("atari-fps", {"a.md": "results/atari-fps-lean/"}) == []  # a longer name is another folder
    assert index.cited_by("quick-dropin-off", {"a.md": "runs (`quick-dropin-off*/`)"}) == ["a.md"]
    # every maintained benchmark shows a figure of its latest run, read from a results file
    scripts = {p.name for p in index.maintained_scripts()}
    assert scripts == set(index.LATEST), f"record the latest run of {scripts ^ set(index.LATEST)} in LATEST"
    # read from the JSON the scripts write (benchmarks/_results.py's layout), never scraped from what they print;
    # a file converted once from an earlier output says so where its figure is shown
    from benchmarks import _results

    for script in scripts:
        document = _results.read(index.RESULTS / index.LATEST[script])
        figure, date, _ = index.latest_figure(script)
        assert figure.startswith(document["headline"]) and re.search(r"\d", figure), (script, figure)
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", date), (script, date)
        assert ("converted from" in figure) == bool(document.get("converted_from")), script
