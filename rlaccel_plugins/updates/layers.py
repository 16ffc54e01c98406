"""Layer discovery: param-owning modules ordered back from the output along the autograd graph.

Registration order is wrong for PPO (the value head is registered after the policy head but both
are "last") and execution order is wrong for twin critics, so "the last k layers" are found by
walking the autograd graph of one traced forward pass: depth 1 holds every layer whose output
reaches a network output without crossing another layer (one per output branch), depth 2 the
layers feeding those, and so on.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rlaccel_plugins.errors import ConfigError


@dataclass(frozen=True)
class LayerMap:
    """Layers of a module by depth from the output: ``depths[0]`` are the last layers (index -1).

    ``params[name]`` lists the parameter names (relative to the module) each layer owns.
    """

    depths: tuple[tuple[str, ...], ...]
    params: dict[str, tuple[str, ...]]
    unreached: tuple[str, ...]  # layers whose parameters do not influence the traced outputs

    def describe(self) -> str:
        return ", ".join(f"{-d - 1}: {'+'.join(names)}" for d, names in enumerate(self.depths))


def forward_outputs(module: nn.Module, example_input: Any,
                    forward_fn: Callable[[nn.Module], Any] | None = None) -> Any:
    """Run the traced forward: ``forward_fn(module)`` or ``module(*example_input)``."""
    if forward_fn is not None:
        return forward_fn(module)
    if isinstance(example_input, dict):
        return module(**example_input)
    if isinstance(example_input, (tuple, list)):
        return module(*example_input)
    return module(example_input)


def tensors_in(value: Any) -> list[torch.Tensor]:
    """Every tensor inside nested tuples/lists/dicts/NamedTuples/dataclass-like objects."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_in(v)]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors_in(v)]
    if hasattr(value, "__dict__") and not isinstance(value, nn.Module):
        return [t for v in vars(value).values() for t in tensors_in(v)]
    return []


@contextmanager
def side_effect_free(module: nn.Module):
    """Trace without touching training state: eval mode (no BN statistics), RNG restored, grads kept."""
    modes = {m: m.training for m in module.modules()}
    grads = {p: p.grad for p in module.parameters()}
    with torch.random.fork_rng(devices=[]), torch.enable_grad():
        module.eval()
        try:
            yield
        finally:
            for m, training in modes.items():
                m.training = training
            for p, grad in grads.items():
                p.grad = grad


def discover_layers(module: nn.Module, example_input: Any = None,
                    forward_fn: Callable[[nn.Module], Any] | None = None) -> LayerMap:
    """Trace one forward pass and order the module's layers back from its outputs.

    Examples:
        >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
        >>> discover_layers(net, torch.zeros(1, 4)).depths
        (('4',), ('2',), ('0',))
    """
    owners = {name: m for name, m in module.named_modules() if next(m.parameters(recurse=False), None) is not None}
    if not owners:
        raise ConfigError(f"module must have parameters, got module={type(module).__name__} with none. "
                          "Attach the updater to the network that the optimizer trains.")
    # a leaf layer owns parameters and has no param-owning children; a container's own parameters
    # (e.g. PPO's log_std) are "bare": each is a layer of its own, found as an autograd leaf
    leaves = {n: m for n, m in owners.items()
              if not any(c is not m and next(c.parameters(recurse=False), None) is not None for c in m.modules())}
    bare = {p: f"{n}.{pn}" if n else pn for n, m in owners.items() if n not in leaves
            for pn, p in m.named_parameters(recurse=False)}
    output_nodes: dict[Any, str] = {}
    input_nodes: dict[str, list[Any]] = {}

    def hook_for(name: str):
        def hook(_module, args, kwargs, output):
            for t in tensors_in(output):
                if t.grad_fn is not None:
                    output_nodes[t.grad_fn] = name
            input_nodes.setdefault(name, []).extend(
                t.grad_fn for t in tensors_in((args, kwargs)) if t.grad_fn is not None)
        return hook

    handles = [m.register_forward_hook(hook_for(n), with_kwargs=True) for n, m in leaves.items()]
    try:
        with side_effect_free(module):
            outputs = forward_outputs(module, example_input, forward_fn)
            roots = [t.grad_fn for t in tensors_in(outputs) if t.grad_fn is not None]
            depths = _walk_depths(roots, output_nodes, input_nodes, bare)
    finally:
        for h in handles:
            h.remove()
    if not depths:
        raise ConfigError(f"module must produce outputs that depend on its parameters, got module="
                          f"{type(module).__name__} whose traced outputs have no gradient path. "
                          "Pass example_input (or forward_fn) that runs the network's real forward pass.")
    by_depth: list[list[str]] = [[] for _ in range(max(depths.values()))]
    for name, d in depths.items():
        by_depth[d - 1].append(name)
    params = {n: tuple(f"{n}.{pn}" if n else pn for pn, _ in m.named_parameters(recurse=False)) for n, m in leaves.items()}
    params.update({name: (name,) for name in bare.values()})
    unreached = tuple(sorted(set(params) - set(depths)))
    return LayerMap(depths=tuple(tuple(sorted(names)) for names in by_depth), params=params, unreached=unreached)


def _walk_depths(roots, output_nodes, input_nodes, bare) -> dict[str, int]:
    depths: dict[str, int] = {}
    frontier, depth = list(roots), 1
    while frontier:
        found = _first_layers_upstream(frontier, output_nodes, bare)
        frontier = []
        for name in found:
            if name not in depths:
                depths[name] = depth
                frontier.extend(input_nodes.get(name, []))
        depth += 1
    return depths


def _first_layers_upstream(starts, output_nodes, bare) -> set[str]:
    """Layers reached first from ``starts`` walking toward the inputs (stopping at each layer)."""
    found, seen, stack = set(), set(), list(starts)
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if node in output_nodes:
            found.add(output_nodes[node])
            continue
        variable = getattr(node, "variable", None)  # AccumulateGrad: a parameter
        if variable is not None:
            if variable in bare:
                found.add(bare[variable])
            continue
        stack.extend(next_node for next_node, _ in node.next_functions)
    return found


def select_dense_params(module: nn.Module, layer_map: LayerMap, dense_layers: Sequence[int | str],
                        module_name: str = "module") -> set[str]:
    """Names of the parameters in the dense set: layers at the given depths, plus glob matches."""
    names = {n for n, _ in module.named_parameters()}
    selected: set[str] = set()
    for spec in dense_layers:
        if isinstance(spec, str):
            matches = {n for n in names if fnmatch.fnmatchcase(n, spec)}
            if not matches:
                raise ConfigError(f"dense_layers must match parameters of {module_name}, got dense_layers entry "
                                  f"{spec!r} matching none. Parameters: {sorted(names)}.")
            selected |= matches
        else:
            depth = -int(spec)
            if not 1 <= depth <= len(layer_map.depths):
                raise ConfigError(f"dense_layers must index layers that exist, got dense_layers entry {spec} but "
                                  f"{module_name} has {len(layer_map.depths)} layer depths from the output "
                                  f"({layer_map.describe()}). Use indices -1..-{len(layer_map.depths)}.")
            for layer in layer_map.depths[depth - 1]:
                selected |= set(layer_map.params[layer])
    return selected
