"""Resolve ``"auto"`` settings from the hardware: env count, device, threads, precision."""

from __future__ import annotations

import os
from dataclasses import dataclass

from rlaccel_plugins.config import AUTO, AccelConfig


def cpu_count() -> int:
    """Cores this process may use (the affinity mask, not the host's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def cpu_model() -> str | None:
    """The CPU's model name as the OS reports it (``/proc/cpuinfo`` on Linux), or None: what kernels a
    library picks (oneDNN's AVX-512 ones, say) and so how much a CPU path pays depend on it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip() or None
    except OSError:
        pass
    import platform

    return platform.processor() or None


def gpu_info() -> tuple[str, str | None]:
    """``(device, name)``: the best torch device and the accelerator's name, if any."""
    import torch

    if torch.cuda.is_available():
        return "cuda", torch.cuda.get_device_name(0)
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return "mps", "Apple MPS"
    return "cpu", None


@dataclass(frozen=True)
class ResolvedHardware:
    """The concrete values that ``"auto"`` settings take on this machine."""

    parallel_envs: int
    device: str
    num_threads: int
    precision: str


def resolve_auto(config: AccelConfig) -> ResolvedHardware:
    """Resolve every ``"auto"`` in ``config`` for this machine; explicit values are kept.

    Rules: device = cuda > mps > cpu; threads = usable cores, or ``OMP_NUM_THREADS`` where the user set
    it (the cap torch itself honours); env count = 2 per core on CPU
    (envs are cheap, the learner shares the cores), 8 per core up to 256 with a GPU doing inference;
    precision = bf16 on a GPU that supports it, fp16 on an older GPU, fp32 on CPU.

    Examples:
        >>> import rlaccel_plugins as rla
        >>> resolve_auto(rla.get_preset("atari")).parallel_envs     # explicit: kept
        256
    """
    cores = cpu_count()
    device, _ = gpu_info() if config.training.device == AUTO else (config.training.device, None)
    on_gpu = device.startswith("cuda")
    envs = config.training.parallel_envs
    if envs == AUTO:
        envs = min(256, 8 * cores) if on_gpu else max(2, 2 * cores)
    threads = config.training.num_threads
    if threads == AUTO:
        threads = _thread_cap() or cores
    precision = config.precision.dtype
    if precision == AUTO:
        precision = auto_precision(device)
    return ResolvedHardware(parallel_envs=int(envs), device=device, num_threads=int(threads), precision=precision)


def _thread_cap() -> int | None:
    """``OMP_NUM_THREADS`` as a positive int, or None where it is unset or not one."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def auto_precision(device: str) -> str:
    """What ``training.precision: auto`` trains in on ``device``: fp32 on the CPU, bf16 on a GPU that has it, else
    fp16 (with loss scaling).

    Examples:
        >>> auto_precision("cpu")
        'fp32'
    """
    if not device.startswith("cuda"):
        return "fp32"
    import torch

    return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
