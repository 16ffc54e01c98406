"""Sparse/dense gradient updates: the whole network every N optimizer steps, the last layers otherwise.

- `layers`   — layer discovery back from the outputs along the autograd graph; dense-set selection
- `schedule` — `SparseDenseSchedule` (which steps are full)
- `flops`    — measured forward / full-backward / dense-backward FLOPs
- `updater`  — `SparseDenseUpdater`, attached through `Optimizer.register_step_post_hook`
"""

from rlaccel_plugins.updates.flops import StepFlops, measure_step_flops
from rlaccel_plugins.updates.layers import LayerMap, discover_layers, select_dense_params
from rlaccel_plugins.updates.schedule import SparseDenseSchedule
from rlaccel_plugins.updates.updater import Attachment, SparseDenseUpdater

__all__ = ["Attachment", "LayerMap", "SparseDenseSchedule", "SparseDenseUpdater", "StepFlops", "discover_layers",
           "measure_step_flops", "select_dense_params"]
