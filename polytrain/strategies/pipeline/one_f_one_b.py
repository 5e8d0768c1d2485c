"""``1f1b``: 1F1B with flush (PipeDream-Flush, Narayanan et al. 2021; DAPPLE, Fan et al. 2021).

Stage s runs P−1−s warm-up forwards, then alternates one forward and one backward, then drains;
one optimizer step per mini-batch, as ``gpipe``, so it also equals ``single``. A stage holds at
most P−s micro-batches' activations instead of M: lower peak activation memory, same bubble.

    polytrain train --strategy 1f1b --procs 4 --set microbatches=8
"""

from __future__ import annotations

from polytrain.config import JobConfig
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.supports import Supports
from polytrain.strategies.base import Strategy
from polytrain.strategies.pipeline.gpipe import flush_plan
from polytrain.strategies.pipeline.options import FlushOptions, check_microbatches, check_pipeline
from polytrain.strategies.pipeline.shell import PipelineRun


class OneFOneB(Strategy):
    name = "1f1b"
    supports = Supports(lr_schedule=True, clip=True, grad_accum=True, precision=True, recompute=True)
    family = "pipeline"
    summary = "1F1B with flush (PipeDream-Flush/DAPPLE): bounded activations, one synchronous update"
    Options = FlushOptions

    def check(self, cfg: JobConfig, world: int) -> None:
        opts: FlushOptions = self.options  # type: ignore[assignment]
        check_microbatches(self.name, cfg, opts.microbatches * cfg.grad_accum)
        check_pipeline(opts, cfg, world, self.name)

    def run(self, job: Job, ctx: RankContext) -> RankResult:
        opts: FlushOptions = self.options  # type: ignore[assignment]
        return PipelineRun(job, ctx, opts, flush_plan(self.name, opts, job.config.grad_accum,
                                                   job.config.activation_checkpointing)).run()
