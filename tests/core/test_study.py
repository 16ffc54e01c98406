"""The learning study's machinery: statistics whose answer is known, resuming, and a crashing worker."""

import json
import os
from pathlib import Path

import numpy as np
import pytest

from rlaccel_plugins.bench import learning_stats as ls
from rlaccel_plugins.bench.study import ARTICLE, STOCK, TASKS, TIERS, UNIFORM, read_runs, run_study
from rlaccel_plugins.bench.study_report import analyse, markdown, write_report
from rlaccel_plugins.errors import ConfigError

TASK = "sb3 DQN CartPole-v1"


def synthetic_curve(level: float, rng: np.random.Generator, points: int = 8) -> list[dict]:
    """An evaluation curve rising to ``level`` (a return), with noise."""
    steps = np.arange(1, points + 1) * 1000
    returns = level * steps / steps[-1] + rng.normal(0, 20, points)
    return [{"env_steps": int(s), "train_seconds": 0.0, "mean_reward": float(r)} for s, r in zip(steps, returns)]


UNIFORM_SAMPLED = {"sampling": "uniform", "level_capacity": [100_000]}
ARTICLE_SAMPLED = {"sampling": "tiers", "level_capacity": [794, 3968, 15873, 79365],
                   "sampling_ratio": [0.7, 0.2, 0.08, 0.02], "ratio_schedule": "constant"}


def synthetic_records(shift: float, runs: int = 30, seed: int = 0, variants=(STOCK, UNIFORM), late_only=False,
                      task: str = TASK, env_id: str = "CartPole-v1") -> list[dict]:
    """Runs of ``variants`` (the last shifted by ``shift``, in the second half of the budget only with
    ``late_only``), each recording what it sampled."""
    rng = np.random.default_rng(seed)
    records = []
    for variant, offset in zip(variants, (0.0, shift)):
        sampled = ARTICLE_SAMPLED if variant == ARTICLE else UNIFORM_SAMPLED
        for s in range(runs):
            curve = synthetic_curve(rng.normal(300, 60), rng)
            for point in curve[len(curve) // 2 if late_only else 0:]:
                point["mean_reward"] += offset
            records.append({"task": task, "env_id": env_id, "variant": variant, "seed": s, "budget": 8000,
                            "curve": curve, "status": "ok", "replay_sampling": sampled})
    return records


def test_two_identical_variants_cannot_be_told_apart_and_a_shifted_one_can():
    # identical variants: the 95% CI holds 0.5 in ~95% of studies (the 5% are what a 95% CI allows; 10 or
    # more misses in 60 has a chance of 0.2% for a calibrated interval; the draws are seeded)
    rng = np.random.default_rng(0)
    misses = sum(not (low < 0.5 < high) for low, high in (
        ls.probability_of_improvement(rng.normal(0, 1, 30), rng.normal(0, 1, 30), reps=200, seed=i)[1:]
        for i in range(60)))
    assert misses <= 9
    same = analyse(synthetic_records(shift=0.0, seed=1), {"CartPole-v1": 22.0}, reps=500)
    point, low, high = same["tasks"][TASK]["pairs"][f"{UNIFORM} > {STOCK}"]["poi"]
    assert low < 0.5 < high
    better = analyse(synthetic_records(shift=150.0), {"CartPole-v1": 22.0}, reps=500)
    point, low, high = better["tasks"][TASK]["pairs"][f"{UNIFORM} > {STOCK}"]["poi"]
    assert low > 0.5 and point > 0.8
    worse = analyse(synthetic_records(shift=-150.0), {"CartPole-v1": 22.0}, reps=500)
    assert worse["tasks"][TASK]["pairs"][f"{UNIFORM} > {STOCK}"]["poi"][2] < 0.5
    rows = better["tasks"][TASK]["rows"]
    assert rows[UNIFORM]["iqm_auc"][0] > rows[STOCK]["iqm_auc"][0]
    text = markdown(better, {"study": "synthetic"})
    assert f"| {UNIFORM} > {STOCK} | 30 | " in text and "IQM area" in text


@pytest.mark.parametrize("shape", [(1, 1), (4, 1), (7, 3), (10, 1), (30, 2), (101, 1)])
def test_the_statistics_are_rliables_bit_for_bit(shape):
    from rliable import metrics

    rng = np.random.default_rng(sum(shape))
    for x, y in [(rng.normal(size=shape), rng.normal(size=shape)),
                 (rng.integers(0, 3, shape).astype(float), rng.integers(0, 3, shape).astype(float)),  # ties
                 (rng.normal(size=shape), rng.normal(size=(shape[0] + 2, shape[1])))]:
        assert ls.iqm(x) == metrics.aggregate_iqm(x) and ls.iqm(y) == metrics.aggregate_iqm(y)
        assert ls.improvement_probability(x, y) == metrics.probability_of_improvement(x, y)
        assert ls.improvement_probability(x, x) == metrics.probability_of_improvement(x, x) == 0.5
    x[0, 0] = np.nan
    assert np.isnan(ls.improvement_probability(x, y)) and np.isnan(metrics.probability_of_improvement(x, y))


def test_the_iqm_ci_covers_the_truth_and_narrows_with_more_runs():
    rng = np.random.default_rng(3)
    few = ls.iqm_with_ci({"a": rng.normal(0.5, 0.2, 10)}, reps=2_000)["a"]
    many = ls.iqm_with_ci({"a": rng.normal(0.5, 0.2, 200)}, reps=2_000)["a"]
    assert few[1] < 0.5 < few[2] and many[1] < 0.5 < many[2]
    assert many[2] - many[1] < (few[2] - few[1]) / 2
    assert ls.seeds_for_decision(10, 0.2, 0.8, 0.5)["observed"] == float("inf")
    assert ls.steps_to_threshold_ci(np.array([1e3, 2e3, np.inf, np.inf, np.inf]), reps=200)[0] == np.inf


# ------------------------------------------------------------------ running (children import this module)
def test_a_variant_that_learns_the_same_per_env_step_in_half_the_time_wins_the_area_over_time():
    records = synthetic_records(shift=0.0, seed=1)
    for record in records:  # stock: 1 s per 1,000 env steps; uniform the same curve per env step in half the time
        for point in record["curve"]:
            point["train_seconds"] = point["env_steps"] / (2000 if record["variant"] == UNIFORM else 1000)
    stats = analyse(records, {"CartPole-v1": 22.0}, reps=500)
    task = stats["tasks"][TASK]
    assert task["horizon_s"] == 4.0  # the shortest run's: uniform's 8,000 env steps took 4 s
    by = task["pairs"][f"{UNIFORM} > {STOCK}"]["poi_by"]
    assert by["auc"][1] < 0.5 < by["auc"][2]  # per env step: the same
    assert by["auc_time"][1] > 0.5 and by["auc_time"][0] > 0.8  # per second: better
    text = markdown(stats, {"study": "synthetic"})
    assert "area over time: the first 4 s of training" in text and "| area over time |" in text
    untimed = analyse(synthetic_records(shift=0.0, seed=1), {"CartPole-v1": 22.0}, reps=200)  # no times recorded
    assert "auc_time" not in untimed["tasks"][TASK]["pairs"][f"{UNIFORM} > {STOCK}"]["poi_by"]


@pytest.mark.parametrize("seeds, speedup, schedule, why", [
    (10, 2.0, "full", "screened, not confirmed yet: needs fresh seeds"),
    (20, 2.0, "sparse/dense", "screened and confirmed on fresh seeds"),
    (20, 0.5, "full", "the screen shows no gain"),
    (6, 2.0, "full", "screen incomplete: 6 of its 10 seeds"),
])
def test_the_sparse_dense_schedule_is_kept_on_images_only_where_it_wins_the_area_over_time_twice(
        seeds, speedup, schedule, why):
    """The same curves per env step, the schedule's in ``1 / speedup`` of the time: kept in the presets only
    where the screening seeds (0-9) favour it on the area over time and fresh seeds confirm it."""
    from rlaccel_plugins.bench.study import PIXEL_TASKS, SPARSE_DENSE

    task, env_id = TASKS[PIXEL_TASKS[0]].key, TASKS[PIXEL_TASKS[0]].env_id
    records = synthetic_records(shift=0.0, runs=seeds, seed=1, variants=(UNIFORM, SPARSE_DENSE), task=task,
                                env_id=env_id)
    for record in records:
        for point in record["curve"]:
            point["train_seconds"] = point["env_steps"] / 1000 / (speedup if record["variant"] == SPARSE_DENSE else 1)
    stats = analyse(records, {env_id: 0.4}, reps=300)
    decision = stats["schedule_decisions"]["sb3 DQN (images)"]
    assert (decision["schedule"], decision["why"]) == (schedule, why)
    assert decision["measure"] == "auc_time" and not stats["decisions"]  # no tiers ran: no sampling decision
    assert decision["all"]["auc"][1] < 0.5 < decision["all"]["auc"][2]  # per env step they are the same
    assert f"| sb3 DQN (images) | {env_id} | " in markdown(stats, {"study": "synthetic"})


def test_a_time_decision_refuses_a_seed_whose_variants_ran_on_different_machines():
    """Seconds on one machine are not seconds on another: a seed whose runs of a task span two machines is named
    in the report, and no decision on the area over time is taken from it."""
    from rlaccel_plugins.bench.study import PIXEL_TASKS, SPARSE_DENSE

    task, env_id = TASKS[PIXEL_TASKS[0]].key, TASKS[PIXEL_TASKS[0]].env_id
    records = synthetic_records(shift=0.0, runs=20, seed=1, variants=(UNIFORM, SPARSE_DENSE), task=task, env_id=env_id)
    for record in records:
        fast = record["variant"] == SPARSE_DENSE
        machine = "faster" if fast and record["seed"] == 3 else "usual"
        record["provenance"] = {"machine": machine}
        for point in record["curve"]:
            point["train_seconds"] = point["env_steps"] / 1000 / (2 if fast else 1)
    stats = analyse(records, {env_id: 0.4}, reps=300)
    decision = stats["schedule_decisions"]["sb3 DQN (images)"]
    assert stats["tasks"][task]["split_seeds"] == [3]
    assert (decision["schedule"], decision["why"]) == (
        "full", f"refused: runs of one seed on different machines: {task} (seeds 3)")
    assert "Seeds 3 ran their variants on different machines" in markdown(stats, {"study": "synthetic"})


def fake_run(task, variant, seed):
    """A stand-in for a training run: instant, with a record shaped like a real one; an odd seed of the uniform
    variant kills its own process while RLACCEL_TEST_CRASH names a file that exists (a worker dying mid-run),
    and removes the file as it dies when the file says ``once``."""
    marker = os.environ.get("RLACCEL_TEST_CRASH")
    if marker and seed % 2 and variant.name == UNIFORM and os.path.exists(marker):
        if Path(marker).read_text() == "once":
            os.remove(marker)
        os._exit(3)
    curve = synthetic_curve(200.0 + seed, np.random.default_rng(seed))
    return {"task": task.key, "env_id": task.env_id, "variant": variant.name, "seed": seed, "curve": curve}


def editing_run(task, variant, seed):
    """:func:`fake_run`, and the first run edits the "code" (the file RLACCEL_TEST_CODE names) as it ends."""
    if seed == 0 and variant.name == STOCK:
        Path(os.environ["RLACCEL_TEST_CODE"]).write_text("edited")
    return fake_run(task, variant, seed)


def runs_of(records, status="ok"):
    return sorted((r["variant"], r["seed"]) for r in records if r["status"] == status)


def test_a_crashed_worker_loses_only_its_own_run_which_is_retried_once_and_resume_skips_finished_runs(
        tmp_path, monkeypatch):
    out = tmp_path / "study"
    marker = tmp_path / "crash"
    marker.write_text("once")
    monkeypatch.setenv("RLACCEL_TEST_CRASH", str(marker))
    from rlaccel_plugins.bench import report

    monkeypatch.setattr(report, "provenance", lambda: {"commit": "the study's"})  # in this process only
    kwargs = dict(out=out, workers=2, only=["cartpole-dqn"], variants=[STOCK, UNIFORM], target=fake_run)
    run_study("learning-quick", seeds=2, **kwargs)
    records = read_runs(out / "runs.jsonl")
    failed = [r for r in records if r["status"] == "failed"]
    assert runs_of(records, "failed") == [(UNIFORM, 1)] and "exit code 3" in failed[0]["error"]
    assert runs_of(records) == sorted([(STOCK, 0), (STOCK, 1), (UNIFORM, 0), (UNIFORM, 1)])  # the retry made it
    # a finished run records the provenance of the process that ran it; one whose process died, the study's
    assert all(r["provenance"]["commit"] != "the study's" and "torch" in r["provenance"]["versions"]
               for r in records if r["status"] == "ok")
    assert failed[0]["provenance"] == {"commit": "the study's"}
    with pytest.raises(ValueError, match="--resume"):
        run_study("learning-quick", seeds=2, **kwargs)
    # a run failing on its retry too is counted as failed, and resuming never runs it again
    marker.write_text("always")
    run_study("learning-quick", seeds=4, resume=True, **kwargs)
    new = read_runs(out / "runs.jsonl")[len(records):]
    assert runs_of(new) == [(UNIFORM, 2), (STOCK, 2), (STOCK, 3)] and runs_of(new, "failed") == [(UNIFORM, 3)] * 2
    run_study("learning-quick", seeds=4, resume=True, **kwargs)
    assert len(read_runs(out / "runs.jsonl")) == len(records) + len(new)
    # a line torn by a kill mid-write is skipped, not fatal
    with (out / "runs.jsonl").open("a") as f:
        f.write('{"task": "torn')
    assert len(read_runs(out / "runs.jsonl")) == len(records) + len(new)
    meta = json.loads((out / "study.json").read_text())
    assert meta["runs"] == {records[0]["task"]: {STOCK: 4, UNIFORM: 3}}
    assert [c.replace(f" --out {out}", "") for c in meta["commands"]] == [
        "rlaccel bench --suite learning-quick --seeds 2 --workers 2 --tasks cartpole-dqn --variant stock --variant 'drop-in, uniform (off)'",
        "rlaccel bench --suite learning-quick --seeds 4 --workers 2 --tasks cartpole-dqn --variant stock --variant 'drop-in, uniform (off)' --resume"]


def test_a_study_starts_no_run_once_the_code_changed_and_resumes_once_it_is_committed(tmp_path, monkeypatch):
    from rlaccel_plugins.bench import report

    code = tmp_path / "code"
    code.write_text("as the study started")
    monkeypatch.setenv("RLACCEL_TEST_CODE", str(code))
    monkeypatch.setattr(report, "code_state", lambda: code.read_text())
    out = tmp_path / "study"
    kwargs = dict(out=out, workers=1, only=["cartpole-dqn"], variants=[STOCK, UNIFORM], target=editing_run)
    with pytest.raises(ConfigError, match=r"must not change while a study runs, got edited .* --resume"):
        run_study("learning-quick", seeds=2, **kwargs)
    assert runs_of(read_runs(out / "runs.jsonl")) == [(STOCK, 0)]  # the run that was going on is recorded
    run_study("learning-quick", seeds=2, resume=True, **kwargs)  # "committed": the code is the study's again
    assert runs_of(read_runs(out / "runs.jsonl")) == sorted([(STOCK, 0), (STOCK, 1), (UNIFORM, 0), (UNIFORM, 1)])


def test_the_same_runs_give_the_same_report_byte_for_byte_and_name_the_machines_they_ran_on(tmp_path):
    out = tmp_path / "study"
    out.mkdir()
    records = synthetic_records(20.0, runs=12)
    for record in records:  # the machines the runs ran on, never the one that writes the report
        record["provenance"] = {"machine": "host B" if record["seed"] >= 10 else "host A"}
    (out / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (out / "random_returns.json").write_text(json.dumps({"CartPole-v1 (gymnasium 0.0)": 999.0}))
    files = []
    for state in (1, 2):
        np.random.seed(state)  # rliable draws its resamples from the global generator: it must not matter
        write_report(out, reps=300)
        files.append([(out / name).read_bytes() for name in ("stats.json", "report.md")])
    assert files[0] == files[1]
    assert "; machines: host A; host B." in (out / "report.md").read_text()
    # the random return is keyed by env id and gymnasium version: another version's value is not used
    from importlib.metadata import version

    cached = json.loads((out / "random_returns.json").read_text())
    assert cached["CartPole-v1 (gymnasium 0.0)"] == 999.0
    assert 15 < cached[f"CartPole-v1 (gymnasium {version('gymnasium')})"] < 30


def test_failed_empty_and_nan_runs_are_counted_shown_and_refuse_a_comparison():
    records = synthetic_records(50.0, runs=10)
    records[3]["curve"] = []                                   # no evaluation at all
    records[12]["curve"][2]["mean_reward"] = float("nan")      # a diverged evaluation
    records.append({"task": TASK, "variant": UNIFORM, "seed": 10, "status": "failed", "error": "Boom"})
    stats = analyse(records, {"CartPole-v1": 22.0}, reps=200)
    rows = stats["tasks"][TASK]["rows"]
    assert (rows[STOCK]["invalid"], rows[UNIFORM]["invalid"], rows[UNIFORM]["failed"]) == (1, 1, 1)
    pair = stats["tasks"][TASK]["pairs"][f"{UNIFORM} > {STOCK}"]
    assert "1 failed run(s) of" in pair["refused"] and "no finite score" in pair["refused"]
    text = markdown(stats, {"study": "synthetic"})
    assert f"| {UNIFORM} > {STOCK} | 10 | refused: " in text and "| 1 / 1 |" in text
    # a failed run that was retried to success is not lost
    records.append({**synthetic_records(0.0, runs=11)[-1], "variant": UNIFORM, "seed": 10})
    assert analyse(records, {"CartPole-v1": 22.0}, reps=200)["tasks"][TASK]["rows"][UNIFORM]["failed"] == 0


def test_a_variant_whose_runs_sampled_differently_is_refused_and_old_labels_are_read_by_what_they_sampled(tmp_path):
    records = synthetic_records(50.0, runs=6, variants=(UNIFORM, ARTICLE))
    records[-1]["replay_sampling"] = UNIFORM_SAMPLED
    stats = analyse(records, {"CartPole-v1": 22.0}, reps=200)
    assert stats["tasks"][TASK]["rows"][ARTICLE]["sampled"].startswith("mixed: tiers 0.7/0.2/0.08/0.02")
    assert "sampled differently" in stats["tasks"][TASK]["pairs"][f"{ARTICLE} > {UNIFORM}"]["refused"]
    # a run from before runs recorded their sampling, under the name the article tiers had then
    old = {"task": TASK, "variant": "drop-in, no argument", "seed": 0, "status": "ok", "curve": []}
    (tmp_path / "runs.jsonl").write_text(json.dumps(old) + "\n" + json.dumps({**old, "replay_sampling": {}}) + "\n")
    assert [r["variant"] for r in read_runs(tmp_path / "runs.jsonl")] == [ARTICLE, "drop-in, no argument"]
    # every drop-in label says what it samples, whatever the presets' defaults are
    from rlaccel_plugins.bench.runner import variant_config

    for task in TASKS.values():
        for variant in task.variants:
            config = variant_config(variant).replay_buffer
            if variant.name in (TIERS, ARTICLE):
                assert config.sampling == "tiers", (task.key, variant.name)
            if variant.name == UNIFORM:
                assert config.sampled()["sampling"] == "uniform", (task.key, variant.name)


def test_a_threshold_at_or_below_the_random_return_is_refused():
    with pytest.raises(ConfigError, match=r"threshold must lie above the random policy's return on CartPole-v1"):
        analyse(synthetic_records(0.0, runs=3), {"CartPole-v1": 600.0}, reps=100)


def test_halves_show_a_crossing_and_a_family_keeps_the_tiers_only_when_fresh_seeds_confirm_them():
    task = TASKS["cartpole-dqn"].key
    late = synthetic_records(150.0, runs=20, variants=(UNIFORM, ARTICLE), late_only=True, task=task)
    stats = analyse(late, {"CartPole-v1": 22.0}, reps=300)
    by = stats["tasks"][task]["pairs"][f"{ARTICLE} > {UNIFORM}"]["poi_by"]
    assert by["early"][1] < 0.5 < by["early"][2] and by["late"][1] > 0.5  # no gain early, a clear one late
    decision = stats["decisions"]["sb3 DQN"]
    assert (decision["screen_seeds"], decision["confirm_seeds"], decision["sampling"]) == (10, 10, "tiers")
    screened_only = [r for r in late if r["seed"] < 10]
    decision = analyse(screened_only, {"CartPole-v1": 22.0}, reps=300)["decisions"]["sb3 DQN"]
    assert (decision["sampling"], decision["why"]) == ("uniform", "screened, not confirmed yet: needs fresh seeds")
    # the gain on seeds 0-9 only: not confirmed
    fading = [r if r["seed"] < 10 or r["variant"] == UNIFORM else
              {**r, "curve": [{**p, "mean_reward": p["mean_reward"] - 150.0} for p in r["curve"]]} for r in late]
    decision = analyse(fading, {"CartPole-v1": 22.0}, reps=300)["decisions"]["sb3 DQN"]
    assert (decision["sampling"], decision["why"]) == ("uniform", "not confirmed on fresh seeds")


@pytest.mark.needs("stable_baselines3")
def test_the_replay_volume_sweep_reads_its_base_from_the_sb3_adapters_rl_zoo_recipe():
    from rlaccel_plugins.bench.study import volume_base
    from rlaccel_plugins.plugins import get_plugin_manager

    recipe = get_plugin_manager().adapters.get("sb3").load("recipes")("dqn", "CartPole-v1")
    assert volume_base() == {key: recipe[key] for key in ("gradient_steps", "batch_size", "train_freq")}
    assert volume_base()["train_freq"] == 256  # RL Zoo's CartPole DQN, the study's own task


@pytest.mark.needs("minatar", "stable_baselines3")
@pytest.mark.filterwarnings("ignore::rlaccel_plugins.errors.RlaccelWarning")
def test_the_pixel_study_trains_minatar_with_sparse_dense_updates_of_the_head(tmp_path, monkeypatch):
    from dataclasses import replace

    from rlaccel_plugins.bench import study
    from rlaccel_plugins.bench.study_report import family_of

    key = study.PIXEL_TASKS[0]
    task = study.TASKS[key]
    assert task.requires == "minatar" and dict(task.hyperparams)["exploration_fraction"] == 0.1
    assert [v.name for v in task.variants] == [STOCK, UNIFORM, ARTICLE, study.SPARSE_DENSE]
    assert family_of(task.key) == "sb3 DQN (images)"  # decided apart from DQN on vector observations
    # the recipe's 5,000-step warm-up would leave a smoke run untrained
    monkeypatch.setitem(study.TASKS, key, replace(task, hyperparams=(*task.hyperparams, ("learning_starts", 100))))
    run_study("pixels", seeds=1, workers=1, out=tmp_path, only=[key], variants=[study.SPARSE_DENSE], steps=600)
    (record,) = read_runs(tmp_path / "runs.jsonl")
    assert record["status"] == "ok" and record["env_steps"] == 600, record.get("error")
    stats = record["stats"]
    assert (stats["full_updates"], stats["dense_updates"]) == (5, 495)  # 500 gradient steps: every 100th full
    assert all(point["train_seconds"] > 0 for point in record["curve"])  # the area over time needs them
