"""``gpipe``: GPipe (Huang et al. 2019; survey 000 §VI, Fig. 9) — micro-batches, flush, one update.

Each mini-batch of B samples is split into M micro-batches of B/M; every stage runs all M forwards,
then all M backwards (last in, first out), then one optimizer step. Each micro-batch's loss is
scaled by 1/M, so the accumulated gradient is the full mini-batch's mean gradient and the run
equals ``single`` training. ``checkpoint=except_last|always`` re-materialises the forward during
backward (``torch.utils.checkpoint``), trading compute for activation memory.

    polytrain train --strategy gpipe --procs 4 --set microbatches=8 --set checkpoint=except_last
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from polytrain.config import JobConfig
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.supports import Supports
from polytrain.strategies.base import Offer, Strategy
from polytrain.strategies.pipeline.options import FlushOptions, check_microbatches, check_pipeline
from polytrain.strategies.pipeline.shell import PipelineRun, RunPlan
from polytrain.strategies.pipeline.weights import FlushWeights

if TYPE_CHECKING:
    from polytrain.cost.scene import Estimate, Scene


def flush_plan(strategy: str, opts: FlushOptions, accum: int = 1, recompute: bool = False) -> RunPlan:
    """``accum``: --grad-accum K multiplies the micro-batches of each step (one update);
    ``recompute``: --activation-checkpointing, the stage-wise ``checkpoint=always`` unless the
    options chose a mode."""
    return RunPlan(
        strategy=strategy,
        schedule=strategy,
        per_step=opts.microbatches * accum,
        stream=False,
        make_weights=lambda module, optimizer, _stage: FlushWeights(module, optimizer),
        checkpoint="always" if recompute and opts.checkpoint == "never" else opts.checkpoint,
    )


class FlushStrategy(Strategy):
    """A flush pipeline (gpipe, 1f1b, zb-h1): M micro-batches, one synchronous update per step,
    so it equals ``single``; each names its schedule by its own name."""

    family = "pipeline"
    exact = True
    Options = FlushOptions

    def check(self, cfg: JobConfig, world: int) -> None:
        opts: FlushOptions = self.options  # type: ignore[assignment]
        check_microbatches(self.name, cfg, opts.microbatches * cfg.grad_accum)
        check_pipeline(opts, cfg, world, self.name)

    def run(self, job: Job, ctx: RankContext) -> RankResult:
        opts: FlushOptions = self.options  # type: ignore[assignment]
        return PipelineRun(job, ctx, opts, flush_plan(self.name, opts, job.config.grad_accum,
                                                   job.config.activation_checkpointing)).run()

    @classmethod
    def offers(cls, scene: Scene) -> Iterator[Offer]:
        from polytrain.cost.pipeline import planned_partition

        w, b = scene.cluster.world, scene.batch
        if 2 <= w <= scene.layers:
            for m in sorted({w, 2 * w, 4 * w}):
                if m <= b and b % m == 0:
                    yield w, {"microbatches": m, "partition": planned_partition(scene, cls.name, w, m)}

    def price(self, scene: Scene, world: int) -> Estimate | str:
        from polytrain.cost.pipeline import price_pipeline

        o: FlushOptions = self.options  # type: ignore[assignment]
        return price_pipeline(scene, self.name, world, o.microbatches, 1, o.partition, o.replicate,
                              o.link_gbps)


class GPipe(FlushStrategy):
    name = "gpipe"
    supports = Supports(lr_schedule=True, clip=True, grad_accum=True, precision=True, recompute=True)
    summary = "GPipe: M micro-batches, all forwards then all backwards, one synchronous update"
