"""Helpers of the compiled-step equivalence tests."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def python_wrapper() -> Iterator[None]:
    """Compiled steps built inside compile with inductor's Python wrapper instead of its C++ one: the same
    generated kernels, so the same rounding, called from Python. For the SAC and TD3 loops, whose C++ wrapper
    takes about 2 minutes to compile on 2 cores against about 25 s; the C++ wrapper's loops are tested on
    DQN, QR-DQN and PPO, its one-step calls on every algorithm."""
    from rlaccel_plugins.fused import compiled_step

    options, compiled = dict(compiled_step.OPTIONS), dict(compiled_step._COMPILED)
    compiled_step.OPTIONS["cpp_wrapper"] = False
    compiled_step._COMPILED.clear()
    try:
        yield
    finally:
        compiled_step.OPTIONS.clear()
        compiled_step.OPTIONS.update(options)
        compiled_step._COMPILED.clear()
        compiled_step._COMPILED.update(compiled)


def compiled_loop_run(model, run: Callable, train: Callable) -> dict:
    """``run(model, train(model, compiled=True))`` with the loop compiled under :func:`python_wrapper`."""
    with python_wrapper():
        return run(model, train(model, compiled=True))
