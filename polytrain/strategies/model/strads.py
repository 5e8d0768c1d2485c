"""``strads``: scheduled model-parallel coordinate descent for the Lasso (Lee et al. 2014; 000 §IV).

This strategy does not train the job's neural network: it solves a Lasso problem it generates
itself from its options (``n`` samples, ``p`` features in correlated groups of ``group``,
``informative`` true nonzeros; :mod:`polytrain.strategies.model.lasso`), and ``--model`` and
``--dataset`` are not used. Every rank holds the data; each step is one round:

    schedule (rank 0)  pick U = workers·block coordinates (priority | random | roundrobin),
                       broadcast them                                       ("schedule" bytes)
    push (all)         worker w updates coordinates w, w+W, … of the round, each minimised from
                       the same residual r = y − Xβ
    pull (all)         all-gather the changes δ, every rank commits all of them:
                       β += δ, r −= X·δ                                     ("commit" bytes)

What summary.json reports: ``final_loss`` and each step's loss are the Lasso objective
F(β) = ||y − Xβ||²/(2n) + λ||β||₁; ``samples`` counts coordinate updates (so throughput is
updates per second); ``eval`` has the held-out mean squared error (``loss``) and R² (no
accuracy); model.pt holds ``beta`` (p,). ``strategy_metrics`` has the objective by sweep (a
sweep = p updates) and the sweeps taken to come within 1e-3 of the best objective reached.
"""

from __future__ import annotations

import time
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.loop import LoopSpec, run_loop
from polytrain.strategies.base import Strategy
from polytrain.strategies.model.lasso import (
    LassoProblem,
    Scheduler,
    commit,
    coordinate_updates,
    make_problem,
    objective,
)
from polytrain.strategies.model.shard_collectives import Wire

REPORTS = ("Lasso objective F(β) = ||y−Xβ||²/(2n) + λ||β||₁ on a generated sparse regression problem "
           "(options n, p, informative, group, corr, noise); loss = objective, samples = coordinate "
           "updates, eval.loss = held-out MSE, eval.r2; --model and --dataset are not used")


class StradsOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schedule: Literal["priority", "random", "roundrobin"] = "priority"
    lam: float = Field(0.2, gt=0, description="λ, the L1 weight (scikit-learn's alpha)")
    block: int = Field(4, ge=1, description="coordinates per worker per round")
    rho: float = Field(0.5, gt=0, le=1, description="dependency check: max |correlation| in a round")
    eta: float = Field(1e-8, gt=0, description="priority floor (every coordinate stays reachable)")
    n: int = Field(400, ge=2)
    p: int = Field(1000, ge=1)
    informative: int = Field(10, ge=1)
    group: int = Field(5, ge=1, description="features per correlated group")
    corr: float = Field(0.3, ge=0, lt=1, description="correlation within a group")
    noise: float = Field(0.5, ge=0)


def _round(problem: LassoProblem, beta: torch.Tensor, residual: torch.Tensor, coords: torch.Tensor,
           wire: Wire, lam: float) -> torch.Tensor:
    """Push and pull of one round; returns the changes of ``coords`` (in their order)."""
    w, size = wire.rank, wire.size
    mine = coords[w::size]
    deltas = coordinate_updates(problem, beta, residual, mine, lam)
    width = (coords.numel() + size - 1) // size
    padded = torch.zeros(width, dtype=torch.float64)
    padded[: mine.numel()] = deltas
    parts = wire.all_gather(padded, "commit")  # worker q's changes of coords[q::size]
    out = torch.zeros(coords.numel(), dtype=torch.float64)
    for q, part in enumerate(parts):
        out[q::size] = part[: coords[q::size].numel()]
    commit(problem, beta, residual, coords, out)
    return out


def _schedule(sched: Scheduler | None, problem: LassoProblem, wire: Wire, slots: int) -> torch.Tensor:
    """Rank 0 picks the round's coordinates; everyone receives them (padded with -1)."""
    buf = torch.full((slots,), -1, dtype=torch.int64)
    if sched is not None:
        picks = sched.next(problem.x)
        buf[: picks.numel()] = picks
    wire.comm.broadcast(buf, 0, op="schedule")
    return buf[buf >= 0]


class Strads(Strategy):
    name = "strads"
    family = "model"
    summary = "STRADS Lasso: scheduled parallel coordinate descent (its own data, not the model)"
    Options = StradsOptions

    def run(self, job: Job, ctx: RankContext) -> RankResult:
        o: StradsOptions = self.options  # type: ignore[assignment]
        solver = _Solver(o, job, ctx)
        spec = LoopSpec(model=solver.holder, optimizer=None, own_step=solver.step,
                        samples_at=solver.samples_at, state=solver.state,
                        load_state=solver.load_state, evaluate=solver.evaluate)
        result = run_loop(job, ctx, spec)
        result.samples = solver.updates - solver.first_updates
        result.strategy_metrics = _metrics(o, solver.trace, solver.beta, solver.problem)
        return result


class _Solver:
    """One rank's coordinate descent: β (p,), the residual r = y − Xβ (n,), rank 0's scheduler."""

    def __init__(self, o: StradsOptions, job: Job, ctx: RankContext) -> None:
        self.o, self.ctx = o, ctx
        self.problem = make_problem(o.n, o.p, o.informative, o.group, o.corr, o.noise, job.config.seed)
        self.wire = Wire(ctx.comm, ctx.recorder)
        self.slots = o.block * ctx.world
        self.sched = (Scheduler(o.schedule, o.p, self.slots, rho=o.rho, eta=o.eta, seed=job.config.seed)
                      if ctx.is_leader else None)
        self.holder = nn.Module()  # β (a buffer): the "model" the loop checkpoints and reports
        self.holder.register_buffer("beta", torch.zeros(o.p, dtype=torch.float64))
        self.residual = self.problem.y.clone()
        self.trace: list[tuple[float, float]] = [(0.0, self.objective())]
        self.updates = self.first_updates = 0
        self.per_step: dict[int, int] = {0: 0}

    @property
    def beta(self) -> torch.Tensor:
        return self.holder.get_buffer("beta")

    def objective(self) -> float:
        return objective(self.problem, self.beta, self.residual, self.o.lam)

    def step(self, step: int) -> float:
        t_step = time.perf_counter()
        coords = _schedule(self.sched, self.problem, self.wire, self.slots)
        with self.ctx.recorder.span("round", step=step):
            deltas = _round(self.problem, self.beta, self.residual, coords, self.wire, self.o.lam)
        if self.sched is not None:
            self.sched.observe(coords, deltas)
        self.ctx.straggle(time.perf_counter() - t_step)
        self.updates += coords.numel()
        self.per_step[step] = self.updates
        loss = self.objective()
        self.trace.append((self.updates / self.o.p, loss))
        return loss

    def samples_at(self, step: int) -> int:
        return self.per_step.get(step, self.updates)

    def evaluate(self) -> dict[str, float]:
        return _evaluate(self.problem, self.beta, self.trace[-1][1])

    def state(self) -> dict[str, torch.Tensor]:
        out = {"residual": self.residual.clone(), "updates": torch.tensor(self.updates),
               "trace": torch.tensor(self.trace, dtype=torch.float64)}
        if self.sched is not None:
            out.update(gen=self.sched.gen.get_state(), last_change=self.sched.last_change.clone(),
                       cursor=torch.tensor(self.sched.cursor))
        return out

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        """Every rank resumes from rank 0's state (β and r are the same on every rank)."""
        self.residual.copy_(state["residual"])
        self.updates = self.first_updates = int(state["updates"])
        self.trace = [(float(s), float(f)) for s, f in state["trace"].tolist()]
        if self.sched is not None:
            self.sched.gen.set_state(state["gen"])
            self.sched.last_change.copy_(state["last_change"])
            self.sched.cursor = int(state["cursor"])


def _evaluate(problem: LassoProblem, beta: torch.Tensor, final: float) -> dict[str, float]:
    err = problem.y_test - problem.x_test @ beta
    mse = float(err.pow(2).mean())
    var = float((problem.y_test - problem.y_test.mean()).pow(2).mean())
    return {"loss": mse, "r2": 1 - mse / var if var > 0 else 0.0, "objective": final}


def _metrics(o: StradsOptions, trace: list[tuple[float, float]], beta: torch.Tensor,
             problem: LassoProblem) -> dict[str, object]:
    best = min(f for _, f in trace)
    within = next((s for s, f in trace if f <= best * (1 + 1e-3)), None)
    stride = max(1, len(trace) // 200)
    return {
        "reports": REPORTS,
        "schedule": o.schedule,
        "objective": trace[-1][1],
        "sweeps": trace[-1][0],
        "sweeps_to_within_1e-3_of_best": within,
        "objective_by_sweep": [[round(s, 4), f] for s, f in trace[::stride]],
        "nonzeros": int((beta != 0).sum()),
        "true_nonzeros": int((problem.beta_true != 0).sum()),
        "support_recall": float(((beta != 0) & (problem.beta_true != 0)).sum() /
                                max(1, int((problem.beta_true != 0).sum()))),
    }
