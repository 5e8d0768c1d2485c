"""One-ant-at-a-time tour construction (the sequential formulation, in NumPy): the oracle and
the baseline of the data-parallel :meth:`polytrain.aco.colony.Colony.construct`.

It consumes the same :class:`~polytrain.aco.colony.Draws` (ant k at step s uses ``u[s, k]`` and
``q[s, k]``) and the same choice rules, one ant and one city at a time, so both must return the
same tours. AS and MMAS build each ant's whole tour before the next ant starts; ACS moves the
ants step by step (its local pheromone update after each step makes the order matter, and the
ants of ACS move in lock-step in Dorigo & Gambardella 1997 as well).
"""

from __future__ import annotations

import numpy as np
import torch

from polytrain.aco.colony import Colony, Draws


def _pick(w: np.ndarray, u: float) -> int | None:
    c = np.cumsum(w)
    i = min(int(np.searchsorted(c, u * c[-1], side="right")), len(w) - 1)
    return i if w[i] > 0 else None


class Reference:
    """Sequential construction over a colony's current pheromone (which ACS updates locally)."""

    def __init__(self, colony: Colony) -> None:
        self.col = colony
        self.p = colony.p
        self.tau = colony.tau.cpu().numpy()  # shares memory with the colony on CPU
        self.etab = colony.etab.cpu().numpy()
        self.nn = None if colony.nn is None else colony.nn.cpu().numpy()
        self.attr = None if self.p.variant == "acs" else colony.attractiveness().cpu().numpy()

    def _row(self, c: int) -> np.ndarray:
        return self.attr[c] if self.attr is not None else self.tau[c] * self.etab[c]

    def _best(self, c: int, mask: np.ndarray) -> int:
        w = self._row(c) * mask
        return int(np.argmax(w)) if w.max() > 0 else int(np.argmax(mask))

    def choose(self, c: int, mask: np.ndarray, u: float, q: float | None) -> int:
        """The next city of one ant at city ``c`` with unvisited ``mask`` (1.0/0.0)."""
        if self.nn is not None:
            cand = self.nn[c]
            w = self._row(c)[cand] * mask[cand]
            i = _pick(w, u)
            if q is not None and q < self.p.q0:
                i = int(np.argmax(w)) if i is not None else None
            return int(cand[i]) if i is not None else self._best(c, mask)
        w = self._row(c) * mask
        j = _pick(w, u)
        if q is not None and q < self.p.q0 and j is not None:
            j = int(np.argmax(w))
        return j if j is not None else self._best(c, mask)

    def construct(self, draws: Draws) -> torch.Tensor:
        start, u, q = draws.start.numpy(), draws.u.numpy(), draws.q.numpy()
        ants, n = len(start), self.col.n
        tours = np.empty((ants, n), dtype=np.int64)
        masks = np.ones((ants, n))
        tours[:, 0] = start
        masks[np.arange(ants), start] = 0.0
        if self.p.variant == "acs":
            for s in range(n - 1):
                edges = []
                for k in range(ants):
                    c = int(tours[k, s])
                    j = self.choose(c, masks[k], float(u[s, k]), float(q[s, k]))
                    tours[k, s + 1], masks[k, j] = j, 0.0
                    edges.append((c, j))
                self._local_update(edges)
        else:
            for k in range(ants):
                for s in range(n - 1):
                    j = self.choose(int(tours[k, s]), masks[k], float(u[s, k]), None)
                    tours[k, s + 1], masks[k, j] = j, 0.0
        return torch.from_numpy(tours)

    def _local_update(self, edges: list[tuple[int, int]]) -> None:
        """ACS local update of one synchronous step, each edge once (as the vectorised form)."""
        xi, tau0 = self.p.xi, self.col.tau0
        new = {(a, b): (1.0 - xi) * self.tau[a, b] + xi * tau0 for a, b in edges}
        for (a, b), v in new.items():
            self.tau[a, b] = v
            self.tau[b, a] = v
