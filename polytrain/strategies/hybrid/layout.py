"""Process-mesh layouts ``dp × pp × tp`` as validated, printable data (no processes, no torch).

``-1`` in one dimension means "the remaining ranks": ``Layout(dp=-1, pp=2).resolve(8)`` is
``dp=4 × pp=2 × tp=1``. Ranks are numbered with tp fastest, then pp, then dp::

    rank = d·(pp·tp) + s·tp + t

so a tensor group is consecutive ranks (the tightest links on one host), a pipeline is a
stride-tp run, and data-parallel replicas of one position are pp·tp ranks apart. dp=2 × pp=2:

    rank   0  1  2  3
    d      0  0  1  1     data-parallel groups  {0, 2} {1, 3}  (same stage, all-reduce grads)
    s      0  1  0  1     pipelines             {0, 1} {2, 3}
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from polytrain.errors import ConfigError

DIMS = ("dp", "pp", "tp")


@dataclass(frozen=True)
class Layout:
    dp: int = -1
    pp: int = 1
    tp: int = 1

    def __post_init__(self) -> None:
        values = {d: getattr(self, d) for d in DIMS}
        bad = {d: v for d, v in values.items() if isinstance(v, bool) or not isinstance(v, int)
               or (v < 1 and v != -1)}
        if bad:
            raise ConfigError(
                f"Layout {self}: {', '.join(f'{d}={v!r}' for d, v in bad.items())}. Rule: each of "
                "dp, pp, tp is a whole number >= 1, or -1 for 'the remaining ranks'. "
                "Fix: e.g. --set dp=2 --set pp=2."
            )
        wild = [d for d, v in values.items() if v == -1]
        if len(wild) > 1:
            raise ConfigError(
                f"Layout {self} leaves {' and '.join(wild)} both at -1. Rule: at most one "
                f"dimension may be -1 ('the remaining ranks'). Fix: give {wild[1]} a number, "
                f"e.g. --set {wild[1]}=1."
            )

    def __str__(self) -> str:
        return " × ".join(f"{d}={getattr(self, d)}" for d in DIMS)

    @property
    def size(self) -> int:
        return self.dp * self.pp * self.tp

    def resolve(self, world: int) -> Layout:
        """The layout with -1 filled in; refuses one that does not multiply to ``world``."""
        known = math.prod(v for v in (self.dp, self.pp, self.tp) if v != -1)
        wild = next((d for d in DIMS if getattr(self, d) == -1), None)
        if wild is not None:
            if world % known:
                raise ConfigError(
                    f"Layout {self} on --procs {world}: the fixed dimensions use {known} ranks, "
                    f"which does not divide {world}, so {wild}=-1 has no whole value. Rule: "
                    f"dp·pp·tp = world size. Fix: --procs {known * max(1, world // known)}, or "
                    "change the fixed dimensions."
                )
            return Layout(**{**{d: getattr(self, d) for d in DIMS}, wild: world // known})
        if known != world:
            raise ConfigError(
                f"Layout {self} uses {self.dp}·{self.pp}·{self.tp} = {known} ranks but the job "
                f"has --procs {world}. Rule: dp·pp·tp must equal the world size (-1 means 'the "
                f"remaining ranks'). Fix: --procs {known}, or --set dp=-1."
            )
        return self

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(d, s, t) of ``rank`` in a resolved layout."""
        d, rest = divmod(rank, self.pp * self.tp)
        s, t = divmod(rest, self.tp)
        return d, s, t

    def rank(self, d: int, s: int, t: int) -> int:
        return d * self.pp * self.tp + s * self.tp + t

    def dp_groups(self) -> list[list[int]]:
        """Ranks holding the same (stage, shard) in every replica: they all-reduce gradients."""
        return [[self.rank(d, s, t) for d in range(self.dp)]
                for s in range(self.pp) for t in range(self.tp)]

    def pp_groups(self) -> list[list[int]]:
        """The stages of one pipeline, in stage order."""
        return [[self.rank(d, s, t) for s in range(self.pp)]
                for d in range(self.dp) for t in range(self.tp)]

    def tp_groups(self) -> list[list[int]]:
        """The shards of one tensor-parallel group."""
        return [[self.rank(d, s, t) for t in range(self.tp)]
                for d in range(self.dp) for s in range(self.pp)]

    def to_json(self) -> dict[str, int | str]:
        return {"dp": self.dp, "pp": self.pp, "tp": self.tp, "text": str(self)}
