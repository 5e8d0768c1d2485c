"""Lasso by coordinate descent, and STRADS's schedulers (pure torch, no processes).

Problem (scikit-learn's ``Lasso`` objective, no intercept)::

    F(β) = ||y − Xβ||² / (2n) + λ·||β||₁

with every column of X centred and scaled to xⱼᵀxⱼ = n, so one coordinate's exact minimiser is a
soft threshold of its correlation with the residual r = y − Xβ::

    βⱼ ← S(xⱼᵀr / n + βⱼ, λ),   S(z, λ) = sign(z)·max(|z| − λ, 0),   then r ← r − xⱼ·δⱼ

Schedulers pick the U coordinates updated together in one round (Lee et al. 2014, STRADS):

- ``priority``: sample candidates with probability ∝ δⱼ² + η (δⱼ: the coordinate's last change,
  so coordinates that moved recently are revisited; never-visited ones start high), then the
  dependency check keeps a candidate only if |xⱼᵀxₖ|/n < ρ for every coordinate already chosen —
  correlated coordinates updated from the same residual would overshoot together;
- ``random``: U coordinates uniformly (Shotgun-style, no dependency check);
- ``roundrobin``: the next U coordinates in cyclic order (no dependency check).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

UNVISITED = 1e6  # a never-updated coordinate's priority: visit every coordinate once first


@dataclass(frozen=True)
class LassoProblem:
    """Train and test data; columns standardised on the training rows (xⱼᵀxⱼ = n)."""

    x: torch.Tensor  # (n, p) float64
    y: torch.Tensor  # (n,)
    x_test: torch.Tensor
    y_test: torch.Tensor
    beta_true: torch.Tensor  # (p,)

    @property
    def n(self) -> int:
        return self.x.shape[0]

    @property
    def p(self) -> int:
        return self.x.shape[1]


def make_problem(n: int, p: int, informative: int, group: int, corr: float, noise: float,
                 seed: int) -> LassoProblem:
    """Sparse regression with correlated feature groups.

    Features come in groups of ``group`` sharing a factor (within-group correlation ≈ ``corr``);
    ``informative`` coefficients are nonzero (±1…2); 20% extra rows are held out for testing.
    """
    g = torch.Generator().manual_seed(seed)
    rows = n + max(1, n // 5)
    factors = torch.randn(rows, (p + group - 1) // group, generator=g, dtype=torch.float64)
    shared = factors.repeat_interleave(group, dim=1)[:, :p]
    x = corr**0.5 * shared + (1 - corr) ** 0.5 * torch.randn(rows, p, generator=g, dtype=torch.float64)
    beta = torch.zeros(p, dtype=torch.float64)
    support = torch.randperm(p, generator=g)[:informative]
    signs = torch.where(torch.rand(informative, generator=g) < 0.5, -1.0, 1.0).double()
    beta[support] = signs * (1 + torch.rand(informative, generator=g, dtype=torch.float64))
    y = x @ beta + noise * torch.randn(rows, generator=g, dtype=torch.float64)
    mean, y_mean = x[:n].mean(0), y[:n].mean()
    scale = ((x[:n] - mean).pow(2).sum(0) / n).sqrt()
    x = (x - mean) / scale
    y = y - y_mean
    return LassoProblem(x[:n].contiguous(), y[:n].contiguous(), x[n:].contiguous(), y[n:].contiguous(),
                        beta * scale)


def soft_threshold(z: torch.Tensor, lam: float) -> torch.Tensor:
    return torch.sign(z) * torch.clamp(z.abs() - lam, min=0.0)


def objective(problem: LassoProblem, beta: torch.Tensor, residual: torch.Tensor, lam: float) -> float:
    return float(residual.pow(2).sum() / (2 * problem.n) + lam * beta.abs().sum())


def coordinate_updates(problem: LassoProblem, beta: torch.Tensor, residual: torch.Tensor,
                       coords: torch.Tensor, lam: float) -> torch.Tensor:
    """New-minus-old values of ``coords``, each minimised from the same residual."""
    z = problem.x[:, coords].T @ residual / problem.n + beta[coords]
    return soft_threshold(z, lam) - beta[coords]


def commit(problem: LassoProblem, beta: torch.Tensor, residual: torch.Tensor, coords: torch.Tensor,
           deltas: torch.Tensor) -> None:
    """Apply updates in place: β[coords] += δ, r −= X[:, coords]·δ."""
    beta[coords] += deltas
    residual -= problem.x[:, coords] @ deltas


@dataclass
class Scheduler:
    """Chooses each round's coordinates (see the module docstring). State: last changes δ."""

    kind: str
    p: int
    count: int  # U: coordinates per round
    rho: float = 0.5
    eta: float = 1e-8
    candidates: int = 3  # priority: sample count·candidates, keep up to count independent ones
    seed: int = 0

    def __post_init__(self) -> None:
        self.gen = torch.Generator().manual_seed(self.seed)
        self.last_change = torch.full((self.p,), UNVISITED, dtype=torch.float64)
        self.cursor = 0
        self.gram: torch.Tensor | None = None  # |xⱼᵀxₖ|/n, (p, p), computed once when needed

    def observe(self, coords: torch.Tensor, deltas: torch.Tensor) -> None:
        self.last_change[coords] = deltas.abs()

    def next(self, x: torch.Tensor) -> torch.Tensor:
        u = min(self.count, self.p)
        if self.kind == "roundrobin":
            picks = (torch.arange(u) + self.cursor) % self.p
            self.cursor = (self.cursor + u) % self.p
            return picks
        if self.kind == "random":
            return torch.randperm(self.p, generator=self.gen)[:u]
        weights = self.last_change.pow(2) + self.eta
        k = min(self.p, u * self.candidates)
        cand = torch.multinomial(weights, k, replacement=False, generator=self.gen)
        if self.gram is None:
            self.gram = correlations(x)
        return independent(self.gram, cand, u, self.rho)


def correlations(x: torch.Tensor) -> torch.Tensor:
    """|xⱼᵀxₖ|/n for standardised columns: the feature correlations, (p, p)."""
    return (x.T @ x).abs() / x.shape[0]


def independent(gram: torch.Tensor, cand: torch.Tensor, u: int, rho: float) -> torch.Tensor:
    """STRADS's dependency check: greedily keep candidates (in order) whose |correlation| with
    every kept one is below ``rho``; at most ``u``. ``gram``: :func:`correlations`."""
    corr = gram[cand][:, cand].tolist()  # (k, k)
    kept: list[int] = []
    for i in range(len(corr)):
        if all(corr[i][j] < rho for j in kept):
            kept.append(i)
            if len(kept) == u:
                break
    return cand[kept]


def sweeps_to(problem: LassoProblem, scheduler: Scheduler, lam: float, target: float,
              max_sweeps: float = 200.0) -> float | None:
    """Sweeps (coordinate updates / p) until F(β) <= ``target``, running rounds in one process
    exactly as the workers do (every round's updates from the same residual); None if never."""
    beta = torch.zeros(problem.p, dtype=torch.float64)
    residual = problem.y.clone()
    updates = 0
    while updates < max_sweeps * problem.p:
        coords = scheduler.next(problem.x)
        deltas = coordinate_updates(problem, beta, residual, coords, lam)
        commit(problem, beta, residual, coords, deltas)
        scheduler.observe(coords, deltas)
        updates += coords.numel()
        if objective(problem, beta, residual, lam) <= target:
            return updates / problem.p
    return None
