"""The SB3 code rlaccel's fused updates and lean collection replace or mirror, and the record of the code
they were verified against (``verified.json``, written by ``python -m tools.fingerprints
--update`` after the equivalence tests pass)."""

from __future__ import annotations

from pathlib import Path

from rlaccel_plugins.fused.fingerprints import Replacement, VerifiedCode
from rlaccel_sb3.fused.registry import ACTOR_CRITIC_POLICY, ALGORITHMS, OFF_POLICY_COLLECTION, SB3

# each fused train() (its entry in the registry), then the lean collection (off-policy: the shared loop and
# what each algorithm's entry says it mirrors)
REPLACEMENTS = {r.key: r for r in (
    *(Replacement(a.key, a.replaces) for a in ALGORITHMS),
    Replacement("collection:off_policy", (*OFF_POLICY_COLLECTION, *(t for a in ALGORITHMS for t in a.collects))),
    Replacement("collection:on_policy", (f"{SB3}.common.policies:ActorCriticPolicy.forward", *ACTOR_CRITIC_POLICY)),
)}

CODE = VerifiedCode(REPLACEMENTS, Path(__file__).with_name("verified.json"), ("stable-baselines3", "sb3-contrib"))


def train_key(model) -> str:
    """The replacement key of ``model``'s fused ``train``: the SB3 class whose ``train`` it runs."""
    owner = next(c for c in type(model).__mro__ if "train" in vars(c))
    return f"train:{owner.__name__}"
