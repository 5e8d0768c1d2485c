"""``spectrain``: SpecTrain (Chen et al. 2018; survey 000 §VI, Fig. 11) — weight prediction.

The same asynchronous 1F1B stream as ``pipedream``, but instead of stashing the past each forward
runs on the weights the mini-batch is predicted to meet at its update, Ŵ = W − s·η·v: v is the SGD
momentum buffer (the last gradient without momentum), η the learning rate, s the number of updates
the stage makes between this forward and its backward; the backward uses the same Ŵ
(`weights.PredictedWeights`). Needs an SGD optimizer (``--optimizer sgd|momentum``).

    polytrain train --strategy spectrain --procs 4 --optimizer momentum --lr 0.02
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from polytrain.config import JobConfig
from polytrain.errors import ConfigError
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.supports import Supports, refusing
from polytrain.strategies.base import Offer, Strategy
from polytrain.strategies.pipeline.options import AsyncOptions, check_pipeline
from polytrain.strategies.pipeline.pipedream import price_stream, stream_offers
from polytrain.strategies.pipeline.shell import PipelineRun, RunPlan
from polytrain.strategies.pipeline.weights import ASYNC_WHY, PredictedWeights

if TYPE_CHECKING:
    from polytrain.cost.scene import Estimate, Scene


class SpecTrain(Strategy):
    name = "spectrain"
    learning_evidence = ("pipeline_convergence",)  # accuracy beside gpipe and allreduce
    supports = Supports(lr_schedule=True, why=refusing(ASYNC_WHY))
    family = "pipeline"
    summary = "SpecTrain: asynchronous 1F1B with weight prediction W - s*lr*v instead of stashing"
    Options = AsyncOptions

    @classmethod
    def offers(cls, scene: Scene) -> Iterator[Offer]:
        if scene.profile.optimizer in ("sgd", "momentum"):
            yield from stream_offers(scene)

    def price(self, scene: Scene, world: int) -> Estimate | str:
        return price_stream(self.options, scene, world)  # type: ignore[arg-type]

    def check(self, cfg: JobConfig, world: int) -> None:
        opts: AsyncOptions = self.options  # type: ignore[assignment]
        if cfg.optimizer not in ("sgd", "momentum"):
            raise ConfigError(
                f"Strategy 'spectrain' predicts weights along the SGD velocity, so it needs "
                f"--optimizer sgd or momentum (got {cfg.optimizer}). Fix: --optimizer momentum."
            )
        if opts.vertical_sync:
            raise ConfigError(
                "Strategy 'spectrain' predicts weights instead of stashing versions, so "
                "vertical_sync does not apply. Fix: drop --set vertical_sync, or use pipedream."
            )
        check_pipeline(opts, cfg, world, self.name)

    def run(self, job: Job, ctx: RankContext) -> RankResult:
        opts: AsyncOptions = self.options  # type: ignore[assignment]
        plan = RunPlan(
            strategy=self.name,
            schedule="pipedream",
            per_step=1,
            stream=True,
            make_weights=lambda module, optimizer, stage: PredictedWeights(module, optimizer, stage),
            trace_versions=opts.trace_versions,
            extra=(("weight_prediction", True),),
        )
        return PipelineRun(job, ctx, opts, plan).run()
