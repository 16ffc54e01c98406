"""Write ``benchmarks/results/INDEX.md``: every results folder, what produced it, when, and where the
README cites it.

For each folder: the command lines its text files start with (``$ python benchmarks/...  # date``),
or for an ``rlaccel bench`` folder its suite, seeds, variants and machine (and the command, for runs
that record it); the date of the commit that last touched it; the README sections that name it.

Usage:
    python benchmarks/results_index.py
"""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
from pathlib import Path

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


def readme_sections(name: str, readme: str) -> list[str]:
    """The headings of the README sections that name the folder: ``results/<name>`` or `` `<name>/` ``,
    or a glob that matches it (`` `quick-dropin-off*/` ``)."""
    sections, heading = [], "(top)"
    for line in readme.splitlines():
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
            continue
        tokens = re.findall(r"results/([\w.*-]+)", line) + re.findall(r"`([\w.*-]+)/", line)
        if any(fnmatch.fnmatchcase(name, token) for token in tokens) and heading not in sections:
            sections.append(heading)
    return sections


def build() -> str:
    readme = (ROOT / "README.md").read_text()
    about = ("Written by `python benchmarks/results_index.py`; each folder holds what the command(s) below "
             "wrote, on this project's 2-core VM unless a file says otherwise. Compare ratios within one run, "
             "not absolute rates across runs (the VM is not always the same machine).")
    lines = ["# Benchmark results", "", about, ""]
    for folder in sorted(p for p in RESULTS.iterdir() if p.is_dir()):
        lines.append(f"## `{folder.name}/` (last committed {last_commit_date(folder)})")
        lines.append("")
        lines += [f"- {c}" for c in commands(folder)] or ["- (no command recorded in its files)"]
        cited = readme_sections(folder.name, readme)
        lines.append(f"- README: {'; '.join(cited) if cited else 'not cited'}")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    INDEX.write_text(build())
    print(f"written: {INDEX}")


if __name__ == "__main__":
    main()
