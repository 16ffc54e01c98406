"""Tiered replay: levels L0 (newest) .. L{n-1} (long-term) over one ring, sampled by per-level ratios.

- `tiers`   — `TierLayout` (levels as age ranges) and the stratified batch split
- `sampler` — `TieredSampler` (ratio schedule, draws, importance weights, its own RNG)
- `schemes` — `UniformSampler`, `EreSampler`, `CerSampler` and `make_sampler` (``sampling:``)
- `storage` — `RingStorage` (named fields) and `FrameStackStorage` (de-duplicated stacked frames)
- `buffer`  — `TieredReplay`, the engine adapters build on
"""

from rlaccel_plugins.replay.buffer import Sample, TieredReplay
from rlaccel_plugins.replay.sampler import SampledIndices, TieredSampler
from rlaccel_plugins.replay.schemes import CerSampler, EreSampler, UniformSampler, make_sampler
from rlaccel_plugins.replay.storage import FrameStackStorage, RingStorage
from rlaccel_plugins.replay.tiers import TierLayout, stratified_counts

__all__ = ["CerSampler", "EreSampler", "FrameStackStorage", "RingStorage", "Sample", "SampledIndices", "TierLayout", "TieredReplay",
           "TieredSampler", "UniformSampler", "make_sampler", "stratified_counts"]
