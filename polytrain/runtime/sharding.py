"""Sharding plans: which server owns which parameter elements. Plain data, printable, testable.

Both plans work on the model's *flat vector*: every parameter flattened and concatenated in
``model.named_parameters()`` order, element i of the vector at offset i. A server's shard is a
list of :class:`Piece` s (a range of one tensor) that the server stores concatenated, in model
order, as one flat tensor.

``layer`` (the common choice, 002 §2 "layer-based"): every *layer* — a top-level child of the
model's ``nn.Sequential``, i.e. its weight and bias together — goes whole to one server. Layers
are placed largest first on the least-loaded server (LPT greedy), so one huge layer (VGG-16's
fc1, ~74 % of the parameters) makes its server the bottleneck: nothing can split it.

``size`` (002 §2 "memory-based"): the flat vector is cut into S contiguous ranges of
⌊N/S⌋ or ⌈N/S⌉ elements, ignoring tensor boundaries, so servers hold equal parameter counts
(±1 element) whatever the model's shape.

    >>> plan = size_plan([ParamInfo("a.weight", (4, 3)), ParamInfo("a.bias", (4,))], servers=2)
    >>> print(plan)   # doctest: +NORMALIZE_WHITESPACE
    size plan: 16 parameters on 2 servers
    server  params  share  pieces
    0            8  50.0%  a.weight[0:8]
    1            8  50.0%  a.weight[8:12] a.bias[0:4]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from polytrain.errors import ConfigError

SHARDINGS = ("layer", "size")
Sharding = Literal["layer", "size"]


@dataclass(frozen=True)
class ParamInfo:
    """One parameter tensor: its name (``layer.sub.weight``) and shape."""

    name: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def layer(self) -> str:
        """The top-level child it belongs to (the unit the layer plan keeps whole)."""
        return self.name.split(".", 1)[0]


@dataclass(frozen=True)
class Piece:
    """Elements [start, stop) of parameter ``name`` (flattened), at ``flat_start`` in the vector."""

    name: str
    start: int
    stop: int
    flat_start: int

    @property
    def size(self) -> int:
        return self.stop - self.start

    def __str__(self) -> str:
        return f"{self.name}[{self.start}:{self.stop}]"


@dataclass(frozen=True)
class ShardPlan:
    """Per server, the pieces it owns; together they cover the flat vector exactly once."""

    kind: str
    params: tuple[ParamInfo, ...]
    shards: tuple[tuple[Piece, ...], ...]
    _ranges: tuple[tuple[tuple[int, int], ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_ranges", tuple(_merge(s) for s in self.shards))

    @property
    def servers(self) -> int:
        return len(self.shards)

    @property
    def total(self) -> int:
        return sum(p.numel for p in self.params)

    def sizes(self) -> list[int]:
        """Parameter elements per server."""
        return [sum(p.size for p in shard) for shard in self.shards]

    def ranges(self, server: int) -> tuple[tuple[int, int], ...]:
        """The server's elements as merged [start, stop) ranges of the flat vector, in order."""
        return self._ranges[server]

    def gather(self, flat: torch.Tensor, server: int) -> torch.Tensor:
        """The server's shard of a flat vector (N,) -> (sizes()[server],); a view when contiguous."""
        rs = self.ranges(server)
        if len(rs) == 1:
            return flat[rs[0][0] : rs[0][1]]
        return torch.cat([flat[a:b] for a, b in rs])

    def scatter(self, flat: torch.Tensor, server: int, shard: torch.Tensor) -> None:
        """Write the server's shard (sizes()[server],) back into the flat vector (N,)."""
        pos = 0
        for a, b in self.ranges(server):
            flat[a:b].copy_(shard[pos : pos + b - a])
            pos += b - a

    def check(self) -> None:
        """Every element owned exactly once (raises ValueError naming the gap or overlap)."""
        covered = sorted(r for s in range(self.servers) for r in self.ranges(s))
        pos = 0
        for a, b in covered:
            if a != pos:
                raise ValueError(f"{self.kind} plan: elements [{min(a, pos)}, {max(a, pos)}) are "
                                 f"{'unowned' if a > pos else 'owned twice'}")
            pos = b
        if pos != self.total:
            raise ValueError(f"{self.kind} plan covers {pos} of {self.total} elements")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "servers": self.servers, "sizes": self.sizes(),
                "pieces": [[str(p) for p in s] for s in self.shards]}

    def __str__(self) -> str:
        total = max(self.total, 1)
        lines = [f"{self.kind} plan: {self.total} parameters on {self.servers} servers",
                 "server  params  share  pieces"]
        for s, (shard, n) in enumerate(zip(self.shards, self.sizes(), strict=True)):
            names = " ".join(str(p) for p in shard) or "(empty)"
            lines.append(f"{s:<6}{n:>8}  {100 * n / total:4.1f}%  {names}")
        return "\n".join(lines)


def _merge(shard: tuple[Piece, ...]) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    for p in sorted(shard, key=lambda p: p.flat_start):
        a, b = p.flat_start, p.flat_start + p.size
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return tuple(out)


def _offsets(params: list[ParamInfo]) -> list[int]:
    offs, pos = [], 0
    for p in params:
        offs.append(pos)
        pos += p.numel
    return offs


def layer_plan(params: list[ParamInfo], servers: int) -> ShardPlan:
    """Whole layers to servers, largest first onto the least-loaded server (ties: lowest id)."""
    offs = _offsets(params)
    layers: dict[str, list[int]] = {}
    for i, p in enumerate(params):
        layers.setdefault(p.layer, []).append(i)
    load = [0] * servers
    owner: dict[str, int] = {}
    for name in sorted(layers, key=lambda n: -sum(params[i].numel for i in layers[n])):
        s = min(range(servers), key=lambda j: (load[j], j))
        owner[name] = s
        load[s] += sum(params[i].numel for i in layers[name])
    shards: list[list[Piece]] = [[] for _ in range(servers)]
    for i, p in enumerate(params):
        shards[owner[p.layer]].append(Piece(p.name, 0, p.numel, offs[i]))
    return ShardPlan("layer", tuple(params), tuple(tuple(s) for s in shards))


def size_plan(params: list[ParamInfo], servers: int) -> ShardPlan:
    """The flat vector cut into ``servers`` ranges of ⌊N/S⌋ or ⌈N/S⌉ elements."""
    offs = _offsets(params)
    total = sum(p.numel for p in params)
    bounds = [round(s * total / servers) for s in range(servers + 1)]
    shards: list[list[Piece]] = [[] for _ in range(servers)]
    first = 0  # the first parameter that may overlap server s's range (ranges ascend)
    for s in range(servers):
        lo, hi = bounds[s], bounds[s + 1]
        while first < len(params) and offs[first] + params[first].numel <= lo:
            first += 1
        for i in range(first, len(params)):
            off = offs[i]
            if off >= hi:
                break
            a, b = max(lo, off), min(hi, off + params[i].numel)
            if a < b:
                shards[s].append(Piece(params[i].name, a - off, b - off, a))
    return ShardPlan("size", tuple(params), tuple(tuple(s) for s in shards))


def make_plan(kind: str, params: list[ParamInfo], servers: int) -> ShardPlan:
    """The ``kind`` plan; refuses plans that would leave a server without parameters."""
    if kind not in SHARDINGS:
        raise ConfigError(f"Unknown sharding '{kind}'. Valid choices: {', '.join(SHARDINGS)}.")
    plan = layer_plan(params, servers) if kind == "layer" else size_plan(params, servers)
    empty = [s for s, n in enumerate(plan.sizes()) if n == 0]
    if empty:
        layers = len({p.layer for p in params})
        most, unit = (layers, "layers") if kind == "layer" else (plan.total, "parameters")
        raise ConfigError(
            f"sharding={kind} over servers={servers} leaves server(s) {empty} without parameters: "
            f"the model has only {most} {unit}. Use --set servers={most}"
            f"{' or --set sharding=size' if kind == 'layer' else ''}."
        )
    return plan


def param_infos(model: nn.Module) -> list[ParamInfo]:
    return [ParamInfo(n, tuple(p.shape)) for n, p in model.named_parameters()]
