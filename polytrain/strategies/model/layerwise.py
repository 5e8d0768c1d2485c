"""``layerwise``: plain inter-layer model parallelism (000 §IV).

Consecutive layers on consecutive ranks (the pipeline family's `Partition` and `cut`); one
mini-batch at a time flows forward through every stage and back: a pipeline with one
micro-batch (the schedule ``F0 … B0``), run by the pipeline executor like every other pipeline
(`polytrain.strategies.pipeline.flush`). Only one rank computes at any moment — the
under-utilisation the survey describes, measured here: each rank's utilisation is its time in
compute spans over the wall time of the training loop (ideal for equal stages: 1/P each).

Every rank sees the whole global batch: stage 0 its inputs, the last stage its targets. The
step's loss travels back with the gradients, so every rank reports it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, field_validator

from polytrain.config import JobConfig
from polytrain.errors import ConfigError
from polytrain.models.partition import Partition, check_cuttable
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.loop import LoopSpec, run_loop
from polytrain.runtime.supports import Supports
from polytrain.strategies.base import Offer, Strategy
from polytrain.strategies.pipeline.flush import PLANNERS, FlushPipeline, Pipelined, plan
from polytrain.strategies.pipeline.options import meta_model

if TYPE_CHECKING:
    from polytrain.cost.scene import Estimate, Scene

__all__ = ["PLANNERS", "Layerwise", "check_partition_text", "plan", "utilisation"]

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


def utilisation(ctx: RankContext, wall_s: float) -> list[float] | None:
    """Every rank's compute time / loop wall time, at the leader (control traffic)."""
    rows = ctx.comm.gather_json(ctx.recorder.busy_s() / wall_s if wall_s > 0 else 0.0)
    return None if rows is None else [round(float(u), 4) for u in rows]


class Layerwise(Strategy):
    name = "layerwise"
    supports = Supports(lr_schedule=True, clip=True, grad_accum=True, precision=True)
    family = "model"
    exact = True
    summary = "consecutive layers on consecutive ranks, one mini-batch at a time (1/P busy)"
    Options = LayerwiseOptions

    @classmethod
    def offers(cls, scene: Scene) -> Iterator[Offer]:
        from polytrain.cost.pipeline import planned_partition

        w = scene.cluster.world
        if 2 <= w <= scene.layers:
            yield w, {"partition": planned_partition(scene, "gpipe", w, 1)}

    def price(self, scene: Scene, world: int) -> Estimate | str:
        from polytrain.cost.pipeline import price_pipeline

        return price_pipeline(scene, "gpipe", world, 1, 1, self.options.partition)  # type: ignore[attr-defined]

    def check(self, cfg: JobConfig, world: int) -> None:
        opts: LayerwiseOptions = self.options  # type: ignore[assignment]
        model = meta_model(cfg)  # one stage per rank: a model with fewer layers than ranks cannot run
        if model is not None:
            check_cuttable(model, world)
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
        pipe = FlushPipeline(job, ctx, list(range(ctx.world)), ctx.comm, opts.partition, "gpipe",
                             job.config.grad_accum,  # --grad-accum K: K micro-batches, one update
                             job.batch_size)
        assert pipe.optimizer is not None
        spec = LoopSpec(model=pipe.module, optimizer=pipe.optimizer, step_fn=pipe.train_step(),
                        replicated=False, eval_model=Pipelined(pipe))
        result = run_loop(job, ctx, spec)
        result.model_state = pipe.gather()
        util = utilisation(ctx, result.wall_s)
        result.strategy_metrics.update({"partition": pipe.partition.to_json(), "stages": ctx.world})
        if util is not None:
            result.strategy_metrics.update({
                "utilisation_per_rank": util,
                "mean_utilisation": sum(util) / len(util),
                "ideal_utilisation_equal_stages": 1 / ctx.world,
            })
        return result
