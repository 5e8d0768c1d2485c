"""The iteration loop of one rank: build (its share of) the tours, exchange, update, record.

With P processes and ``exchange == 1`` the ranks share ONE colony: each builds the tours of its
slice of the ants from its columns of the same random numbers, the tours are all-gathered, and
every rank applies the queen's update (evaporate, deposit) itself to its replica of the
pheromone; this moves A·N int32 per iteration instead of broadcasting the N x N pheromone, and
the run equals one process with the same ants, tour for tour. With ``exchange = k > 1`` every
rank runs its own colony (its share of the ants, its own random stream) and every k iterations
the pheromone matrices are averaged (all-reduce) and the best tour is shared (island model,
Michel & Middendorf 1998). Rank 0 records and decides when to stop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from polytrain.aco.colony import Colony, Draws
from polytrain.aco.config import ACOConfig
from polytrain.aco.local_search import neighbour_lists, two_opt
from polytrain.aco.tsp import Instance
from polytrain.comm import Comm

Record = Callable[[dict[str, Any]], None]
SEED_STRIDE = 1_000_003  # island colonies: seed + rank * stride


@dataclass
class RankOutcome:
    best_length: float
    best_tour: list[int]
    iterations: int
    wall_s: float
    tours: int  # tours this rank built
    exchanges: int
    restarts: int
    comm: dict[str, Any] = field(default_factory=dict)


def ant_slice(ants: int, world: int, rank: int) -> tuple[int, int]:
    """Rank ``rank``'s contiguous share of ``ants`` (the first ``ants % world`` get one more)."""
    base, extra = divmod(ants, world)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def _gather_tours(comm: Comm, tours: torch.Tensor, ants: int, world: int) -> torch.Tensor:
    """All ranks' tours in ant order (shares may differ by one ant: padded with -1 rows)."""
    n = tours.shape[1]
    width = -(-ants // world)
    buf = torch.full((width, n), -1, dtype=torch.int32)
    buf[: tours.shape[0]] = tours.to(torch.int32).cpu()
    outs = [torch.empty_like(buf) for _ in range(world)]
    comm.all_gather(outs, buf, op="tours")
    slices = [ant_slice(ants, world, r) for r in range(world)]
    rows = [o[: hi - lo] for o, (lo, hi) in zip(outs, slices, strict=True)]
    return torch.cat(rows).to(torch.long).to(tours.device)


def _exchange(colony: Colony, comm: Comm) -> None:
    """Islands: average the pheromone, then every colony adopts the best tour of all."""
    tau = colony.tau.cpu()
    comm.all_reduce(tau, op="pheromone")
    colony.tau.copy_(tau / comm.world)
    mine = torch.tensor([colony.best_len], dtype=torch.float64)
    lens = [torch.empty(1, dtype=torch.float64) for _ in range(comm.world)]
    comm.all_gather(lens, mine, op="best_length")
    winner = int(torch.cat(lens).argmin())
    assert colony.best_tour is not None
    tour = colony.best_tour.to(torch.int32).cpu()
    comm.broadcast(tour, winner, op="best_tour")
    colony.adopt_best(tour.to(torch.long), float(lens[winner]))
    if colony.p.variant == "mmas":
        colony.tau.clamp_(*colony.bounds())


def _stop_flag(comm: Comm | None, stop: bool, agreed: bool = False) -> bool:
    """Rank 0's decision, for every rank (bookkeeping: counted as control bytes). ``agreed``: every
    rank reaches the same decision from what it holds (see `Runner.agreed`), so nothing is sent."""
    if comm is None or comm.world == 1 or agreed:
        return stop
    flag = torch.tensor([1 if stop else 0], dtype=torch.int32)
    dist.broadcast(flag, 0)
    comm.control_bytes += 4 * (comm.world - 1) if comm.rank == 0 else 0
    return bool(flag.item())


class Runner:
    """One rank's colony (or share of one) and its loop."""

    def __init__(self, cfg: ACOConfig, inst: Instance, comm: Comm | None, device: torch.device) -> None:
        self.cfg, self.inst, self.comm = cfg, inst, comm
        torch.set_num_threads(cfg.threads)
        self.rank, self.world = (comm.rank, comm.world) if comm is not None else (0, 1)
        self.islands = cfg.exchange > 1 and self.world > 1
        params = cfg.params()
        assert params.ants >= self.world
        self.lo, self.hi = ant_slice(params.ants, self.world, self.rank)
        if self.islands:
            from dataclasses import replace

            params = replace(params, ants=self.hi - self.lo)
        self.colony = Colony(inst, params, device)
        self.nbr = neighbour_lists(self.colony.dist)
        seed = cfg.seed + (SEED_STRIDE * self.rank if self.islands else 0)
        self.gen = torch.Generator().manual_seed(seed)
        self.optimum = cfg.optimum if cfg.optimum is not None else inst.optimum
        # Without a time limit every rank decides alike when to stop (the iteration count; the
        # gap of the best-so-far, which the replicas of one shared colony hold identically), so
        # the per-iteration broadcast of rank 0's decision, a second synchronisation of the ranks
        # after the tours' all-gather, is left out (benchmarks/aco_phases.py: "record+stop").
        self.agreed = cfg.time_limit is None and (cfg.target_gap is None or not self.islands)

    def _build(self) -> tuple[torch.Tensor, torch.Tensor]:
        col = self.colony
        draws = Draws.draw(self.gen, col.n, col.p.ants)
        if not self.islands and self.world > 1:
            draws = draws.share(self.lo, self.hi)
        shared = not self.islands and self.world > 1
        before = col.tau.clone() if shared and col.p.variant == "acs" else None
        built = col.construct(draws.to(col.device))
        tours = two_opt(built, col.dist, self.nbr) if self.cfg.local_search == "2opt" else built
        if shared:
            assert self.comm is not None
            tours = _gather_tours(self.comm, tours, col.p.ants, self.world)
            if before is not None:  # replay every ant's ACS local updates: identical replicas
                everyone = _gather_tours(self.comm, built, col.p.ants, self.world)
                col.tau.copy_(before)
                for s in range(col.n - 1):
                    col.local_update(everyone[:, s], everyone[:, s + 1])
        return tours, col.lengths(tours)

    def gap(self, length: float) -> float | None:
        return None if self.optimum is None else length / self.optimum - 1.0

    def run(self, record: Record) -> RankOutcome:
        cfg, col = self.cfg, self.colony
        start = time.perf_counter()
        it = tours_built = exchanges = 0
        while True:
            tours, lengths = self._build()
            col.update(tours, lengths)
            it += 1
            tours_built += self.hi - self.lo
            if self.islands and it % cfg.exchange == 0:
                assert self.comm is not None
                _exchange(col, self.comm)
                exchanges += 1
            elapsed = time.perf_counter() - start
            gap = self.gap(col.best_len)
            record({"iteration": it, "t": elapsed, "best": col.best_len,
                    "iter_best": float(lengths.min()), "mean": float(lengths.mean()), "gap": gap,
                    "restarts": col.restarts, "tours": tours_built * self.world,
                    "bytes_sent": self.comm.bytes_sent if self.comm is not None else 0})
            done = (it >= cfg.max_iterations
                    or (cfg.time_limit is not None and elapsed >= cfg.time_limit)
                    or (cfg.target_gap is not None and gap is not None and gap <= cfg.target_gap + 1e-12))
            if _stop_flag(self.comm, done, self.agreed):
                break
        if self.islands and it % cfg.exchange:
            assert self.comm is not None
            _exchange(col, self.comm)  # a last exchange, so every colony reports the best of all
            exchanges += 1
        assert col.best_tour is not None
        return RankOutcome(col.best_len, col.best_tour.tolist(), it, time.perf_counter() - start,
                           tours_built, exchanges, col.restarts,
                           self.comm.summary() if self.comm is not None else {})
