"""``layerwise``: plain inter-layer model parallelism (000 §IV).

Consecutive layers on consecutive ranks (the pipeline family's `Partition` and `cut`); one
mini-batch at a time flows forward through every stage and back (the schedule ``F0 … B0`` with a
single micro-batch), so only one rank computes at any moment — the under-utilisation the survey
describes, measured here: each rank's utilisation is its time in compute spans over the wall
time of the training loop (ideal for equal stages: 1/P each).

Every rank sees the whole global batch: stage 0 its inputs, the last stage its targets. The last
stage broadcasts each step's loss (4 bytes) so every rank reports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, field_validator
from torch import nn

from polytrain.comm import Comm
from polytrain.config import JobConfig
from polytrain.errors import ConfigError
from polytrain.plan.partition import Partition, balanced, check_cuttable, cut, uniform
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.loop import LoopSpec, StepFn, run_loop
from polytrain.strategies.base import Strategy
from polytrain.strategies.model.stages import Pipelined, Stage, gather_stages, probe, split_rows
from polytrain.strategies.pipeline.schedule import stage_orders

PLANNERS = ("uniform", "params")


def check_partition_text(v: str) -> str:
    if v not in PLANNERS:
        Partition.parse(v)  # raises ConfigError naming the rule
    return v


class LayerwiseOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    partition: str = "uniform"

    @field_validator("partition", mode="before")
    @classmethod
    def _partition(cls, v: Any) -> str:
        return check_partition_text(str(v))


def plan(text: str, model: nn.Sequential, stages: int) -> Partition:
    """The partition named by ``text``: uniform layer counts, balanced parameter counts, or
    explicit counts ("2,3")."""
    layers = check_cuttable(model, stages)
    if text == "uniform":
        return uniform(layers, stages)
    if text == "params":
        return balanced([float(sum(p.numel() for p in c.parameters())) for c in model.children()],
                        stages)
    partition = Partition.parse(text)
    partition.check(layers, stages)
    return partition


@dataclass
class StagePlan:
    """This rank's stage and what is needed to put the full model back together."""

    stage: Stage
    partition: Partition
    keys_by_stage: list[list[str]]
    shapes: dict[str, torch.Size]
    dtypes: dict[str, torch.dtype]

    def gather(self) -> dict[str, torch.Tensor] | None:
        s = self.stage
        return gather_stages(s.comm, s.index, s.layers.state_dict(), self.keys_by_stage,
                             self.shapes, self.dtypes)


def build_stage(job: Job, ctx: RankContext, comm: Comm, text: str) -> StagePlan:
    """Cut the job's model over ``comm``'s ranks and keep stage ``comm.rank``."""
    full = job.build_model().to(ctx.device)
    state = full.state_dict()
    partition = plan(text, full, comm.world)
    specs = probe(list(full.children()), job.dataset.x_train[:1].to(ctx.device))
    pieces = cut(full, partition)
    a, b = partition.bounds[comm.rank]
    stage = Stage(layers=pieces[comm.rank], index=comm.rank, count=comm.world, comm=comm,
                  recorder=ctx.recorder, in_spec=specs[a - 1] if a > 0 else None,
                  out_spec=specs[b - 1], logits_spec=specs[-1], loss_fn=job.loss)
    keys = [list(p.state_dict()) for p in pieces]
    return StagePlan(stage, partition, keys, {k: v.shape for k, v in state.items()},
                     {k: v.dtype for k, v in state.items()})


def stage_step(plan_: StagePlan, optimizer: torch.optim.Optimizer, schedule: str,
               microbatches: int, after_backward: Any = None) -> StepFn:
    """One mini-batch through the pipeline, then this stage's update; returns the batch loss
    (broadcast from the last stage)."""
    stage = plan_.stage
    actions = stage_orders(schedule, stage.count, microbatches)[stage.index]

    def step(i: int, x: torch.Tensor, y: torch.Tensor) -> float:
        optimizer.zero_grad(set_to_none=True)
        xs, rows = split_rows(x, microbatches)
        ys, _ = split_rows(y, microbatches)
        loss = stage.run(actions, xs, ys, rows, i)
        if after_backward is not None:
            after_backward()
        with stage.recorder.span("optimizer", step=i):
            optimizer.step()
        t = torch.tensor([loss])
        stage.comm.broadcast(t, stage.count - 1, op="loss")
        return float(t)

    return step


def utilisation(ctx: RankContext, wall_s: float) -> list[float] | None:
    """Every rank's compute time / loop wall time, at the leader (control traffic)."""
    rows = ctx.comm.gather_json(ctx.recorder.busy_s() / wall_s if wall_s > 0 else 0.0)
    return None if rows is None else [round(float(u), 4) for u in rows]


class Layerwise(Strategy):
    name = "layerwise"
    family = "model"
    summary = "consecutive layers on consecutive ranks, one mini-batch at a time (1/P busy)"
    Options = LayerwiseOptions

    def check(self, cfg: JobConfig, world: int) -> None:
        opts: LayerwiseOptions = self.options  # type: ignore[assignment]
        if opts.partition not in PLANNERS:
            p = Partition.parse(opts.partition)
            if p.stages != world or p.ranks != world:
                raise ConfigError(
                    f"Strategy 'layerwise' puts one stage on each rank, but partition={p} has "
                    f"{p.stages} stages (replicas {list(p.replicas)}) for --procs {world}. "
                    f"Fix: --procs {p.stages}, or a partition of {world} counts without replicas."
                )

    def run(self, job: Job, ctx: RankContext) -> RankResult:
        opts: LayerwiseOptions = self.options  # type: ignore[assignment]
        sp = build_stage(job, ctx, ctx.comm, opts.partition)
        optimizer = job.make_optimizer(sp.stage.layers.parameters())
        spec = LoopSpec(model=sp.stage.layers, optimizer=optimizer,
                        step_fn=stage_step(sp, optimizer, "gpipe", 1), replicated=False,
                        eval_model=Pipelined(sp.stage))
        result = run_loop(job, ctx, spec)
        result.model_state = sp.gather()
        util = utilisation(ctx, result.wall_s)
        result.strategy_metrics.update({"partition": sp.partition.to_json(), "stages": ctx.world})
        if util is not None:
            result.strategy_metrics.update({
                "utilisation_per_rank": util,
                "mean_utilisation": sum(util) / len(util),
                "ideal_utilisation_equal_stages": 1 / ctx.world,
            })
        return result
