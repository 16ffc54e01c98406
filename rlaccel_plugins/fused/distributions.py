"""torch's ``Categorical(logits=...)`` as its own ops, without the distribution object's argument checks.

An on-policy update builds a ``Categorical`` per minibatch, and the frameworks' policies build one per
forward: the constructor checks its argument (a NaN test and an ``all()`` over the logits), and
``log_prob`` checks the actions against the support, a few ops and a host read each, more than the
arithmetic for RL-sized batches. :class:`FlatCategorical` computes what ``Categorical`` computes — the
normalised logits, ``probs`` (``softmax``, made on first use as torch's lazy property makes it, so the
autograd graph is built in the same order), the ``multinomial`` draw of ``sample()``, ``log_prob``'s
gather and ``entropy``'s clamped sum — with the same ops in the same order: the same values, random
draws and gradients (the adapters' PPO tests compare them bit for bit with the frameworks' own
updates). One difference: a NaN logit or an out-of-range action no longer raises here; a NaN reaches
the loss, where rlaccel's gradient guard sees it.

Examples:
    >>> import torch
    >>> logits = torch.randn(5, 3)
    >>> ours, theirs = FlatCategorical(logits), torch.distributions.Categorical(logits=logits)
    >>> actions = torch.tensor([0, 1, 2, 1, 0])
    >>> torch.equal(ours.log_prob(actions), theirs.log_prob(actions)), torch.equal(ours.entropy(), theirs.entropy())
    (True, True)
    >>> _ = torch.manual_seed(0); drawn = ours.sample()
    >>> _ = torch.manual_seed(0); torch.equal(drawn, theirs.sample())
    True
"""

from __future__ import annotations

import torch


class FlatCategorical:
    """``torch.distributions.Categorical(logits=logits)``: ``logits``, ``probs``, ``sample()``,
    ``log_prob(value)``, ``entropy()``, ``mode``."""

    __slots__ = ("_probs", "logits")

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits - logits.logsumexp(dim=-1, keepdim=True)  # Categorical normalises its logits
        self._probs: torch.Tensor | None = None

    @property
    def probs(self) -> torch.Tensor:
        if self._probs is None:  # torch's lazy_property: made on first use
            self._probs = torch.softmax(self.logits, dim=-1)
        return self._probs

    @property
    def mode(self) -> torch.Tensor:
        return self.probs.argmax(dim=-1)

    def sample(self) -> torch.Tensor:
        """``Categorical.sample()``: one ``torch.multinomial`` draw per row, the same random stream."""
        probs = self.probs
        drawn = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, True).T
        return drawn.reshape(probs.shape[:-1])

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        value, log_pmf = torch.broadcast_tensors(value.long().unsqueeze(-1), self.logits)
        return log_pmf.gather(-1, value[..., :1]).squeeze(-1)

    def entropy(self) -> torch.Tensor:
        logits = torch.clamp(self.logits, min=torch.finfo(self.logits.dtype).min)
        return -(logits * self.probs).sum(-1)
