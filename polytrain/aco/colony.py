"""Data-parallel ant colonies (Cecilia et al. 2013, "Enhancing data parallelism for ant colony
optimization on GPUs"): all ants build their tours together, one tensor step per city.

At step s every ant's row of attractiveness ``tau^alpha * eta^beta`` (A x N, gathered at the
ants' current cities) is multiplied by the unvisited mask and ONE roulette draw is made for all
ants: a cumulative sum along the rows and one ``searchsorted`` of ``u * total`` (the tensor form
of the paper's parallel reduction). With nearest-neighbour candidate lists (``candidates > 0``)
the roulette runs over the C nearest cities only, and an ant whose candidates are all visited
takes the unvisited city of largest attractiveness (as Dorigo & Stützle's ACOTSP).

Variants (Dorigo & Stützle, *Ant Colony Optimization*, MIT Press 2004, ch. 3):
``as`` Ant System; ``acs`` Ant Colony System (pseudo-random proportional rule with ``q0``,
local update with ``xi`` after every synchronous step, global update on the best-so-far tour);
``mmas`` MAX-MIN Ant System (iteration-best deposit, best-so-far every ``bs_every`` iterations,
bounds tau_min/tau_max from ``p_best``, reinitialisation after ``restart_after`` iterations
without improvement).

The random numbers of an iteration are drawn up front (:class:`Draws`), so the vectorised
construction and the one-ant-at-a-time reference (:mod:`polytrain.aco.reference`) consume the
same numbers and must build the same tours; a share of the ants (``Draws.share``) consumes its
columns of the same numbers, which makes P processes equal one colony.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from polytrain.aco.tsp import Instance

VARIANTS = ("as", "acs", "mmas")
DEFAULT_RHO = {"as": 0.5, "acs": 0.1, "mmas": 0.02}


@dataclass(frozen=True)
class Params:
    """One colony's rules (validated by :mod:`polytrain.aco.config`)."""

    variant: str = "mmas"
    ants: int = 50
    alpha: float = 1.0
    beta: float = 2.0
    rho: float = 0.02
    q0: float = 0.9
    xi: float = 0.1
    candidates: int = 0
    p_best: float = 0.05
    bs_every: int = 5
    restart_after: int = 100


@dataclass
class Draws:
    """The random numbers of one construction: start city, roulette u and (acs) exploit q."""

    start: torch.Tensor  # (A,) long
    u: torch.Tensor  # (N-1, A) float64 in [0, 1)
    q: torch.Tensor  # (N-1, A) float64 in [0, 1) (unused unless acs)

    @staticmethod
    def draw(gen: torch.Generator, n: int, ants: int) -> Draws:
        start = torch.randint(n, (ants,), generator=gen)
        u = torch.rand(n - 1, ants, generator=gen, dtype=torch.float64)
        q = torch.rand(n - 1, ants, generator=gen, dtype=torch.float64)
        return Draws(start, u, q)

    def share(self, lo: int, hi: int) -> Draws:
        return Draws(self.start[lo:hi], self.u[:, lo:hi], self.q[:, lo:hi])

    def to(self, device: torch.device) -> Draws:
        return Draws(self.start.to(device), self.u.to(device), self.q.to(device))


def nearest_neighbours(dist: torch.Tensor, c: int) -> torch.Tensor:
    """(N, C) the C nearest other cities of each city, nearest first."""
    d = dist.clone()
    d.fill_diagonal_(math.inf)
    return d.topk(c, dim=1, largest=False).indices


def nn_tour_length(dist: torch.Tensor) -> float:
    """Length of the greedy nearest-neighbour tour from city 0 (scales the initial pheromone)."""
    n = int(dist.shape[0])
    seen = torch.zeros(n, dtype=torch.bool)
    cur, total = 0, 0.0
    seen[0] = True
    for _ in range(n - 1):
        row = dist[cur].masked_fill(seen, math.inf)
        nxt = int(row.argmin())
        total += float(row[nxt])
        seen[nxt] = True
        cur = nxt
    return total + float(dist[cur, 0])


def roulette(w: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise roulette over weights ``w`` (R x K): index of the first cumulative sum above
    ``u * total``, and whether the pick is valid (positive weight; false for all-zero rows)."""
    c = w.cumsum(1)
    thr = (u * c[:, -1]).unsqueeze(1)
    # c[idx-1] <= thr < c[idx] makes w[idx] > 0; idx == K (nothing above thr) means no pick
    idx = torch.searchsorted(c, thr, right=True).squeeze(1)
    ok = idx < w.shape[1]
    return idx.clamp_(max=w.shape[1] - 1), ok


class Colony:
    """Pheromone, heuristic and the best-so-far tour of one colony; builds and updates."""

    def __init__(self, inst: Instance, params: Params, device: torch.device | None = None) -> None:
        self.p = params
        self.device = device or torch.device("cpu")
        self.n = inst.n
        self.dist = inst.dist.to(self.device)
        d = self.dist.clone()
        d.fill_diagonal_(1.0)
        self.eta = (1.0 / d.clamp(min=1e-10)).fill_diagonal_(0.0)
        self.etab = self.eta.pow(params.beta)
        self.nn = nearest_neighbours(self.dist, params.candidates) if params.candidates else None
        self.l_nn = nn_tour_length(inst.dist)
        self.tau0 = self._tau0()
        self.tau = torch.full((self.n, self.n), self.tau0, dtype=torch.float64, device=self.device)
        self.best_len = math.inf
        self.best_tour: torch.Tensor | None = None
        self.iteration = 0
        self.since_improved = 0
        self.restarts = 0

    def _tau0(self) -> float:
        if self.p.variant == "as":
            return self.p.ants / self.l_nn
        if self.p.variant == "acs":
            return 1.0 / (self.n * self.l_nn)
        return 1.0 / (self.p.rho * self.l_nn)

    # ---- construction ---------------------------------------------------------------------
    def attractiveness(self) -> torch.Tensor:
        """tau^alpha * eta^beta (N x N), fixed during an AS/MMAS construction."""
        if self.p.alpha == 1.0:
            return self.tau * self.etab
        return self.tau.pow(self.p.alpha) * self.etab

    def _rows(self, attr: torch.Tensor | None, cur: torch.Tensor) -> torch.Tensor:
        return attr[cur] if attr is not None else self.tau[cur] * self.etab[cur]

    def construct(self, draws: Draws) -> torch.Tensor:
        """Tours (A x N, long) of the ants whose random numbers are ``draws``: N-1 tensor steps."""
        ants, n = draws.start.numel(), self.n
        acs = self.p.variant == "acs"
        if not acs and self.nn is None:
            return self._construct_dense(draws)
        attr = None if acs else self.attractiveness()
        unvisited = torch.ones(ants, n, dtype=torch.float64, device=self.device)
        cur = draws.start.to(self.device)
        steps = [cur]
        unvisited.scatter_(1, cur.unsqueeze(1), 0.0)
        for s in range(n - 1):
            nxt = self._choose(attr, cur, unvisited, draws.u[s], draws.q[s] if acs else None)
            steps.append(nxt)
            unvisited.scatter_(1, nxt.unsqueeze(1), 0.0)
            if acs:
                self.local_update(cur, nxt)
            cur = nxt
        return torch.stack(steps, 1)

    def _construct_dense(self, draws: Draws) -> torch.Tensor:
        """The AS/MMAS construction over all N cities with the per-step work cut to the minimum:
        no autograd bookkeeping (inference mode), buffers written with ``out=``, every per-step
        view made up front by one ``unbind``, and the roulette's pick written straight into the
        tour. A pick past the last city (an all-zero row, see :func:`roulette`) is caught where
        it is used: on CPU the bounds check of ``scatter_`` raises (no per-step read of the picks
        is needed), on an accelerator the picks' maximum is read each step."""
        ants, n = draws.start.numel(), self.n
        checked = self.device.type != "cpu"
        with torch.inference_mode():
            attr = self.attractiveness()
            unvisited = torch.ones(ants, n, dtype=torch.float64, device=self.device)
            w, c = torch.empty_like(unvisited), torch.empty_like(unvisited)
            thr = torch.empty(ants, 1, dtype=torch.float64, device=self.device)
            tours = torch.empty(n, ants, 1, dtype=torch.long, device=self.device)
            picks, rows = tours.unbind(0), tours.view(n, ants).unbind(0)
            us = draws.u.to(self.device).unsqueeze(2).unbind(0)
            total = c[:, n - 1:]
            rows[0].copy_(draws.start)
            unvisited.scatter_(1, picks[0], 0.0)
            for s in range(n - 1):
                torch.index_select(attr, 0, rows[s], out=w)
                w.mul_(unvisited)
                torch.cumsum(w, 1, out=c)
                torch.mul(us[s], total, out=thr)
                torch.searchsorted(c, thr, right=True, out=picks[s + 1])
                if checked and int(rows[s + 1].max()) >= n:
                    self._repick(attr, rows[s], rows[s + 1], unvisited)
                try:
                    unvisited.scatter_(1, picks[s + 1], 0.0)
                except (RuntimeError, IndexError):
                    self._repick(attr, rows[s], rows[s + 1], unvisited)
                    unvisited.scatter_(1, picks[s + 1], 0.0)
        return tours.view(n, ants).t().clone()

    def _repick(self, attr: torch.Tensor, cur: torch.Tensor, nxt: torch.Tensor,
                unvisited: torch.Tensor) -> None:
        """Ants whose roulette found no city (an all-zero row) take the best unvisited one."""
        bad = (nxt >= self.n).nonzero().squeeze(1)
        nxt[bad] = self._best_unvisited(attr, cur[bad], unvisited[bad])

    def _choose(self, attr: torch.Tensor | None, cur: torch.Tensor, unvisited: torch.Tensor,
                u: torch.Tensor, q: torch.Tensor | None) -> torch.Tensor:
        if self.nn is not None:
            cand = self.nn[cur]
            w = (attr[cur.unsqueeze(1), cand] if attr is not None
                 else self.tau[cur.unsqueeze(1), cand] * self.etab[cur.unsqueeze(1), cand])
            w = w * unvisited.gather(1, cand)
            idx, ok = roulette(w, u)
            if q is not None:
                idx = torch.where(q < self.p.q0, w.argmax(1), idx)
            nxt = cand.gather(1, idx.unsqueeze(1)).squeeze(1)
        else:
            w = (attr.index_select(0, cur) if attr is not None else self._rows(None, cur)) * unvisited
            nxt, ok = roulette(w, u)
            if q is not None:
                nxt = torch.where(q < self.p.q0, w.argmax(1), nxt)
        if not bool(ok.all()):
            bad = (~ok).nonzero().squeeze(1)
            nxt[bad] = self._best_unvisited(attr, cur[bad], unvisited[bad])
        return nxt

    def _best_unvisited(self, attr: torch.Tensor | None, cur: torch.Tensor,
                        unvisited: torch.Tensor) -> torch.Tensor:
        """The unvisited city of largest attractiveness (ties and underflow: first unvisited)."""
        w = self._rows(attr, cur) * unvisited
        return torch.where(w.amax(1) > 0, w.argmax(1), unvisited.argmax(1))

    def local_update(self, a: torch.Tensor, b: torch.Tensor) -> None:
        new = (1.0 - self.p.xi) * self.tau[a, b] + self.p.xi * self.tau0
        self.tau[a, b] = new
        self.tau[b, a] = new

    # ---- pheromone update -----------------------------------------------------------------
    def lengths(self, tours: torch.Tensor) -> torch.Tensor:
        return self.dist[tours, tours.roll(-1, 1)].sum(1)

    def _deposit(self, tours: torch.Tensor, amount: torch.Tensor) -> None:
        a, b = tours, tours.roll(-1, 1)
        idx = torch.cat([(a * self.n + b).reshape(-1), (b * self.n + a).reshape(-1)])
        val = amount.unsqueeze(1).expand_as(a).reshape(-1)
        self.tau.view(-1).index_add_(0, idx, torch.cat([val, val]))

    def update(self, tours: torch.Tensor, lengths: torch.Tensor) -> bool:
        """Evaporate and deposit after an iteration of ``tours``; True if the best improved."""
        self.iteration += 1
        k = int(lengths.argmin())
        improved = float(lengths[k]) < self.best_len
        if improved:
            self.best_len, self.best_tour = float(lengths[k]), tours[k].clone()
            self.since_improved = 0
        else:
            self.since_improved += 1
        assert self.best_tour is not None
        if self.p.variant == "as":
            self.tau.mul_(1.0 - self.p.rho)
            self._deposit(tours, 1.0 / lengths)
        elif self.p.variant == "acs":
            self._global_acs()
        else:
            self._mmas(tours[k], float(lengths[k]))
        return improved

    def _global_acs(self) -> None:
        assert self.best_tour is not None
        a, b = self.best_tour, self.best_tour.roll(-1)
        new = (1.0 - self.p.rho) * self.tau[a, b] + self.p.rho / self.best_len
        self.tau[a, b] = new
        self.tau[b, a] = new

    def bounds(self) -> tuple[float, float]:
        """MMAS tau_min, tau_max for the best-so-far length (Stützle & Hoos 2000, eq. 11)."""
        tmax = 1.0 / (self.p.rho * self.best_len)
        root = self.p.p_best ** (1.0 / self.n)
        tmin = tmax * (1.0 - root) / ((self.n / 2.0 - 1.0) * root)
        return min(tmin, tmax), tmax

    def _mmas(self, it_tour: torch.Tensor, it_len: float) -> None:
        assert self.best_tour is not None
        use_bs = self.p.bs_every > 0 and self.iteration % self.p.bs_every == 0
        tour, length = (self.best_tour, self.best_len) if use_bs else (it_tour, it_len)
        self.tau.mul_(1.0 - self.p.rho)
        self._deposit(tour.unsqueeze(0), torch.tensor([1.0 / length], dtype=torch.float64,
                                                       device=self.device))
        tmin, tmax = self.bounds()
        if self.p.restart_after > 0 and self.since_improved >= self.p.restart_after:
            self.tau.fill_(tmax)
            self.since_improved = 0
            self.restarts += 1
        self.tau.clamp_(tmin, tmax)

    def adopt_best(self, tour: torch.Tensor, length: float) -> None:
        """Take a best-so-far tour found elsewhere (another colony's)."""
        if length < self.best_len:
            self.best_len, self.best_tour = length, tour.to(self.device).clone()
