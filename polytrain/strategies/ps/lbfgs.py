"""Shard-wise L-BFGS: the two-loop recursion of ``torch.optim.LBFGS`` (fixed step, no line search,
``max_iter=1`` per call) run on one slice of the parameter vector.

Each server keeps its slice of x, g, the previous g, the direction d and the history pairs
(s_i, y_i); every scalar the recursion needs — dot products, |g|₁, max|g| — is a sum (or max)
over shards. :meth:`LbfgsShard.iterate` is a generator that *yields* its partial scalars and
is *sent* the combined ones, so the same code runs distributed (a server forwards each partial
to the coordinator and waits for the sum) or in one process (:func:`run_shards` combines the
partials of several shards itself — the tier-1 check against ``torch.optim.LBFGS``).

One iteration, with ⟨·,·⟩ the global dot product (a reduction round each; m = history length):

    stop if max|g| <= tolerance_grad                      (round: max)
    y = g − g_prev, s = t·d; keep (y, s) if ⟨y,s⟩ > 1e-10  (round: ⟨y,s⟩, ⟨y,y⟩)
    q = −g; for i = m−1..0: α_i = ρ_i⟨s_i,q⟩; q −= α_i y_i   (m rounds)
    d = r = H·q; for i = 0..m−1: β_i = ρ_i⟨y_i,r⟩; r += (α_i − β_i) s_i   (m rounds)
    t = lr (first iteration: min(1, 1/|g|₁)·lr)            (round: |g|₁, first only)
    x += t·d unless ⟨g,d⟩ > −tolerance_change               (round: ⟨g,d⟩)
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field

import torch

TOLERANCE_GRAD = 1e-7  # torch.optim.LBFGS defaults
TOLERANCE_CHANGE = 1e-9

# A partial is (op, values); op "sum" or "max". The driver sends back the combined values.
Partial = tuple[str, list[float]]
Rounds = Generator[Partial, list[float], bool]


@dataclass
class LbfgsShard:
    """One shard's L-BFGS state: x (n,) and the slices of its history."""

    x: torch.Tensor
    lr: float
    history: int
    n_iter: int = 0
    t: float = 0.0
    h_diag: float = 1.0
    d: torch.Tensor | None = None
    prev_g: torch.Tensor | None = None
    ys: list[torch.Tensor] = field(default_factory=list)  # y_i slices
    ss: list[torch.Tensor] = field(default_factory=list)  # s_i slices
    rho: list[float] = field(default_factory=list)

    def state(self) -> dict[str, object]:
        """Everything the next iterations depend on (a checkpoint of this shard)."""
        return {"x": self.x.clone(), "n_iter": self.n_iter, "t": self.t, "h_diag": self.h_diag,
                "d": self.d, "prev_g": self.prev_g, "ys": list(self.ys), "ss": list(self.ss),
                "rho": list(self.rho)}

    def load_state(self, state: dict[str, object]) -> None:
        self.x.copy_(state["x"])  # type: ignore[arg-type]
        self.n_iter, self.t = int(state["n_iter"]), float(state["t"])  # type: ignore[call-overload, arg-type]
        self.h_diag = float(state["h_diag"])  # type: ignore[arg-type]
        self.d, self.prev_g = state["d"], state["prev_g"]  # type: ignore[assignment]
        self.ys, self.ss = list(state["ys"]), list(state["ss"])  # type: ignore[call-overload]
        self.rho = [float(r) for r in state["rho"]]  # type: ignore[attr-defined]

    def iterate(self, g: torch.Tensor) -> Rounds:
        """One L-BFGS iteration on gradient slice g (n,); returns whether x moved."""
        (gmax,) = yield ("max", [float(g.abs().max()) if g.numel() else 0.0])
        if gmax <= TOLERANCE_GRAD:
            return False
        self.n_iter += 1
        if self.n_iter == 1:
            d = g.neg()
        else:
            yield from self._remember(g)
            d = yield from self._two_loop(g)
        self.d = d
        self.prev_g = g.clone()
        if self.n_iter == 1:
            (g1,) = yield ("sum", [float(g.abs().sum())])
            self.t = min(1.0, 1.0 / g1) * self.lr
        else:
            self.t = self.lr
        (gtd,) = yield ("sum", [float(g.dot(d))])
        if gtd > -TOLERANCE_CHANGE:
            return False
        self.x.add_(d, alpha=self.t)
        return True

    def _remember(self, g: torch.Tensor) -> Generator[Partial, list[float], None]:
        assert self.prev_g is not None and self.d is not None
        y = g - self.prev_g
        s = self.d * self.t
        ys, yy = yield ("sum", [float(y.dot(s)), float(y.dot(y))])
        if ys > 1e-10:
            if len(self.ys) == self.history:
                self.ys.pop(0)
                self.ss.pop(0)
                self.rho.pop(0)
            self.ys.append(y)
            self.ss.append(s)
            self.rho.append(1.0 / ys)
            self.h_diag = ys / yy

    def _two_loop(self, g: torch.Tensor) -> Generator[Partial, list[float], torch.Tensor]:
        m = len(self.ys)
        alpha = [0.0] * m
        q = g.neg()
        for i in range(m - 1, -1, -1):
            (sq,) = yield ("sum", [float(self.ss[i].dot(q))])
            alpha[i] = sq * self.rho[i]
            q.add_(self.ys[i], alpha=-alpha[i])
        r = q.mul(self.h_diag)
        for i in range(m):
            (yr,) = yield ("sum", [float(self.ys[i].dot(r))])
            r.add_(self.ss[i], alpha=alpha[i] - yr * self.rho[i])
        return r


def combine(partials: list[Partial]) -> list[float]:
    """Sum or max the partials of every shard, element-wise (they must agree on the op)."""
    ops = {op for op, _ in partials}
    if len(ops) != 1:
        raise RuntimeError(f"shards are out of step: ops {sorted(ops)} in one round")
    values = [v for _, v in partials]
    reduce = max if ops.pop() == "max" else sum
    return [float(reduce(col)) for col in zip(*values, strict=True)]


def run_shards(shards: list[LbfgsShard], grads: list[torch.Tensor]) -> tuple[bool, int]:
    """Drive one iteration of several shards in lockstep in this process: (moved, rounds)."""
    gens = [s.iterate(g) for s, g in zip(shards, grads, strict=True)]
    partials = [next(gen) for gen in gens]
    rounds = 1
    while True:
        total = combine(partials)
        results, partials = [], []
        for gen in gens:
            try:
                partials.append(gen.send(total))
            except StopIteration as stop:
                results.append(bool(stop.value))
        if results:
            if len(results) != len(gens):
                raise RuntimeError("shards finished in different rounds")
            return results[0], rounds
        rounds += 1
