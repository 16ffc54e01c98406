"""Does ``torch.compile`` pay for a DQN gradient step on this machine? Eager vs compiled, same run.

A DQN step of the fused path's math (online forward, gather, Huber loss, backward, foreach clipping,
foreach Adam) on random CartPole-shaped data, for 64-64 and 256-256 MLPs: eager; the loss and its
backward compiled (``torch.compile`` of the loss function); and the whole step compiled, optimizer
included. Reported: ms per step (median of 3 interleaved rounds of 200 steps) and the compile warm-up,
which a run pays once per graph (and again for each sparse/dense phase, each a different graph).

Usage:
    python -m benchmarks.investigations.compile_bench
"""

from __future__ import annotations

import statistics
import time
import warnings

import torch
import torch.nn.functional as F


def mlp(hidden: tuple[int, ...]) -> torch.nn.Sequential:
    layers, width = [], 4
    for h in hidden:
        layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
        width = h
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 2))


def measure(hidden: tuple[int, ...], batch: int) -> tuple[dict[str, float], float]:
    """ms per step of each variant, and the compile warm-up in seconds."""
    torch.manual_seed(0)
    net = mlp(hidden)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-4, foreach=True)
    params = list(net.parameters())
    obs, act, y = torch.randn(batch, 4), torch.randint(0, 2, (batch, 1)), torch.randn(batch, 1)

    def loss_of(obs, act, y):
        return F.smooth_l1_loss(net(obs).gather(1, act), y)

    def step_with(loss_fn):
        def step(obs, act, y):
            loss = loss_fn(obs, act, y)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 10.0, foreach=True)
            optimizer.step()
            return loss.detach()
        return step

    variants = {"eager": step_with(loss_of), "loss": step_with(torch.compile(loss_of)),
                "step": torch.compile(step_with(loss_of))}
    start = time.perf_counter()
    for name in ("loss", "step"):
        for _ in range(2):
            variants[name](obs, act, y)
    warm = time.perf_counter() - start
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(3):
        for name, step in variants.items():
            start = time.perf_counter()
            for _ in range(200):
                step(obs, act, y)
            times[name].append((time.perf_counter() - start) / 200 * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}, warm


def main() -> None:
    warnings.filterwarnings("ignore")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; ms per DQN gradient step")
    print(f"{'net':<9} {'batch':>5} {'eager':>7} {'loss compiled':>16} {'step compiled':>16} {'warm-up s':>10}")
    for hidden, batch in [((64, 64), 64), ((256, 256), 64), ((256, 256), 256)]:
        ms, warm = measure(hidden, batch)
        print(f"{'-'.join(map(str, hidden)):<9} {batch:>5} {ms['eager']:>7.3f} {ms['loss']:>8.3f} "
              f"({ms['loss'] / ms['eager']:.2f}x) {ms['step']:>8.3f} ({ms['step'] / ms['eager']:.2f}x) {warm:>10.1f}",
              flush=True)


if __name__ == "__main__":
    main()
