"""``zb-h1``: ZB-H1 zero-bubble pipeline (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR'24).

1F1B with every backward split in two: ``B`` computes the input gradient, which the previous stage
waits for, and ``W`` the weight gradient, which nobody waits for, so stage s defers s of them into
the slots where 1F1B idles. Same peak activations as 1F1B's stage 0 (P micro-batches), bubble
(P−1)(F+B−W) with B the input-gradient time, against 1F1B's (P−1)(F+B+W). One optimizer step
per mini-batch after the flush, so it equals ``single``. The split runs per layer
(`split_backward`).

    polytrain train --strategy zb-h1 --procs 4 --set microbatches=8
"""

from __future__ import annotations

from polytrain.config import JobConfig
from polytrain.errors import ConfigError
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.strategies.pipeline.gpipe import FlushStrategy, flush_plan
from polytrain.strategies.pipeline.options import FlushOptions, check_microbatches, check_pipeline
from polytrain.strategies.pipeline.shell import PipelineRun


def check_split(name: str, opts: FlushOptions) -> None:
    """A re-materialised stage cannot split its backward: its forward is recomputed inside the
    backward, which then runs whole; refused before launch."""
    if opts.checkpoint != "never":
        raise ConfigError(
            f"'{name}' with checkpoint={opts.checkpoint}. Rule: a split backward (B now, W later) keeps "
            "each layer's graph from B to W, which a re-materialised stage does not have. "
            "Fix: --set checkpoint=never, or --strategy 1f1b with checkpointing."
        )


class ZeroBubbleH1(FlushStrategy):
    name = "zb-h1"
    summary = "ZB-H1 zero bubble: 1F1B with B and W split, W deferred into the bubble, one update"

    def check(self, cfg: JobConfig, world: int) -> None:
        opts: FlushOptions = self.options  # type: ignore[assignment]
        check_microbatches(self.name, cfg, opts.microbatches)
        check_split(self.name, opts)
        check_pipeline(opts, cfg, world, self.name)

    def run(self, job: Job, ctx: RankContext) -> RankResult:
        opts: FlushOptions = self.options  # type: ignore[assignment]
        return PipelineRun(job, ctx, opts, flush_plan(self.name, opts)).run()
