"""How a job's ranks are arranged, as validated, printable data (no processes, no torch).

One type for every strategy and RL algorithm (in the spirit of torchtitan's ``ParallelDims``):
a grid of model replicas ``dp × pp × tp`` plus the ranks around it — a coordinator, parameter
servers, a replay server, actors. Ranks are numbered block by block in ``order``; the default puts
the service ranks first, as the parameter-server strategies do::

    sandblaster  Layout(servers=2, coordinator=1)      0: coordinator | 1-2: servers | 3..: replicas
    distbelief   Layout(pp=2, servers=2)               0-1: servers (one per stage) | 2..: replicas
    mesh         Layout(dp=2, pp=2)                    0..3: replicas
    gorila       Layout(dp=2, servers=3, replay=1, actors=4, order=RL_ORDER)

Inside the grid, tp is fastest, then pp, then dp (``g`` = rank − first replica rank)::

    g = d·(pp·tp) + s·tp + t

so a tensor group is consecutive ranks (the tightest links on one host), a pipeline is a
stride-tp run, and data-parallel replicas of one position are pp·tp ranks apart. dp=2 × pp=2:

    rank   0  1  2  3
    d      0  0  1  1     data-parallel groups  {0, 2} {1, 3}  (same stage, all-reduce grads)
    s      0  1  0  1     pipelines             {0, 1} {2, 3}

``-1`` in one of dp, pp, tp means "the remaining ranks": ``Layout(dp=-1, pp=2).resolve(8)`` is
``dp=4 × pp=2 × tp=1``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from polytrain.errors import ConfigError

DIMS = ("dp", "pp", "tp")
BLOCKS = ("coordinator", "servers", "replicas", "replay", "actors")
TRAIN_ORDER = BLOCKS
RL_ORDER = ("replicas", "replay", "servers", "actors")  # the lead learner is rank 0


@dataclass(frozen=True)
class Layout:
    dp: int = -1
    pp: int = 1
    tp: int = 1
    servers: int = 0
    actors: int = 0
    coordinator: int = 0
    replay: int = 0
    order: tuple[str, ...] = TRAIN_ORDER

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
        counts = {b: getattr(self, b) for b in ("servers", "actors", "coordinator", "replay")}
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in counts.values()) \
                or self.coordinator > 1 or self.replay > 1:
            raise ConfigError(f"Layout {self}: servers and actors are counts >= 0, coordinator and "
                              "replay 0 or 1.")
        if sorted(self.order) != sorted(set(self.order)) or not set(self.order) <= set(BLOCKS) \
                or "replicas" not in self.order:
            raise ConfigError(f"Layout order {self.order}: each of {BLOCKS} at most once, "
                              "'replicas' included.")
        missing = [b for b in BLOCKS if b != "replicas" and counts[b] and b not in self.order]
        if missing:
            raise ConfigError(f"Layout {self}: order {self.order} has no place for {missing}.")

    def __str__(self) -> str:
        text = " × ".join(f"{d}={getattr(self, d)}" for d in DIMS)
        extra = [f"{b}={getattr(self, b)}" for b in ("coordinator", "servers", "replay", "actors")
                 if getattr(self, b)]
        return text + "".join(f" + {e}" for e in extra)

    # sizes ---------------------------------------------------------------------------------

    @property
    def replicas_size(self) -> int:
        """Ranks in the dp × pp × tp grid (of a resolved layout)."""
        return self.dp * self.pp * self.tp

    @property
    def service_size(self) -> int:
        """Ranks outside the grid."""
        return self.coordinator + self.servers + self.replay + self.actors

    @property
    def size(self) -> int:
        return self.replicas_size + self.service_size

    def resolve(self, world: int) -> Layout:
        """The layout with -1 filled in; refuses one that does not add up to ``world``."""
        grid = world - self.service_size
        known = math.prod(v for v in (self.dp, self.pp, self.tp) if v != -1)
        wild = next((d for d in DIMS if getattr(self, d) == -1), None)
        others = f" + {self.service_size} other ranks" if self.service_size else ""
        if wild is not None:
            if grid < known or grid % known:
                raise ConfigError(
                    f"Layout {self} on --procs {world}: the fixed dimensions use {known} ranks{others}, "
                    f"which does not divide {grid}, so {wild}=-1 has no whole value. Rule: "
                    f"dp·pp·tp{others} = world size. Fix: --procs "
                    f"{known * max(1, grid // known) + self.service_size}, or change the fixed dimensions."
                )
            dims: dict[str, int] = {d: getattr(self, d) for d in DIMS}
            dims[wild] = grid // known
            return replace(self, dp=dims["dp"], pp=dims["pp"], tp=dims["tp"])
        if known != grid:
            raise ConfigError(
                f"Layout {self} uses {self.dp}·{self.pp}·{self.tp} = {known} ranks{others} but the job "
                f"has --procs {world}. Rule: dp·pp·tp{others} must equal the world size (-1 means "
                f"'the remaining ranks'). Fix: --procs {known + self.service_size}, or --set dp=-1."
            )
        return self

    # who is where --------------------------------------------------------------------------

    def block(self, name: str) -> tuple[int, ...]:
        """The ranks of one block (``coordinator``, ``servers``, ``replicas``, ``replay``, ``actors``)."""
        if name not in BLOCKS:
            raise ValueError(f"no block {name!r}; blocks are {BLOCKS}")
        first = 0
        for b in self.order:
            n = self.replicas_size if b == "replicas" else getattr(self, b)
            if b == name:
                return tuple(range(first, first + n))
            first += n
        return ()

    @property
    def replica_ranks(self) -> tuple[int, ...]:
        return self.block("replicas")

    @property
    def server_ranks(self) -> tuple[int, ...]:
        return self.block("servers")

    @property
    def actor_ranks(self) -> tuple[int, ...]:
        return self.block("actors")

    @property
    def replay_rank(self) -> int | None:
        return next(iter(self.block("replay")), None)

    @property
    def coordinator_rank(self) -> int | None:
        return next(iter(self.block("coordinator")), None)

    @property
    def lead(self) -> int:
        """The first replica rank (stage 0 of replica 0; RL's lead learner)."""
        return self.replica_ranks[0]

    def role(self, rank: int) -> tuple[str, int]:
        """(block name, index within the block) of ``rank``."""
        for b in self.order:
            ranks = self.block(b)
            if rank in ranks:
                return b, ranks.index(rank)
        raise ValueError(f"rank {rank} is outside layout {self}")

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(d, s, t) of a replica ``rank`` in a resolved layout."""
        d, rest = divmod(rank - self.lead, self.pp * self.tp)
        s, t = divmod(rest, self.tp)
        return d, s, t

    def rank(self, d: int, s: int, t: int = 0) -> int:
        return self.lead + d * self.pp * self.tp + s * self.tp + t

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

    def stage_servers(self, s: int) -> list[int]:
        """Servers split evenly over the pp stages (DistBelief: each stage has its own)."""
        per, ranks = self.servers // self.pp, self.server_ranks
        return list(ranks[s * per : (s + 1) * per])

    def stage_clients(self, s: int) -> list[int]:
        """Stage ``s`` of every replica (tp = 1): the clients of that stage's servers."""
        return [self.rank(d, s) for d in range(self.dp)]

    def to_json(self) -> dict[str, int | str]:
        out: dict[str, int | str] = {f.name: getattr(self, f.name) for f in fields(self)
                                     if f.name != "order" and (f.name in DIMS or getattr(self, f.name))}
        return {**out, "text": str(self)}
