"""``pipedream``: PipeDream (Harlap/Narayanan et al. 2018/2019; survey 000 §VI Fig. 10; seed 003).

Asynchronous 1F1B over a stream of mini-batches (each step's B samples is one mini-batch): the
input stage admits P mini-batches, then every stage alternates one backward and one forward, and
updates its weights after every backward — no flush. Weight stashing: each forward runs on the
version of the weights current when it started, and its backward differentiates that same version
(`weights.StashedWeights`). ``vertical_sync=true``: every stage runs mini-batch m on the version
the input stage used for m. Reported: staleness (updates between a mini-batch's forward and its
backward on a stage) per stage, and the stashed versions and their bytes.

    polytrain train --strategy pipedream --procs 4 --optimizer momentum --lr 0.02
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from polytrain.config import JobConfig
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.supports import Supports, refusing
from polytrain.strategies.base import Offer, Strategy
from polytrain.strategies.pipeline.options import AsyncOptions, check_pipeline
from polytrain.strategies.pipeline.shell import PipelineRun, RunPlan
from polytrain.strategies.pipeline.weights import ASYNC_WHY, StashedWeights

if TYPE_CHECKING:
    from polytrain.cost.scene import Estimate, Scene


def stream_offers(scene: Scene) -> Iterator[Offer]:
    """A stream pipeline on the cluster's ranks, the planner's cut pinned in its options."""
    from polytrain.cost.pipeline import planned_partition

    w = scene.cluster.world
    if 2 <= w <= scene.layers:
        yield w, {"partition": planned_partition(scene, "pipedream", w, 1)}


def price_stream(opts: AsyncOptions, scene: Scene, world: int) -> Estimate:
    """A stream pipeline (pipedream's schedule, one mini-batch per step) priced."""
    from polytrain.cost.pipeline import price_pipeline

    return price_pipeline(scene, "pipedream", world, 1, 1, opts.partition, opts.replicate, opts.link_gbps)


class PipeDream(Strategy):
    name = "pipedream"
    learning_evidence = ("pipeline_convergence",)  # accuracy beside gpipe and allreduce
    supports = Supports(lr_schedule=True, why=refusing(ASYNC_WHY))
    family = "pipeline"
    summary = "PipeDream: asynchronous 1F1B, update after every backward, weight stashing"
    Options = AsyncOptions

    def check(self, cfg: JobConfig, world: int) -> None:
        check_pipeline(self.options, cfg, world, self.name)  # type: ignore[arg-type]

    @classmethod
    def offers(cls, scene: Scene) -> Iterator[Offer]:
        return stream_offers(scene)

    def price(self, scene: Scene, world: int) -> Estimate | str:
        return price_stream(self.options, scene, world)  # type: ignore[arg-type]

    def run(self, job: Job, ctx: RankContext) -> RankResult:
        opts: AsyncOptions = self.options  # type: ignore[assignment]
        vertical = opts.vertical_sync
        plan = RunPlan(
            strategy=self.name,
            schedule="pipedream",
            per_step=1,
            stream=True,
            make_weights=lambda module, optimizer, stage: StashedWeights(module, optimizer, stage, vertical),
            trace_versions=opts.trace_versions,
            extra=(("vertical_sync", vertical), ("weight_stashing", True)),
        )
        return PipelineRun(job, ctx, opts, plan).run()
