"""2-opt local search on a batch of tours: every round evaluates all neighbour-list moves of all
tours as tensors and applies, per tour, every improving move that beats the moves it overlaps.

A 2-opt move (lo, hi) replaces the edges (t[lo], t[lo+1]) and (t[hi], t[hi+1]) by
(t[lo], t[hi]) and (t[lo+1], t[hi+1]) and reverses t[lo+1..hi]. As in Bentley's fast 2-opt
(1992) and ACOTSP, the second edge starts at one of the K nearest neighbours of t[i] (K = 20),
so a round costs O(B·N·K) gains; each position keeps its best move. Moves whose position ranges
are disjoint do not interact (each changes only its own two edges and reverses only its own
segment), so every improving move that is better than all improving moves it overlaps
(ties: the lower position) is applied in the same round — an independent set, reversed with one
gather. Rounds repeat until no move improves: the result is 2-opt-optimal with respect to the
neighbour lists.
"""

from __future__ import annotations

import torch

NEIGHBOURS = 20
EPS = 1e-9


def neighbour_lists(dist: torch.Tensor, k: int = NEIGHBOURS) -> torch.Tensor:
    d = dist.clone()
    d.fill_diagonal_(float("inf"))
    return d.topk(min(k, d.shape[0] - 1), dim=1, largest=False).indices


def _best_moves(tours: torch.Tensor, dist: torch.Tensor, nbr: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per tour and position i: the best move's gain (negative improves), lo and hi."""
    b, n = tours.shape
    k = nbr.shape[1]
    ar = torch.arange(n, device=tours.device).expand(b, n)
    pos = torch.empty_like(tours).scatter_(1, tours, ar)
    nxt = tours.roll(-1, 1)
    c = nbr[tours]  # (B, N, K): candidate cities
    j = pos.gather(1, c.view(b, -1)).view(b, n, k)
    d = tours.gather(1, ((j + 1) % n).view(b, -1)).view(b, n, k)
    gain = (dist[tours.unsqueeze(2), c] + dist[nxt.unsqueeze(2), d]
            - dist[tours, nxt].unsqueeze(2) - dist[c, d])
    g, kk = gain.min(2)
    jj = j.gather(2, kk.unsqueeze(2)).squeeze(2)
    return g, torch.minimum(ar, jj), torch.maximum(ar, jj)


def _independent(g: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """Improving moves better than every improving move they overlap (B x N bool)."""
    n = g.shape[1]
    improving = g < -EPS
    overlap = (lo.unsqueeze(2) <= hi.unsqueeze(1)) & (lo.unsqueeze(1) <= hi.unsqueeze(2))
    idx = torch.arange(n, device=g.device)
    better = (g.unsqueeze(1) < g.unsqueeze(2)) | ((g.unsqueeze(1) == g.unsqueeze(2))
                                                  & (idx.view(1, n) < idx.view(n, 1)))
    beaten = (overlap & better & improving.unsqueeze(1)).any(2)  # [b, m, m']: m' beats m
    return improving & ~beaten


def _apply(tours: torch.Tensor, take: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> None:
    """Reverse t[lo+1..hi] of every taken (disjoint) move, in place."""
    b, n = tours.shape
    one = take.to(torch.long)
    cover = torch.zeros(b, n + 1, dtype=torch.long, device=tours.device)
    total = torch.zeros_like(cover)
    s = (lo + 1 + hi) * one
    cover.scatter_add_(1, lo + 1, one).scatter_add_(1, hi + 1, -one)
    total.scatter_add_(1, lo + 1, s).scatter_add_(1, hi + 1, -s)
    cover, total = cover.cumsum(1)[:, :n], total.cumsum(1)[:, :n]
    p = torch.arange(n, device=tours.device).expand(b, n)
    tours.copy_(tours.gather(1, torch.where(cover > 0, total - p, p)))


def two_opt(tours: torch.Tensor, dist: torch.Tensor, nbr: torch.Tensor | None = None,
            max_rounds: int = 100_000) -> torch.Tensor:
    """2-opt local optima of ``tours`` (B x N; a new tensor, the input is left as it is)."""
    out = tours.clone()
    n = out.shape[1]
    if n < 5:
        return out
    nbr = neighbour_lists(dist) if nbr is None else nbr
    active = torch.arange(out.shape[0], device=out.device)
    for _ in range(max_rounds):
        sub = out[active]
        g, lo, hi = _best_moves(sub, dist, nbr)
        take = _independent(g, lo, hi)
        changed = take.any(1)
        if not bool(changed.any()):
            break
        _apply(sub, take, lo, hi)
        out[active] = sub
        active = active[changed]
    return out
