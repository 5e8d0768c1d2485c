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
    """The module whose children hold the layers (descending through single-child wrappers), and
    the layers: its children, with every trunk among them opened (:func:`_is_trunk`)."""
    root = model
    while len(list(root.children())) == 1 and not list(root.parameters(recurse=False)):
        root = next(root.children())
    return root, _open(root)


def _open(m: nn.Module) -> list[nn.Module]:
    out: list[nn.Module] = []
    for child in m.children():
        out.extend(_open(child) if _is_trunk(child) else [child])
    return out


def _is_trunk(m: nn.Module) -> bool:
    """Whether ``m``'s children are layers rather than one layer's parts: a ModuleList or
    ModuleDict (never called itself: hooks on it would not fire), or a module with no parameters
    of its own that holds one (a transformer's trunk: embeddings, blocks, final norm; nanoGPT's
    ``transformer``, Hugging Face's ``GPT2Model``). The layers are then its blocks."""
    if isinstance(m, (nn.ModuleList, nn.ModuleDict)):
        return True
    return not list(m.parameters(recurse=False)) and any(
        isinstance(c, (nn.ModuleList, nn.ModuleDict)) for c in m.children())


def layers_of(model: nn.Module) -> list[nn.Module]:
    """The model's layers (:func:`_layers`) that share no parameter with another layer: FSDP2
    shards each parameter in one group, so a tied embedding and head stay with the root's."""
    layers = _layers(model)[1]
    seen: dict[int, int] = {}
    for layer in layers:
        for p in layer.parameters():
            seen[id(p)] = seen.get(id(p), 0) + 1
    return [m for m in layers if all(seen[id(p)] == 1 for p in m.parameters())]


def layer_units(model: nn.Module, world: int) -> list[Unit]:
    """Stage 3: one unit per layer; layers that share a parameter (a tied embedding and head) make
    one unit, at the first one's place: gathered before the first one's forward, kept until the
    last one's has run, reduced once backward has been through all of them. Parameters the root
    itself owns form a unit gathered around the whole forward."""
    root, children = _layers(model)
    groups: list[tuple[list[nn.Module], list[nn.Parameter]]] = []
    owner: dict[int, int] = {}
    for child in children:
        ps = list(child.parameters())
        hits = sorted({owner[id(p)] for p in ps if id(p) in owner})
        if not hits:
            groups.append(([], []))
            idx = len(groups) - 1
        else:  # tied: every group this layer shares with joins the first, and so does the layer
            idx = hits[0]
            for h in hits[1:]:
                groups[idx][0].extend(groups[h][0])
                groups[idx][1].extend(groups[h][1])
                groups[h] = ([], [])
        groups[idx][0].append(child)
        for p in ps:
            if id(p) not in {id(q) for q in groups[idx][1]}:
                groups[idx][1].append(p)
        for p in groups[idx][1]:
            owner[id(p)] = idx
    own = list(root.parameters(recurse=False))
    if own:
        groups.insert(0, ([root], own))
    kept = [g for g in groups if g[1]]
    units = [_unit(i, prm, world) for i, (_, prm) in enumerate(kept)]
    for unit, (mods, _) in zip(units, kept, strict=True):
        unit.modules = mods
    return units


def _unit(index: int, params: list[nn.Parameter], world: int) -> Unit:
    return Unit(index, list(params), [p.shape for p in params], sum(p.numel() for p in params), world)
