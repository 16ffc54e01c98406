"""The Tianshou code rlaccel's fused updates and ``LeanCollector`` replace or mirror, and the record of the
code they were verified against (``verified.json``, written by ``python -m tools.fingerprints
--update`` after the equivalence tests pass)."""

from __future__ import annotations

from pathlib import Path

from rlaccel_plugins.fused.fingerprints import Replacement, VerifiedCode
from rlaccel_tianshou.fused.registry import ALGORITHMS

# each fused update (its entry in the registry), then the lean collector
REPLACEMENTS = {r.key: r for r in (
    *(Replacement(a.key, a.replaces) for a in ALGORITHMS),
    Replacement("collector", ("tianshou.data.collector:BaseCollector.collect", "tianshou.data.collector:Collector._collect",
                              "tianshou.data.collector:Collector._compute_action_policy_hidden",
                              "tianshou.data.collector:Collector.reset_env")),
)}

CODE = VerifiedCode(REPLACEMENTS, Path(__file__).with_name("verified.json"), ("tianshou",))


def update_key(algorithm) -> str:
    """The replacement key of ``algorithm``'s fused update (a key no registry entry has fails closed:
    :meth:`~rlaccel_plugins.fused.fingerprints.VerifiedCode.unverified`)."""
    return f"update:{type(algorithm).__name__}"
