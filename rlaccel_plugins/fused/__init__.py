"""Framework-neutral pieces of fused updates: faster optimizer kernels switched on reversibly, Adam's
CPU step as flat ops (:func:`optimizer_step`, bit for bit PyTorch's), the foreach target-network
update, and the equivalence harness that proves a fused update equal to the framework's own. What
knows an algorithm (SB3's DQN, Tianshou's DQN, ...) lives in the adapters.

Examples:
    >>> import torch
    >>> from rlaccel_plugins.fused import OptimizerKernels, polyak_update_
    >>> net, target = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    >>> optimizer = torch.optim.Adam(net.parameters())
    >>> with OptimizerKernels([optimizer]):
    ...     optimizer.param_groups[0]["foreach"]
    True
    >>> optimizer.param_groups[0]["foreach"] is None  # restored
    True
    >>> polyak_update_(list(net.parameters()), list(target.parameters()), tau=1.0)
    >>> torch.equal(net.weight, target.weight)
    True
"""

from rlaccel_plugins.fused.equivalence import UpdateRecorder, differences
from rlaccel_plugins.fused.flat_optim import optimizer_step
from rlaccel_plugins.fused.kernels import OptimizerKernels, polyak_update_, zero_grad

__all__ = ["OptimizerKernels", "UpdateRecorder", "differences", "optimizer_step", "polyak_update_", "zero_grad"]
