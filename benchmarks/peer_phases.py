"""Where the time of a ``learn()`` goes, for stock SB3, the drop-in (eager and compiled) and SBX on the
same work, beside the arithmetic floor: the phase table behind ``benchmarks/peers.py``.

For one task of ``benchmarks/peers.py`` (default ``dqn-cartpole``), each variant learns its warm-up, then
``--steps`` env steps with its methods timed where SB3's loop calls them (the same instance attributes
for every variant, so the lean and compiled ones are timed where they replace SB3's):

- collection: ``_sample_action`` (action selection), the VecEnv's ``step``, ``_store_transition`` (buffer
  add), ``_on_step`` (exploration schedule, target update), and the rest of ``collect_rollouts``
  (callbacks, bookkeeping);
- update: ``train()`` whole, per gradient step, and host reads of a tensor's value (``.item()``: a sync
  on a GPU, Python work on the CPU) per gradient step, counted by the torch profiler on the second
  ``train()`` call, which is left out of every figure (SBX: not counted, JAX does not use torch);

then, on the model's own networks and shapes: the FLOPs of one gradient step (``torch.utils.flop_counter``),
the matrix products of that step alone at 1 and 2 threads (the floor a kernel-perfect step would hit on
this CPU), and the large-GEMM rate of this CPU (its peak). Writes ``phases.json`` to ``--out``.

Usage:
    python -m benchmarks.peer_phases [--task dqn-cartpole] [--steps 10000] [--out benchmarks/results/peers] [--name phases]
"""

from __future__ import annotations

import argparse
import functools
import time
from collections import defaultdict
from typing import Any

import torch
from stable_baselines3.common.callbacks import BaseCallback, CallbackList

from benchmarks import _results
from benchmarks.peers import COMPILED_ALGOS, TASKS, build_model, sbx_available
from rlaccel_plugins.bench.report import machine

VARIANTS = ("stock", "drop-in", "drop-in + compiled", "SBX")
COLLECTION = ("_sample_action", "_store_transition", "_on_step")


class PhaseTimer(BaseCallback):
    """Wraps the model's phase methods with timers at training start (after any callback that installs
    lean or fused ones), and puts them back at its end."""

    def __init__(self, count_reads: bool = True) -> None:
        super().__init__()
        self.count_reads = count_reads
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.host_reads: float | None = None  # per gradient step, in the one profiled train() call
        self.profiled_seconds = 0.0
        self.timed_gradient_steps = 0
        self._wrapped: list[tuple[Any, str, Any, bool]] = []

    def wrap(self, owner: Any, name: str, label: str) -> None:
        had = name in owner.__dict__
        original = getattr(owner, name)

        @functools.wraps(original)
        def timed(*args, **kwargs):
            if label == "update: train()" and self.calls[label] == 1 and self.host_reads is None and self.count_reads:
                return self._profiled(original, *args, **kwargs)  # the second call: counted, not timed
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - start
                self.calls[label] += 1
                if label == "update: train()":
                    self.timed_gradient_steps += args[0] if args else kwargs.get("gradient_steps", 0)

        setattr(owner, name, timed)
        self._wrapped.append((owner, name, original if had else None, had))

    def _profiled(self, train, *args, **kwargs):
        from torch.profiler import ProfilerActivity, profile

        gradient_steps = args[0] if args else kwargs["gradient_steps"]
        start = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            result = train(*args, **kwargs)
        reads = sum(e.count for e in prof.key_averages() if e.key == "aten::_local_scalar_dense")
        self.host_reads, self.profiled_seconds = reads / max(1, gradient_steps), time.perf_counter() - start
        self.calls["update: train()"] += 1
        return result

    def _on_training_start(self) -> None:
        model = self.model
        self.wrap(model, "train", "update: train()")
        self.wrap(model, "collect_rollouts", "collection")
        for name in COLLECTION:
            self.wrap(model, name, f"collection: {name}")
        self.wrap(model.env, "step", "collection: env step")

    def _on_step(self) -> bool:
        return True

    def _on_training_end(self) -> None:
        for owner, name, original, had in reversed(self._wrapped):
            if had:
                setattr(owner, name, original)
            else:
                delattr(owner, name)
        self._wrapped = []


def learn_phases(task, variant: str, steps: int, warmup: int) -> dict[str, Any]:
    model, callback = build_model(task, variant)
    model.learn(warmup, callback=callback)
    timer = PhaseTimer(count_reads=variant != "SBX")
    callbacks = CallbackList([c for c in (callback, timer) if c is not None])
    start = time.perf_counter()
    model.learn(steps, callback=callbacks, reset_num_timesteps=False)
    total = time.perf_counter() - start - timer.profiled_seconds
    seconds = dict(timer.seconds)
    inside = sum(v for k, v in seconds.items() if k.startswith("collection: "))
    seconds["collection: loop and callbacks"] = seconds.get("collection", 0.0) - inside
    return {"total": total, "seconds": seconds, "calls": dict(timer.calls), "env_steps": steps,
            "host_reads_per_gradient_step": None if variant == "SBX" else timer.host_reads,
            "timed_gradient_steps": max(1, timer.timed_gradient_steps),
            "note": "the second train() call runs under the torch profiler (host reads): in no figure here"}


def floor(task) -> dict[str, Any]:
    """The gradient step's FLOPs, its matrix products alone at 1 and 2 threads, the big-GEMM rate."""
    from torch.utils.flop_counter import FlopCounterMode

    from rlaccel_plugins.bench.timing import seconds

    model, _ = build_model(task, "stock")
    model.learn(task.warmup)
    with FlopCounterMode(display=False) as counter:
        model.train(8, model.batch_size)
    flops = counter.get_total_flops() / 8
    shapes = _matmul_shapes(model)
    out: dict[str, Any] = {"flops_per_gradient_step": flops, "matmuls_per_gradient_step": len(shapes)}
    threads = torch.get_num_threads()
    for n in sorted({1, threads}):
        torch.set_num_threads(n)
        operands = [(torch.randn(m, k), torch.randn(k, n_)) for m, k, n_ in shapes]
        run = functools.partial(_products, operands)
        run()
        out[f"matmuls_seconds_{n}_threads"] = seconds(run, repeat=200) / 200
    torch.set_num_threads(threads)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    out["peak_gemm_flops_per_s"] = 2 * 1024**3 * 10 / seconds(lambda: a @ b, repeat=10)
    return out


def _products(operands) -> None:
    for x, y in operands:
        torch.mm(x, y)


def _matmul_shapes(model) -> list[tuple[int, int, int]]:
    """``(m, k, n)`` of every matrix product one gradient step runs (recorded by the torch profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        model.train(1, model.batch_size)
    shapes = []
    for event in prof.events():
        if event.name in ("aten::mm", "aten::addmm") and event.input_shapes:
            a, b = event.input_shapes[1:3] if event.name == "aten::addmm" else event.input_shapes[:2]
            shapes.append((a[0], a[1], b[1]))
    return shapes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=[t for t in sorted(TASKS) if TASKS[t].algo != "ppo"], default="dqn-cartpole")
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--out", default=None, help="folder for phases.json (default: print only)")
    parser.add_argument("--name", default="phases", help="the results file's name in --out (default: phases.json)")
    args = parser.parse_args(argv)
    wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
    if any(v not in VARIANTS for v in wanted):
        parser.error(f"--variants must name {', '.join(VARIANTS)}; got {args.variants}")
    task = TASKS[args.task]
    warmup = args.warmup or task.warmup
    command = _results.command("peer_phases", argv)
    print(f"$ {command}\n{machine()}, torch {torch.__version__}", flush=True)
    variants = [v for v in wanted if (v != "SBX" or sbx_available())
                and (v != "drop-in + compiled" or task.algo in COMPILED_ALGOS)]
    results: dict[str, Any] = {"task": args.task, "variants": {}}
    for variant in variants:
        results["variants"][variant] = learn_phases(task, variant, args.steps, warmup)
    results["floor"] = floor(task)
    print(table(results))
    rows = summary_rows(results)
    _results.write(args.out, "peer_phases", name=args.name, argv=argv, headline=headline(results, rows), rows=rows,
                   **results)
    return 0


def summary_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Per variant: its time per gradient step in ``train()``, the phases' seconds and its host reads."""
    return [{"variant": variant, "ms_per_gradient_step": 1e3 * data["seconds"].get("update: train()", 0.0)
             / data["timed_gradient_steps"], "total_s": data["total"], **{f"{k} s": v for k, v in data["seconds"].items()},
             "host_reads_per_gradient_step": data["host_reads_per_gradient_step"]}
            for variant, data in results["variants"].items()]


def headline(results: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """The results page's figure (``rows``: the run's :func:`summary_rows`): each variant's milliseconds per
    gradient step, and the matrix products' alone."""
    floor_ms = 1e3 * min(v for k, v in results["floor"].items() if k.startswith("matmuls_seconds"))
    per_step = ", ".join(f"{row['variant']} {row['ms_per_gradient_step']:.2f}" for row in rows)
    task = TASKS[results["task"]]
    return f"{task.algo.upper()} {task.env_id}, ms per gradient step: {per_step}; its matrix products alone {floor_ms:.2f}"


def table(results: dict[str, Any]) -> str:
    variants = results["variants"]
    phases = sorted({p for v in variants.values() for p in v["seconds"]} - {"collection"})
    lines = [f"{results['task']}: seconds of {next(iter(variants.values()))['env_steps']:,} env steps",
             f"  {'phase':<36}" + "".join(f"{v:>20}" for v in variants)]
    for phase in ["total", "collection", *phases]:
        row = [v["total"] if phase == "total" else v["seconds"].get(phase, 0.0) for v in variants.values()]
        lines.append(f"  {phase:<36}" + "".join(f"{x:>20.2f}" for x in row))
    per_step = [1e3 * v["seconds"].get("update: train()", 0.0) / v["timed_gradient_steps"] for v in variants.values()]
    lines.append(f"  {'update, ms per gradient step':<36}" + "".join(f"{x:>20.3f}" for x in per_step))
    reads = [v["host_reads_per_gradient_step"] for v in variants.values()]
    lines.append(f"  {'host reads per gradient step':<36}" + "".join(
        f"{'—' if x is None else f'{x:.2f}':>20}" for x in reads))
    f = results["floor"]
    lines.append(f"floor: {f['flops_per_gradient_step'] / 1e6:.1f} MFLOP per gradient step in {f['matmuls_per_gradient_step']} "
                 "matrix products; those products alone: " + ", ".join(
                     f"{1e3 * v:.3f} ms ({k.split('_')[2]} thread{'s' if k.split('_')[2] != '1' else ''})"
                     for k, v in f.items() if k.startswith("matmuls_seconds"))
                 + f"; big-GEMM rate {f['peak_gemm_flops_per_s'] / 1e9:.0f} GFLOP/s")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
