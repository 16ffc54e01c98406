"""The learning study's machinery: statistics whose answer is known, resuming, and a crashing worker."""

import json
import os

import numpy as np
import pytest

from rlaccel_plugins.bench import learning_stats as ls
from rlaccel_plugins.bench.study import STOCK, UNIFORM, read_runs, run_study
from rlaccel_plugins.bench.study_report import analyse, markdown

TASK = "sb3 DQN CartPole-v1"


def synthetic_curve(level: float, rng: np.random.Generator, points: int = 8) -> list[dict]:
    """An evaluation curve rising to ``level`` (a return), with noise."""
    steps = np.arange(1, points + 1) * 1000
    returns = level * steps / steps[-1] + rng.normal(0, 20, points)
    return [{"env_steps": int(s), "train_seconds": 0.0, "mean_reward": float(r)} for s, r in zip(steps, returns)]


def synthetic_records(shift: float, runs: int = 30, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    records = []
    for variant, offset in ((STOCK, 0.0), (UNIFORM, shift)):
        for s in range(runs):
            level = rng.normal(300, 60) + offset
            records.append({"task": TASK, "env_id": "CartPole-v1", "variant": variant, "seed": s, "budget": 8000,
                            "curve": synthetic_curve(level, rng), "status": "ok"})
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
    assert f"| {UNIFORM} > {STOCK}: " in text and "IQM area" in text


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
def fake_run(task, variant, seed):
    """A stand-in for a training run: instant, with a record shaped like a real one; seed 1 of the uniform
    variant kills its own process when RLACCEL_TEST_CRASH names a file that exists (a worker dying mid-run)."""
    marker = os.environ.get("RLACCEL_TEST_CRASH")
    if marker and seed == 1 and variant.name == UNIFORM and os.path.exists(marker):
        os.remove(marker)
        os._exit(3)
    curve = synthetic_curve(200.0 + seed, np.random.default_rng(seed))
    return {"task": task.key, "env_id": task.env_id, "variant": variant.name, "seed": seed, "curve": curve}


def test_resume_skips_finished_runs_and_a_crashed_worker_loses_only_its_own_run(tmp_path, monkeypatch):
    out = tmp_path / "study"
    marker = tmp_path / "crash-once"
    marker.write_text("")
    monkeypatch.setenv("RLACCEL_TEST_CRASH", str(marker))
    kwargs = dict(out=out, workers=2, only=["cartpole-dqn"], variants=[STOCK, UNIFORM], target=fake_run)
    run_study("learning-quick", seeds=2, **kwargs)
    records = read_runs(out / "runs.jsonl")
    failed = [r for r in records if r["status"] == "failed"]
    assert [(r["variant"], r["seed"]) for r in failed] == [(UNIFORM, 1)]
    assert "exit code 3" in failed[0]["error"]
    assert sorted((r["variant"], r["seed"]) for r in records if r["status"] == "ok") == \
        sorted([(STOCK, 0), (STOCK, 1), (UNIFORM, 0)])
    with pytest.raises(ValueError, match="--resume"):
        run_study("learning-quick", seeds=2, **kwargs)
    # resume with a third seed: the crashed run and seed 2 run, nothing else
    run_study("learning-quick", seeds=3, resume=True, **kwargs)
    new = read_runs(out / "runs.jsonl")[len(records):]
    assert sorted((r["variant"], r["seed"]) for r in new) == sorted([(STOCK, 2), (UNIFORM, 1), (UNIFORM, 2)])
    assert all(r["status"] == "ok" for r in new)
    # a line torn by a kill mid-write is skipped, not fatal
    with (out / "runs.jsonl").open("a") as f:
        f.write('{"task": "torn')
    assert len(read_runs(out / "runs.jsonl")) == len(records) + 3
    meta = json.loads((out / "study.json").read_text())
    assert meta["runs"] == {records[0]["task"]: {STOCK: 3, UNIFORM: 3}}
    assert [c.replace(f" --out {out}", "") for c in meta["commands"]] == [
        "rlaccel bench --suite learning-quick --seeds 2 --workers 2 --tasks cartpole-dqn --variant stock --variant 'drop-in, uniform (off)'",
        "rlaccel bench --suite learning-quick --seeds 3 --workers 2 --tasks cartpole-dqn --variant stock --variant 'drop-in, uniform (off)' --resume"]
