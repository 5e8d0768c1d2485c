"""``hybrid-ps-ar`` plans, as plain data: which parameter takes which path, and which server owns
which row. No processes; everything here is testable alone.

Path rule (per parameter, in this order):

1. a parameter of an ``nn.Embedding`` / ``nn.EmbeddingBag`` goes to the parameter servers
   (reason ``embedding``): a lookup touches only the rows of the ids in the batch;
2. else, when its *measured row density* — the fraction of rows (slices along dim 0) with any
   non-zero gradient, on the first batch of worker 0 — is below ``sparse_threshold``, it goes
   to the servers too (reason ``row density``);
3. everything else (and every 0-d parameter) goes through all-reduce among the workers.

Row partition: row r of a server-held parameter belongs to server

* ``hash``:  ``(r · 2654435761 mod 2³²) mod S`` (Knuth's multiplicative hash): every server gets
  ~R/S rows *and* ~1/S of the frequent ones, whatever the id order;
* ``range``: the server whose block ``[⌊sR/S⌉, ⌊(s+1)R/S⌉)`` holds r: contiguous, but in a
  vocabulary sorted by frequency server 0 holds all the frequent ids and gets most of the traffic.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch
from torch import nn

PARTITIONS = ("hash", "range")
Partition = Literal["hash", "range"]
_KNUTH = 2_654_435_761


@dataclass(frozen=True)
class Assignment:
    """One parameter's path: ``ps`` (row-sparse push/pull) or ``allreduce``, and why."""

    name: str
    shape: tuple[int, ...]
    module: str  # the owning module's class, e.g. EmbeddingBag
    density: float | None  # measured row density (None: not measured)
    path: Literal["ps", "allreduce"]
    reason: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def row_density(grad: torch.Tensor | None) -> float:
    """Fraction of rows (dim 0) of ``grad`` with a non-zero entry; 0.0 for a missing gradient."""
    if grad is None or grad.dim() == 0 or grad.shape[0] == 0:
        return 0.0
    return float(grad.reshape(grad.shape[0], -1).ne(0).any(1).float().mean())


def touched_rows(grad: torch.Tensor) -> torch.Tensor:
    """(n,) int64 ids of the rows of ``grad`` (R, ...) with a non-zero entry, ascending."""
    return grad.reshape(grad.shape[0], -1).ne(0).any(1).nonzero().squeeze(1)


def _owners(model: nn.Module) -> dict[str, nn.Module]:
    out: dict[str, nn.Module] = {}
    for mod_name, mod in model.named_modules():
        for p_name, _ in mod.named_parameters(recurse=False):
            out.setdefault(f"{mod_name}.{p_name}" if mod_name else p_name, mod)
    return out


def assign_paths(model: nn.Module, density: dict[str, float], threshold: float) -> list[Assignment]:
    """The path of every parameter of ``model`` (in ``named_parameters`` order) by the rule above;
    ``density``: measured row density per parameter name."""
    owners = _owners(model)
    out = []
    for name, p in model.named_parameters():
        mod = owners[name]
        d = density.get(name)
        kind = type(mod).__name__
        if p.dim() == 0:
            path, reason = "allreduce", "a scalar has no rows"
        elif isinstance(mod, nn.Embedding | nn.EmbeddingBag):
            path, reason = "ps", f"embedding (nn.{kind})"
        elif d is not None and d < threshold:
            path, reason = "ps", f"row density {d:.1%} < sparse_threshold {threshold:.1%}"
        else:
            shown = "not measured" if d is None else f"{d:.1%}"
            path, reason = "allreduce", f"row density {shown} >= {threshold:.1%}"
        out.append(Assignment(name, tuple(p.shape), kind, d, path, reason))  # type: ignore[arg-type]
    return out


def paths_table(assignments: list[Assignment], most: int = 12) -> str:
    """The console table of the paths: a line per parameter, or, past ``most`` lines, every
    server-held one and a count of the rest (summary.json lists them all)."""
    rows = [("parameter", "shape", "path", "why")]
    shown = assignments if len(assignments) <= most else [a for a in assignments if a.path == "ps"]
    rows += [(a.name, "×".join(map(str, a.shape)) or "()", a.path, a.reason) for a in shown]
    if len(shown) < len(assignments):
        rows.append((f"({len(assignments) - len(shown)} more)", "", "allreduce",
                     "dense (each in summary.json: strategy_metrics.paths)"))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:3], widths, strict=True)) + "  " + r[3]
                     for r in rows)


@dataclass(frozen=True)
class RowPartition:
    """Rows [0, rows) of one parameter over ``servers`` servers, by ``kind``."""

    kind: str
    rows: int
    servers: int

    def __post_init__(self) -> None:
        if self.kind not in PARTITIONS:
            raise ValueError(f"unknown row partition '{self.kind}'; valid: {', '.join(PARTITIONS)}")
        if self.servers < 1:
            raise ValueError(f"a row partition needs at least one server (got {self.servers})")

    def bounds(self) -> list[int]:
        """range: server s owns [bounds[s], bounds[s+1])."""
        return [round(s * self.rows / self.servers) for s in range(self.servers + 1)]

    def owner(self, rows: torch.Tensor) -> torch.Tensor:
        """The server of each row id in ``rows`` (int64, any shape)."""
        if self.kind == "hash":
            return (rows * _KNUTH) % (1 << 32) % self.servers
        inner = torch.tensor(self.bounds()[1:-1], dtype=torch.int64)
        return torch.bucketize(rows, inner, right=True)

    def owned(self, server: int) -> torch.Tensor:
        """(n,) int64 ascending row ids that ``server`` owns."""
        if self.kind == "range":
            b = self.bounds()
            return torch.arange(b[server], b[server + 1], dtype=torch.int64)
        every = torch.arange(self.rows, dtype=torch.int64)
        return every[self.owner(every) == server]

    def sizes(self) -> list[int]:
        return torch.bincount(self.owner(torch.arange(self.rows)), minlength=self.servers).tolist()
