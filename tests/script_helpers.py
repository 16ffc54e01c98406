"""Running a script of the repository (an example, a benchmark) in the test's own process, as
``python SCRIPT ARGS`` or ``python -m MODULE ARGS`` runs it: ``__name__ == "__main__"``, ``sys.argv``, the
script's folder (or the repository, for a module) first on ``sys.path``, the working directory given. A
fresh interpreter per script cost more in imports (3-5 s of torch, SB3 and Tianshou) than the tiny runs
themselves. What a script sets for the whole process (torch's thread count, grad mode) is put back."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import torch


def run_script(path: Path, args: list[str], cwd: Path, monkeypatch, capsys) -> str:
    """Run ``path`` with ``args``; returns what it printed. A non-zero ``sys.exit`` fails with its stderr."""
    monkeypatch.syspath_prepend(str(path.parent))
    return _run(lambda: runpy.run_path(str(path), run_name="__main__"), str(path), args, cwd, monkeypatch, capsys)


def run_module(module: str, args: list[str], cwd: Path, monkeypatch, capsys) -> str:
    """Run ``python -m module args`` (a module of the repository, e.g. ``benchmarks.peers``) from ``cwd``."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))
    monkeypatch.delitem(sys.modules, module, raising=False)  # imported by a sibling: run afresh, as python -m does
    return _run(lambda: runpy.run_module(module, run_name="__main__", alter_sys=True), module, args, cwd,
                monkeypatch, capsys)


def _run(run, name: str, args: list[str], cwd: Path, monkeypatch, capsys) -> str:
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", [name, *args])
    threads, grad = torch.get_num_threads(), torch.is_grad_enabled()
    try:
        run()
    except SystemExit as exit:  # --help, or a script that ends with sys.exit(code)
        assert exit.code in (0, None), capsys.readouterr().err[-4000:]
    finally:
        torch.set_num_threads(threads)
        torch.set_grad_enabled(grad)
    return capsys.readouterr().out
