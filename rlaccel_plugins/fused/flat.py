"""A stack of layers as one function of the same tensor ops, without the module calls.

Calling a ``torch.nn.Module`` costs a few µs of Python (hook checks, ``__call__`` dispatch) on top of its
arithmetic; a framework's network is often four modules deep around three ``Linear`` layers, so for
the small MLPs of RL the calls cost more than the math. :func:`flat_layers` gives the same ops
(``F.linear``, ``torch.relu``, ``torch.tanh`` on the same parameters: the same values and the same
autograd graph, so the same gradients) as a plain function — only where no forward or backward hook is
registered on any of the modules involved (a module's call is what runs them), and only for layers it knows.

Examples:
    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    >>> forward = flat_layers([net], net)
    >>> x = torch.randn(3, 4)
    >>> torch.equal(forward(x), net(x))
    True
    >>> handle = net.register_forward_hook(lambda *args: None)
    >>> flat_layers([net], net) is None  # a hook must run: the module's own call then
    True
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlaccel_plugins.fused.module_cache import global_call_hooks, has_call_hooks

LAYERS: dict[type, Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]] = {
    torch.nn.Linear: lambda m, x: torch.nn.functional.linear(x, m.weight, m.bias),  # type: ignore[arg-type]
    torch.nn.ReLU: lambda m, x: torch.relu(x),
    torch.nn.Tanh: lambda m, x: torch.tanh(x),
}


def flat_layers(modules: list[torch.nn.Module], *sequences: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """The layers of ``sequences`` (each a ``Sequential`` of Linear/ReLU/Tanh, or one such layer), in
    order, as one function; None where a layer is anything else or any of ``modules`` (the containers
    around them), the sequences or the layers has a hook its call would run (forward or backward), or a
    global one is set."""
    layers = _layers(modules, sequences)
    if layers is None:
        return None
    steps = [(LAYERS[type(m)], m) for m in layers]

    def forward(x: torch.Tensor) -> torch.Tensor:
        for function, module in steps:
            x = function(module, x)
        return x

    return forward


def layer_spec(modules: list[torch.nn.Module], *sequences: torch.nn.Module) -> tuple[tuple[str, ...], list[torch.Tensor]] | None:
    """What :func:`flat_layers` runs, as data: the layer kinds (``"linear"``, ``"relu"``, ``"tanh"``) and
    the Linear layers' weights and biases in order, for :func:`apply_layers` — a pure function of the
    tensors, which a compiled step can differentiate and share between networks of one shape. None
    where :func:`flat_layers` is, or a Linear layer has no bias.

    Examples:
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        >>> kinds, params = layer_spec([net], net)
        >>> kinds, len(params)
        (('linear', 'relu', 'linear'), 4)
        >>> x = torch.randn(3, 4)
        >>> torch.equal(apply_layers(kinds, params, x), net(x))
        True
    """
    layers = _layers(modules, sequences)
    if layers is None or any(type(m) is torch.nn.Linear and m.bias is None for m in layers):
        return None
    kinds = tuple(_KINDS[type(m)] for m in layers)
    params = [t for m in layers if type(m) is torch.nn.Linear for t in (m.weight, m.bias)]
    return kinds, params


def apply_layers(kinds: tuple[str, ...], params: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """The layers of a :func:`layer_spec` on ``x``: the same ops as the modules' own calls."""
    i = 0
    for kind in kinds:
        if kind == "linear":
            x = torch.nn.functional.linear(x, params[i], params[i + 1])
            i += 2
        elif kind == "relu":
            x = torch.relu(x)
        else:
            x = torch.tanh(x)
    return x


_KINDS = {torch.nn.Linear: "linear", torch.nn.ReLU: "relu", torch.nn.Tanh: "tanh"}


def _layers(modules: list[torch.nn.Module], sequences: tuple[torch.nn.Module, ...]) -> list[torch.nn.Module] | None:
    layers = []
    for sequence in sequences:
        if type(sequence) is torch.nn.Sequential:
            layers += list(sequence)
        elif type(sequence) in LAYERS:
            layers.append(sequence)
        else:
            return None
    if any(type(m) not in LAYERS for m in layers) or global_call_hooks() or any(
            has_call_hooks(m) for m in [*modules, *sequences, *layers]):
        return None
    return layers
