"""torch's ``Categorical(logits=...)`` and ``Normal(loc, scale)`` as their own ops, without the
distribution objects' argument checks.

An on-policy update builds a ``Categorical`` per minibatch, and the frameworks' policies build one per
forward: the constructor checks its argument (a NaN test and an ``all()`` over the logits), and
``log_prob`` checks the actions against the support, a few ops and a host read each, more than the
arithmetic for RL-sized batches. :class:`FlatCategorical` computes what ``Categorical`` computes — the
normalised logits, ``probs`` (``softmax``, made on first use as torch's lazy property makes it, so the
autograd graph is built in the same order), the ``multinomial`` draw of ``sample()``, ``log_prob``'s
gather and ``entropy``'s clamped sum — with the same ops in the same order: the same values, random
draws and gradients (the adapters' PPO tests compare them bit for bit with the frameworks' own
updates). :func:`normal_rsample` and :func:`normal_log_prob` are ``Normal``'s reparameterised draw
(one ``normal_`` of the mean's shape) and log-density in its op order (the order autograd sums the
scale's gradients in). One difference: a NaN logit, mean or scale, or an out-of-range action, no longer
raises here; a NaN reaches the loss, where rlaccel's gradient guard sees it.

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

import math

import torch

LOG_SQRT_2PI = math.log(math.sqrt(2 * math.pi))


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


def normal_rsample(loc: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``Normal(loc, scale).rsample()`` for a ``scale`` of ``loc``'s shape: the same ``normal_`` draw.

    Examples:
        >>> loc, scale = torch.zeros(2, 3), torch.ones(2, 3)
        >>> _ = torch.manual_seed(0); ours = normal_rsample(loc, scale)
        >>> _ = torch.manual_seed(0); torch.equal(ours, torch.distributions.Normal(loc, scale).rsample())
        True
    """
    return loc + torch.empty(loc.shape, dtype=loc.dtype, device=loc.device).normal_() * scale


def normal_log_prob(value: torch.Tensor, loc: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``Normal(loc, scale).log_prob(value)``, elementwise, in its op order."""
    var = scale**2
    return -((value - loc) ** 2) / (2 * var) - scale.log() - LOG_SQRT_2PI
