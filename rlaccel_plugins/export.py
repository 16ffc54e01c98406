"""ONNX export of a policy's deterministic action, checked against onnxruntime.

Adapters turn a saved model into an ``obs -> action`` torch module (the framework's own
preprocessing, network and action post-processing); this module exports it and checks the exported
graph gives the same actions as torch on real observations.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

from rlaccel_plugins.errors import ConfigError


def export_onnx(module: Any, example_obs: np.ndarray, path: str | Path, opset: int = 17) -> Path:
    """Export ``module`` (``obs batch -> action batch``) to ``path`` with a dynamic batch dimension.

    Written to a temp file and renamed, so an interrupted export never leaves a half-written model.
    """
    import os

    import torch

    path = Path(path)
    if path.suffix != ".onnx":
        raise ConfigError(f"--onnx must name a .onnx file, got --onnx={str(path)!r}. Example: --onnx policy.onnx")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    example = torch.as_tensor(example_obs[:1])
    module.eval()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tracer notes on constants (action bounds, validation) are expected
            torch.onnx.export(module, (example,), str(tmp), input_names=["obs"], output_names=["action"],
                              dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}}, opset_version=opset,
                              dynamo=False)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def check_onnx(module: Any, path: str | Path, observations: np.ndarray, atol: float = 1e-5) -> dict[str, Any]:
    """Run ``observations`` through torch and onnxruntime; raise if any action differs.

    Discrete actions must be equal; continuous ones within ``atol``. Returns a small report.
    """
    import onnxruntime
    import torch

    with torch.no_grad():
        expected = module(torch.as_tensor(observations)).numpy()
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {"obs": observations})[0]
    if np.issubdtype(expected.dtype, np.integer):
        mismatches = int(np.sum(np.any((got != expected).reshape(len(observations), -1), axis=1)))
        max_error = float(mismatches)
    else:
        error = np.abs(got.astype(np.float64) - expected).reshape(len(observations), -1).max(axis=1)
        mismatches, max_error = int(np.sum(error > atol)), float(error.max(initial=0.0))
    report = {"observations": len(observations), "mismatches": mismatches, "max_error": max_error}
    if mismatches:
        raise RuntimeError(f"ONNX export of {path} disagrees with torch on {mismatches} of "
                           f"{len(observations)} observations (max error {max_error:g}).")
    return report


def sample_observations(space: Any, n: int, seed: int = 0) -> np.ndarray:
    """``n`` observations from a gymnasium Box space (for checking an export)."""
    space.seed(seed)
    return np.stack([space.sample() for _ in range(n)])
