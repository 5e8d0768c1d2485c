"""The flat units ``zero`` shards (Rajbhandari et al., SC'20): which parameters go together.

A *unit* is a group of whole parameters flattened into one vector of Ψ_u elements, padded with
zeros to Ψ'_u = W·⌈Ψ_u/W⌉ so that it splits into W equal chunks of S_u = Ψ'_u/W; rank r owns
chunk r of every unit (its *shard*). Stages 1–2 make units of consecutive parameters up to
``bucket_mb`` (DDP's buckets); stage 3 makes one unit per layer (child module), merging layers that
share a parameter (tied weights), so that a layer's parameters can be gathered just before it runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class Unit:
    """One flat unit: its parameters (in order), their shapes, Ψ_u, and the modules whose forward
    uses it at stage 3 (empty at stages 1–2)."""

    index: int
    params: list[nn.Parameter]
    shapes: list[torch.Size]
    numel: int
    world: int
    modules: list[nn.Module] = field(default_factory=list)

    @property
    def padded(self) -> int:
        return self.world * math.ceil(self.numel / self.world)

    @property
    def shard_numel(self) -> int:
        return self.padded // self.world


def bucket_units(params: list[nn.Parameter], world: int, bucket_mb: float) -> list[Unit]:
    """Stages 1–2: consecutive parameters grouped into units of at most ``bucket_mb`` MiB (one
    parameter larger than that makes a unit of its own)."""
    cap = int(bucket_mb * 2**20)
    groups: list[list[nn.Parameter]] = []
    size = 0
    for p in params:
        nbytes = p.numel() * p.element_size()
        if not groups or size + nbytes > cap:
            groups.append([])
            size = 0
        groups[-1].append(p)
        size += nbytes
    return [_unit(i, g, world) for i, g in enumerate(groups)]


def _layers(model: nn.Module) -> tuple[nn.Module, list[nn.Module]]:
    """The module whose children are the layers (descending through single-child wrappers)."""
    root = model
    while len(list(root.children())) == 1 and not list(root.parameters(recurse=False)):
        root = next(root.children())
    return root, list(root.children())


def layers_of(model: nn.Module) -> list[nn.Module]:
    """The model's layers: the children of the first module that has more than one."""
    return _layers(model)[1]


def layer_units(model: nn.Module, world: int) -> list[Unit]:
    """Stage 3: one unit per layer; layers that share a parameter (and those between them) merge.
    Parameters the root itself owns form a unit gathered around the whole forward."""
    root, children = _layers(model)
    groups: list[tuple[list[nn.Module], list[nn.Parameter]]] = []
    owner: dict[int, int] = {}
    for child in children:
        ps = list(child.parameters())
        hits = {owner[id(p)] for p in ps if id(p) in owner}
        if not hits:
            groups.append(([], []))
        else:  # a tied parameter: this layer and every group since the first sharer become one
            first = min(hits)
            mods = [m for g in groups[first:] for m in g[0]]
            prm = [p for g in groups[first:] for p in g[1]]
            del groups[first:]
            groups.append((mods, prm))
        idx = len(groups) - 1
        groups[idx][0].append(child)
        for p in ps:
            if id(p) not in {id(q) for q in groups[idx][1]}:
                groups[idx][1].append(p)
        for p in groups[idx][1]:
            owner[id(p)] = idx
    own = list(root.parameters(recurse=False))
    if own:
        groups.insert(0, ([root], own))
    units = [_unit(i, prm, world) for i, (_, prm) in enumerate(g for g in groups if g[1])]
    for unit, (mods, _) in zip(units, [g for g in groups if g[1]], strict=True):
        unit.modules = mods
    return units


def _unit(index: int, params: list[nn.Parameter], world: int) -> Unit:
    return Unit(index, list(params), [p.shape for p in params], sum(p.numel() for p in params), world)
