"""Fused ``train()`` for SB3 algorithms: the same math as the algorithm's own, in fewer ops.

What changes against SB3's loop of ``gradient_steps`` (each: sample, target forward, online forward,
loss, ``.item()``, backward, clip, step):

- the ``gradient_steps`` batches are drawn first (in chunks of at most 64 MB of observations: all at
  once for vector observations, a few steps for Atari frames), by the buffer's own ``sample()`` called
  as many times, so every RNG (numpy's, the tiered sampler's) is consumed exactly as SB3 consumes
  it — and stacked into one tensor per field;
- DQN/QR-DQN's target network does not change inside ``train()`` (SB3 updates it in ``_on_step``), so
  the targets of a chunk's batches come from **one** forward pass of the target network;
- on a CUDA device each gradient step is a captured CUDA graph (``rlaccel_plugins.fused.graphs``);
- the optimizer and the gradient clipping run PyTorch's multi-tensor (``foreach``) kernels (the same
  arithmetic, one kernel per op for all parameters); losses are logged once per call, no ``.item()``
  per step;
- importance weights of the tiered buffer are applied in the loss directly (SB3's own path scales
  the output gradients through a hook);
- SAC's, TD3's and DDPG's ``MlpPolicy`` actors and critics run as flat functions of the same tensor
  ops, without module calls or distribution objects (``rlaccel_sb3.flat_actor_critic``).

One module per algorithm family — :mod:`.value_based` (DQN, QR-DQN), :mod:`.actor_critic` (SAC,
TD3, DDPG), :mod:`.on_policy` (PPO, A2C) — over :mod:`.batches` and :mod:`.common`; :mod:`.registry`
lists the algorithms, and :func:`trains`, the dispatch table, is derived from it. Equal to SB3's ``train()``, tested step by step (losses, gradients, parameters, optimizer state, RNG):
see ``tests/equivalence/test_sb3_fused.py`` for the tolerance and where the op order differs.
"""

from __future__ import annotations

from collections.abc import Callable

from rlaccel_sb3.fused.common import GraphsPerModel
from rlaccel_sb3.fused.registry import ALGORITHMS, COMPILED, SUPPORTED, FusedAlgorithm

__all__ = ["SUPPORTED", "break_even", "compiled_pays", "compiled_unavailable", "fused_train_for", "planned_gradient_steps", "trains"]


def fused_train_for(model, guard=None, cuda_graphs: bool = True,
                    fused_optimizer: bool = False, compiled: bool = False) -> Callable[..., None] | None:
    """The fused ``train`` of ``model``'s algorithm, with SB3's signature (``(gradient_steps, batch_size)``
    off-policy, ``()`` on-policy), or None where there is no equivalence-tested one (an algorithm
    subclass that overrides ``train`` has none).

    On a CUDA device DQN, QR-DQN, SAC, TD3 and DDPG steps run as captured CUDA graphs
    (:class:`~rlaccel_plugins.fused.graphs.StepGraphs`) unless ``cuda_graphs=False``; ``guard`` is the
    :class:`~rlaccel_plugins.updates.guard.GradientGuard` the caller attaches to the model's optimizers
    (checked on the device there). With ``fused_optimizer=True`` (``training.fused_optimizer``) the
    optimizers step with PyTorch's single-kernel ``fused=True`` implementation instead of the multi-tensor
    one: faster on the CPU, rounded differently (equal to SB3's within the tolerance
    ``tests/equivalence/test_sb3_fused.py`` states). With ``compiled=True`` (``training.compiled_updates``)
    a CPU model's gradient steps run as one compiled call each where its registry entry has a compiled step
    (:data:`~rlaccel_sb3.fused.registry.COMPILED`; :mod:`rlaccel_plugins.fused.compiled_step`): faster, equal within a derived tolerance. The returned function's ``release()`` drops the graphs and puts
    the optimizers' kernels back (the callback calls it when it removes the override).
    """
    entry = trains().get(type(model).train)
    if entry is None:
        return None
    graphs = GraphsPerModel(model, guard, cuda_graphs, entry.compiled if compiled else None)
    train = entry.build(model, graphs, fused_optimizer)
    train.__doc__ = f"rlaccel's fused {type(model).__name__}.train (same math, fewer ops)"
    train.release = graphs.release
    train.graphs = graphs
    return train


def compiled_unavailable(model) -> str | None:
    """Why ``model``'s gradient steps cannot run compiled (``training.compiled_updates``), or None."""
    entry = _entry_of(model)
    if entry is None:
        return f"{type(model).__name__} has no compiled step ({', '.join(COMPILED)} have)"
    step = entry.compiled(model, compile=False)
    return step if isinstance(step, str) else None


def compiled_pays(model, total_timesteps: int) -> bool:
    """Whether ``compiled_updates: auto`` compiles the ``learn()`` call of ``model`` up to ``total_timesteps``
    env steps: its algorithm has a compiled step and the call plans at least the algorithm's break-even of
    gradient steps (:data:`~rlaccel_sb3.fused.registry.ALGORITHMS`). Decided from the model and the call
    alone — never from a timing or from what the compiled-step cache holds — so a seeded run is the same
    run on any machine state. Whether the model can be compiled (its optimizer, its networks) is checked
    after: where it cannot, the eager fused step runs.

    Examples:
        >>> from stable_baselines3 import DQN
        >>> model = DQN("MlpPolicy", "CartPole-v1", train_freq=256, gradient_steps=128, learning_starts=1_000)
        >>> planned_gradient_steps(model, 50_000), compiled_pays(model, 50_000), compiled_pays(model, 5_000)
        (24448, True, False)
    """
    threshold, planned = break_even(model), planned_gradient_steps(model, total_timesteps)
    return threshold is not None and planned is not None and planned >= threshold


def break_even(model) -> int | None:
    """The gradient steps from which ``compiled_updates: auto`` compiles ``model``'s ``learn()`` calls, or None
    where its algorithm has no compiled step."""
    entry = _entry_of(model)
    return entry.break_even if entry is not None else None


def planned_gradient_steps(model, total_timesteps: int) -> int | None:
    """The gradient steps a ``learn()`` call up to ``total_timesteps`` env steps will take, as SB3's loop takes
    them. Off-policy: one round of ``gradient_steps`` (``-1``: as many as the round's env steps) per
    ``train_freq`` steps of every env after ``learning_starts``; None where ``train_freq`` counts episodes.
    On-policy: one ``train()`` per rollout of ``n_steps`` per env, each ``n_epochs`` passes over its
    minibatches (A2C: one step); ``target_kl`` may stop a pass early, so this is the most it takes.

    Examples:
        >>> from stable_baselines3 import PPO
        >>> planned_gradient_steps(PPO("MlpPolicy", "CartPole-v1", n_steps=512, batch_size=64), 100_000)
        15680
    """
    from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
    from stable_baselines3.common.type_aliases import TrainFrequencyUnit

    if isinstance(model, OnPolicyAlgorithm):
        rows = model.n_steps * model.n_envs
        rollouts = -(-max(0, total_timesteps - model.num_timesteps) // rows)  # SB3 collects while below the total
        batch_size = getattr(model, "batch_size", None) or rows
        return rollouts * getattr(model, "n_epochs", 1) * -(-rows // batch_size)
    train_freq = getattr(model, "train_freq", None)
    if train_freq is None or train_freq.unit != TrainFrequencyUnit.STEP:
        return None
    round_steps = train_freq.frequency * model.n_envs
    rounds = max(0, total_timesteps - max(model.num_timesteps, model.learning_starts)) // round_steps
    return rounds * (model.gradient_steps if model.gradient_steps >= 0 else round_steps)


def _entry_of(model):
    return next((a for a in ALGORITHMS if a.compiled and a.own_train() is type(model).train), None)


def trains() -> dict[Callable, FusedAlgorithm]:
    """The dispatch table: SB3's own ``train`` → its :data:`~rlaccel_sb3.fused.registry.ALGORITHMS` entry
    (``entry.build(model, graphs, fused_optimizer) -> train``), for every entry whose package is installed
    (an algorithm inheriting a ``train`` — SB3's DDPG — finds it by that)."""
    return {own: entry for entry in ALGORITHMS if (own := entry.own_train()) is not None}
