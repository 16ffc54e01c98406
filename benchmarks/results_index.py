"""Write what the results files say, where the docs show it:

- ``benchmarks/results/INDEX.md``: every results folder (older runs under ``archive/``), the command
  that wrote it, when, and which docs pages cite it;
- ``docs/results.md``: the current figure of each maintained benchmark and the learning study;
- the results table of ``README.md`` (between its ``results:`` markers).

Every figure is read from a results file here; none is typed in. ``--check`` writes nothing and fails
when the results page or the README table is out of date (the tests run it; ``INDEX.md`` is not
checked, since its dates come from the git history, which a shallow clone does not have).

Usage:
    python -m benchmarks.results_index [--check]
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from rlaccel_plugins.bench.study import study_commands
from rlaccel_plugins.bench.study_report import MIN_RUNS, family_of

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
INDEX = RESULTS / "INDEX.md"


def commands(folder: Path) -> list[str]:
    """What produced the folder's files, as they say it."""
    found = []
    for path in sorted(folder.iterdir()):
        if path.suffix in (".txt", ".log") and path.is_file():
            first = path.read_text(errors="replace").splitlines()[:1]
            if first and first[0].startswith("$ "):
                found.append(f"`{first[0][2:].strip()}` ({path.name})")
        elif path.name == "results.json":
            found.append(_bench_summary(json.loads(path.read_text())))
        elif path.name == "study.json":  # a learning study: every command that added runs to it, in order
            found += [f"`{command}` (study.json)" for command in study_commands(json.loads(path.read_text()))]
        elif path.suffix == ".json" and path.is_file():
            document = json.loads(path.read_text())
            if isinstance(document, dict) and "headline" in document and document.get("command"):
                found.append(f"`{document['command']}` ({path.name}" + (", converted from "
                             f"{document['converted_from']}" if document.get("converted_from") else "") + ")")
    return found


def _bench_summary(results: dict) -> str:
    variants = list(dict.fromkeys(r["variant"] for r in results.get("records", [])))
    command = results.get("command") or f"rlaccel bench --suite {results.get('suite')} --seeds {results.get('seeds')}"
    date = f" ({results['date']})" if results.get("date") else ""
    return (f"`{command}`{date}: {', '.join(variants)}"
            + (f"; {results['machine']}" if results.get("machine") else ""))


def last_commit_date(folder: Path) -> str:
    out = subprocess.run(["git", "log", "-1", "--format=%cs", "--", str(folder)], cwd=ROOT,
                         capture_output=True, text=True, check=False).stdout.strip()
    return out or "not committed"


def cited_by(name: str, pages: dict[str, str]) -> list[str]:
    """The docs pages (README included) that name the folder: ``results/<name>`` or `` `<name>/` ``,
    or a glob that matches it (`` `quick-dropin-off*/` ``)."""
    found = []
    for page, text in pages.items():
        tokens = re.findall(r"results/([\w.*-]+)", text) + re.findall(r"`([\w.*-]+)/", text)
        if any(fnmatch.fnmatchcase(name, token) for token in tokens):
            found.append(page)
    return found


def docs_pages() -> dict[str, str]:
    pages = {"README.md": (ROOT / "README.md").read_text()}
    pages.update({str(p.relative_to(ROOT)): p.read_text() for p in sorted((ROOT / "docs").rglob("*.md"))
                  if p.name != "results.md"})
    return pages


def build_index() -> str:
    about = ("Written by `python -m benchmarks.results_index`; each folder holds what the command(s) below "
             "wrote, on this project's 2-core VM unless a file says otherwise. Compare ratios within one run, "
             "not absolute rates across runs (the VM is not always the same machine). The current figures "
             "are in `docs/results.md`; `archive/` holds runs a later one replaced.")
    pages = docs_pages()
    lines = ["# Benchmark results", "", about, ""]
    folders = sorted(p for p in RESULTS.iterdir() if p.is_dir() and p.name != "archive")
    archive = RESULTS / "archive"
    if archive.is_dir():
        folders += sorted(p for p in archive.iterdir() if p.is_dir())
    for folder in folders:
        name = str(folder.relative_to(RESULTS))
        lines.append(f"## `{name}/` (last committed {last_commit_date(folder)})")
        lines.append("")
        lines += [f"- {c}" for c in commands(folder)] or ["- (no command recorded in its files)"]
        cited = cited_by(folder.name, pages)
        lines.append(f"- cited by: {', '.join(cited) if cited else 'none'}")
        lines.append("")
    return "\n".join(lines)


# --------------------------------------------------------------------------- current figures
def source_cell(source: str, link: bool) -> str:
    """A results file: a relative link where the page sits in the repository (the README), else its path (the
    docs site, served without the repository: no address of it is assumed)."""
    return f"[{Path(source).parent.name}]({source})" if link else f"`{source}`"


@dataclass(frozen=True)
class Figure:
    """One current figure: what it measures, its value (with its interval), how, where and when."""

    measure: str
    value: str
    command: str
    machine: str
    date: str
    source: str  # the results file, relative to the repository

    def __post_init__(self) -> None:
        object.__setattr__(self, "machine", machine_name(self.machine))


def machine_name(described: str) -> str:
    """One name per kind of machine, however a results file describes it: ``NVIDIA H200 GPU``, or
    ``CPU, N cores (model)``; the file itself keeps the full description."""
    if "H200" in described or "H100" in described:
        return "NVIDIA " + re.search(r"H[12]00", described).group(0) + " GPU"  # type: ignore[union-attr]
    cores = re.search(r"(\d+) (?:cores|torch threads)", described)
    model = re.search(r"\(([^)]*(?:EPYC|Xeon)[^)]*)\)", described)
    return "CPU" + (f", {cores.group(1)} cores" if cores else "") + (f" ({model.group(1)})" if model else "")


def _read(file: str) -> tuple[dict, Path]:
    """A maintained benchmark's results file (``benchmarks/_results.py``'s layout) and its path."""
    from benchmarks import _results

    path = RESULTS / file
    return _results.read(path), path


def _figure(measure: str, value: str, document: dict, path: Path) -> Figure:
    return Figure(measure, value, document["command"], document["machine"], document["date"],
                  str(path.relative_to(ROOT)))


def learn_time(measure: str, file: str, variant: str = "drop-in") -> Figure:
    """A ``benchmarks.dropin_learn`` run: the variant's share of stock's ``learn()`` time."""
    document, path = _read(file)
    for row in document["rows"]:
        if row["variant"] == variant:
            low_high = row.get("vs_stock_range")
            spread = f" (segments {low_high[0]:.2f}–{low_high[1]:.2f}x)" if low_high else ""
            return _figure(measure, f"{row['vs_stock']:.2f}x stock's time{spread}", document, path)
    raise ValueError(f"{path}: no {variant!r} row")


def gpu_learn(measure: str, file: str, case: str) -> Figure:
    """A ``benchmarks.gpu_bench --learn`` run: the drop-in's ``learn()`` speed on ``case``."""
    document, path = _read(file)
    for row in document["rows"]:
        if row["case"] == f"learn(): {case}":
            return _figure(measure, f"{row['speed_vs_stock']:.2f}x stock's speed", document, path)
    raise ValueError(f"{path}: no {case!r} row")


def checkpoint_size(measure: str, file: str, ours: str, stock: str) -> Figure:
    document, path = _read(file)
    sizes = {row["buffer"]: row["pickle_mb"] for row in document["rows"]}
    return _figure(measure, f"{sizes[ours]:,.1f} MB against {sizes[stock]:,.1f} MB", document, path)


def buffer_memory(measure: str, file: str) -> Figure:
    """A ``benchmarks.buffer_memory`` run: the drop-in's peak memory against SB3's buffer, with and without its
    ``optimize_memory_usage``, and what 1M transitions would need (extrapolated)."""
    document, path = _read(file)
    gb = {row["variant"]: (row["peak_mb"] / 1024, row["extrapolated_1m_gb"]) for row in document["rows"]}
    ours, stock, halved = gb["drop-in"], gb["stock"], gb["stock + optimize_memory_usage"]
    return _figure(measure, f"{ours[0]:.2f} GB against {stock[0]:.1f} GB ({halved[0]:.1f} GB with "
                            f"optimize_memory_usage); 1M transitions, extrapolated: {ours[1]:.1f} GB against "
                            f"{stock[1]:.0f} GB ({halved[1]:.0f} GB)", document, path)


STUDY = RESULTS / "learning"
PEERS = RESULTS / "peers"
def peer_figures() -> list[Figure]:
    """Per task of the peer benchmark's results files (``peers.json`` first): the default drop-in's steady-state
    time against SBX's (where SBX ran) and against stock's; a task once, from the first file that has it."""
    out, seen = [], set()
    for path in _peer_files():
        out += _peer_file_figures(path, seen)
    return out


def _peer_file_figures(path: Path, seen: set) -> list[Figure]:
    document, _ = _read(path)
    out = []
    for row in document["rows"]:
        if row["task"] in seen or row["new_processes"] or not row["headline"]:
            continue
        seen.add(row["task"])
        against = [f"{_ci(row[key], suffix='x')} {peer}'s" for key, peer in (("steady_vs_sbx", "SBX"),
                                                                           ("steady_vs_stock", "stock")) if row[key]]
        out.append(_figure(f"{row['label']}: learn() time, {row['variant']}", "; ".join(against) + " time",
                           document, path))
    return out


def _peer_files() -> list[Path]:
    """The peer benchmark's results files: ``peers.json`` first, then any other run kept beside it
    (``--name``: a run in new processes, say), the newest first."""
    def order(path: Path) -> tuple:
        newest_first = "".join(chr(255 - ord(c)) for c in _read(path)[0]["date"])
        return path.name != "peers.json", newest_first, path.name
    return sorted(PEERS.glob("peers*.json"), key=order)


def peers_section() -> str:
    """The peer benchmark's tables: every variant's steady and end-to-end time, with its ratios."""
    files = _peer_files()
    if not files:
        return ""
    lines = ["## Peers", "",
             ("The same work — RL Zoo's settings, a fixed number of env steps after a warm-up — through stock SB3, "
              "stock with one torch thread, the drop-in as the README's two lines give it (**drop-in**: "
              "[`compiled_updates: auto`](fused.md#compiled-updates-trainingcompiled_updates) compiles a "
              "`learn()` call that plans enough gradient steps: here the work, not the short warm-up), the "
              "drop-in never and always compiled (**eager**, **+ compiled**) and SBX (SB3 in JAX); on images also "
              "stock with SB3's `optimize_memory_usage`, the drop-in with `channels_last` and with the sparse/dense "
              "schedule training only the output layer on 99 of 100 steps (**head-only dense**) and with the article's "
              "schedule (**article schedule**: its last three layers; the drop-in's default until 2026-12-08, so a "
              "Pong **drop-in** row dated before then ran it). Pong is DQN's "
              "`CnnPolicy` at RL Zoo's Atari settings learning from 2,000 env steps instead of 100,000 (the same "
              "updates, sooner); SBX's Pong runs its convolutions in JAX on the CPU. "
              "**Steady**: the fixed work after the warm-up; **end to end**: warm-up and work, what a run pays. "
              "Ratios are times (lower is faster), the median over interleaved rounds with a 95% bootstrap CI "
              "(with 3 rounds, their range). Unless a table says *new processes*, all rounds run in one "
              "process, so JAX's JIT and the compiled step are paid in the first round and kept in memory after "
              "it: **first run** is the first round's end to end, with what the compiled step cost in it "
              "(*compiled*: traced and compiled in that run; *loaded*: read from the cache a run before left). "
              "A task *beside N busy processes* ran with N other processes each keeping a core busy. "
              "Where the time goes: [the dated note](notes/peers-2026-12-06.md).")]
    for path in files:
        document, _ = _read(path)
        processes = any(row["new_processes"] for row in document["rows"])
        lines += ["", (f"`{document['command']}` ({document['date']}; {document['machine']})"
                       + ("; each run in *new processes*" if processes else "") + ":"), "",
                  "| task | variant | steady s | vs stock | vs SBX | end to end s | vs SBX | first run s |",
                  "|---|---|---:|---:|---:|---:|---:|---:|"]
        for row in document["rows"]:
            compiled = "".join(f", {event} {seconds:.1f} s" for event, seconds in row["first_run_compiled"])
            cells = [_ci(row[key], suffix="x") if row[key] else "—"
                     for key in ("steady_vs_stock", "steady_vs_sbx", "end_to_end_vs_sbx")]
            lines.append(f"| {row['label']} | {row['variant']} | {row['steady_s']:.1f} | {cells[0]} | {cells[1]} | "
                         f"{row['end_to_end_s']:.1f} | {cells[2]} | {row['first_run_s']:.1f}{compiled} |")
    return "\n".join(lines) + "\n"


def default_variant(stats: dict, task: str) -> str:
    """The study variant a user gets with no argument on ``task``: the article's tiers where the decision table
    keeps them for its family, else uniform sampling."""
    tiers = stats["decisions"].get(family_of(task), {}).get("sampling") == "tiers"
    return "drop-in, article tiers" if tiers else "drop-in, uniform (off)"


def _ci(values: list[float], digits: int = 2, suffix: str = "") -> str:
    point, low, high = values
    return f"{point:.{digits}f}{suffix} [{low:.{digits}f}, {high:.{digits}f}]"


def study_figures() -> list[Figure]:
    """Per study task: the default drop-in's speed on fixed work and P(drop-in > stock) in learning."""
    stats = json.loads((STUDY / "stats.json").read_text())
    speed = json.loads((STUDY / "speed.json").read_text())
    study = json.loads((STUDY / "study.json").read_text())
    out = []
    for task, data in stats["tasks"].items():
        default = default_variant(stats, task)
        row = data["rows"].get(default, {})
        found = data["pairs"].get(f"{default} > stock", {})
        decided = not found.get("refused") and min(found.get("runs", (0,))) >= MIN_RUNS
        pair = found.get("poi") if decided else None  # a figure from fewer runs says little: the report has it
        ratio = row.get("speed", {}).get("vs_stock")
        if ratio:
            out.append(Figure(f"{task}: env steps/s, same learning work", _ci(ratio, suffix="x") + " stock's",
                              speed["command"], speed["machine"].split(",")[0], speed["date"],
                              str((STUDY / "speed.json").relative_to(ROOT))))
        if pair:
            ours, stocks = found["runs"]
            runs = f"{ours} seeds" if ours == stocks else f"{ours} runs against stock's {stocks}"
            out.append(Figure(f"{task}: learning, P(drop-in > stock), {runs}", _ci(pair),
                              " && ".join(study_commands(study)), speed["machine"].split(",")[0], study["updated"][:10],
                              str((STUDY / "stats.json").relative_to(ROOT))))
    return out


def current_figures() -> list[Figure]:
    """The figure of each maintained benchmark that the README and the results page show."""
    return [
        *peer_figures(),
        *study_figures(),
        learn_time("SB3 DQN CartPole-v1: learn(), fixed work", "dropin-lean-step/dropin_learn-dqn-cartpole.json"),
        learn_time("SB3 SAC InvertedPendulum-v5: learn(), fixed work", "dropin-lean-step/dropin_learn-sac-pendulum.json"),
        learn_time("SB3 PPO CartPole-v1: learn(), fixed work", "dropin-lean-step/dropin_learn-ppo-cartpole.json"),
        gpu_learn("SB3 DQN CartPole-v1 on a GPU: learn(), fixed work", "gpu-h200/gpu_bench.json",
                  "DQN CartPole (RL Zoo)"),
        gpu_learn("SB3 SAC Pendulum on a GPU: learn(), fixed work", "gpu-h200/gpu_bench.json",
                  "SAC Pendulum (RL Zoo)"),
        buffer_memory("SB3 DQN replay buffer, 200k Atari transitions (4x84x84): peak memory",
                      "buffer-memory/buffer_memory.json"),
        checkpoint_size("Tianshou checkpoint, 2,048 Pong transitions in a 100k buffer",
                        "checkpoint-size/checkpoint_size.json", "Tianshou drop-in TieredVectorReplayBuffer",
                        "Tianshou VectorReplayBuffer (--stock)"),
    ]


def figures_table(figures: list[Figure], link: bool) -> str:
    rows = ["| measure | drop-in (95% CI where measured) | machine | date | source |", "|---|---|---|---|---|"]
    for f in figures:
        rows.append(f"| {f.measure} | {f.value} | {f.machine} | {f.date} | {source_cell(f.source, link)} |")
    return "\n".join(rows)


def study_plots() -> list[tuple[str, Path]]:
    """The learning study's per-task IQM figures, in the report's task order."""
    from rlaccel_plugins.bench.study_report import slug

    stats = json.loads((STUDY / "stats.json").read_text())
    return [(task, STUDY / f"iqm-{slug(task)}.png") for task in stats["tasks"] if (STUDY / f"iqm-{slug(task)}.png").exists()]


def learning_section() -> str:
    """The learning study's decision table, summary and plots, from its stats.json (the report's own tables)."""
    from rlaccel_plugins.bench.study_report import decision_table, summary_table

    stats = json.loads((STUDY / "stats.json").read_text())
    study = json.loads((STUDY / "study.json").read_text())
    lines = ["## Learning study", "",
             (f"The full report with every table is `{(STUDY / 'report.md').relative_to(ROOT)}`; what each table "
              "means, and the rule the decisions follow: [Learning study](learning.md). The runs behind it, in the "
              "order they were made (each `--resume` adds seeds or variants to the same folder), then its speed "
              "measure:"), "", "```bash", *study_commands(study),
             "rlaccel bench --suite speed --study learning-quick", "```", "",
             "### What the no-argument default samples, per algorithm family", "", decision_table(stats), "",
             "### Every task and variant", "", summary_table(stats), "",
             "### Learning curves", "",
             *[f"![IQM sample-efficiency curves, {task}](img/learning-{path.name})\n" for task, path in study_plots()],
             "### P(X > Y), every pair and task", "",
             "![Probability of improvement](img/learning-probability_of_improvement.png)", ""]
    return "\n".join(lines)


# Each maintained script's latest run: its results file (what ``--out`` wrote), whose headline the page shows. A new
# maintained script needs an entry (tested).
LATEST = {
    "async_bench.py": "async-bench/async_bench.json",
    "buffer_memory.py": "buffer-memory/buffer_memory.json",
    "checkpoint_size.py": "checkpoint-size/checkpoint_size.json",
    "collect_bench.py": "collect-pong/collect_bench.json",
    "dropin_learn.py": "dropin-lean-step/dropin_learn-dqn-cartpole.json",
    "fused_bench.py": "fused-sb3-lean/fused_bench.json",
    "gpu_bench.py": "gpu-h200/gpu_bench.json",
    "grad_norm_bench.py": "grad-norm-bench/grad_norm_bench.json",
    "peer_phases.py": "peers/phases.json",
    "peers.py": "peers/peers.json",
    "ray_scaling.py": "ray_scaling/ray_scaling.json",
    "replay_bench.py": "replay-bench/replay_bench.json",
    "sb3_overhead.py": "sb3-overhead/sb3_overhead.json",
    "tianshou_overhead.py": "tianshou-overhead/tianshou_overhead.json",
    "update_overheads.py": "update-overheads/update_overheads.json",
    "updates_bench.py": "updates-bench/updates_bench.json",
}


def latest_figure(script: str) -> tuple[str, str, str]:
    """``(figure, date, source)`` of a maintained script's latest run, read from its results file (one converted
    from an earlier output says from what)."""
    entry = LATEST[script]
    document, path = _read(entry)
    converted = f" (converted from {document['converted_from']})" if document.get("converted_from") else ""
    return document["headline"] + converted, document["date"], str(path.relative_to(ROOT))


def maintained_scripts() -> list[Path]:
    return [p for p in sorted((ROOT / "benchmarks").glob("[!_]*.py")) if p.name != "results_index.py"]


def suite_section() -> str:
    """The maintained scripts, each with the first sentence of its docstring and its latest run's figure."""
    import ast

    lines = ["## The maintained suite", "",
             ("Besides `rlaccel bench` (its suites, the learning study and the speed measure: [the CLI](cli.md)), "
              "these scripts in `benchmarks/` are maintained: each runs in CI at a tiny size as a smoke test. "
              "Each row gives a figure of the script's latest run, from the results file linked (the command "
              "and the machine are in it). Finished one-offs are in `benchmarks/investigations/`, with what "
              "they found in a [dated note](notes/investigations.md)."), "",
             "| script | what it measures | latest run | date | source |", "|---|---|---|---|---|"]
    for path in maintained_scripts():
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        first = " ".join(doc.split("\n\n")[0].split()).replace("|", "&#124;")
        first = re.sub(r"(?<=\.) [^.]*:$", "", first)  # a sentence leading into a list is not a summary
        figure, date, source = latest_figure(path.name)
        lines.append(f"| `{path.name}` | {first} | {figure} | {date} | {source_cell(source, link=False)} |")
    return "\n".join(lines) + "\n"


def build_results_page() -> str:
    figures = current_figures()
    return "\n".join([
        "# Benchmarks and results", "",
        "<!-- Written by `python -m benchmarks.results_index` from the results files; do not edit. -->", "",
        ("Every figure here is read from a results file in `benchmarks/results/` by "
        "`python -m benchmarks.results_index`. Speed is a same-run ratio on fixed work against the stock "
        "framework, variants interleaved; learning is many seeds per variant with 95% CIs. Timings on the "
        "2-core VMs these ran on are noisy: compare ratios within a run, not absolute rates across runs."), "",
        "## Current figures", "", figures_table(figures, link=False), "",
        peers_section(),
        learning_section(),
        suite_section(),
        "## History", "",
        (f"Every results folder, older runs included, with the command that wrote it: `{INDEX.relative_to(ROOT)}`. "
        "Measurements made before the learning study, with single seeds and "
        "medians, are kept as a [dated note](notes/measurements-2026-11.md)."), ""])


README_TABLE = re.compile(r"(<!-- results:start -->\n).*?(<!-- results:end -->)", re.DOTALL)


def build_readme(readme: str) -> str:
    figures = current_figures()
    table = (figures_table(figures, link=True) + "\n\nSpeed: a same-run ratio on fixed work; learning: the seeds each row "
             "names, 95% CIs. How these are measured, the learning study and every other benchmark: "
             "[Benchmarks and results](docs/results.md).\n")
    return README_TABLE.sub(lambda m: m.group(1) + table + m.group(2), readme)


def outputs() -> dict[Path, str | bytes]:
    out: dict[Path, str | bytes] = {INDEX: build_index(), ROOT / "docs" / "results.md": build_results_page(),
                                    ROOT / "README.md": build_readme((ROOT / "README.md").read_text())}
    for plot in [path for _, path in study_plots()] + [STUDY / "probability_of_improvement.png"]:
        out[ROOT / "docs" / "img" / f"learning-{plot.name}"] = plot.read_bytes()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="fail when a generated file is out of date")
    args = parser.parse_args(argv)
    stale = []
    for path, content in outputs().items():
        if args.check and path == INDEX:
            continue
        current = path.read_bytes() if path.exists() else None
        wanted = content.encode() if isinstance(content, str) else content
        if current != wanted:
            stale.append(path.relative_to(ROOT))
            if not args.check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(wanted)
    if args.check and stale:
        print(f"out of date: {', '.join(map(str, stale))}; run python -m benchmarks.results_index")
        return 1
    print(f"written: {', '.join(map(str, stale)) or 'nothing (all up to date)'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
