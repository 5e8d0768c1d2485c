"""The pipelines with virtual stages: ``interleaved-1f1b``, ``looped-bfs``, ``zbv``, ``dualpipev``.

Each runs its registered schedule (`schedule_virtual`) over P·V model chunks, V per rank
(`virtual_run`), with one optimizer step per mini-batch, so each equals ``single``.

    polytrain train --strategy interleaved-1f1b --procs 2 --set virtual_stages=2 --set microbatches=4
    polytrain train --strategy zbv --procs 2 --set microbatches=4

Refused before launch, in one line each: V the schedule cannot place (a V-shape places 2), M not
a multiple of P for interleaving, V·P chunks that do not divide the layers (``uniform``) or
counts that do not give V·P chunks, a split backward with checkpointing, replicated stages.
Weights tied across chunks (nanoGPT's and GPT-2's ``wte``/``lm_head``) are summed at the flush
(`ties`). Checkpoints and resume are exact (each rank's chunks and optimizer
state at a flush, `virtual_run`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from pydantic import Field

from polytrain.config import JobConfig
from polytrain.errors import ConfigError
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.schedules.registry import get_schedule
from polytrain.strategies.base import Offer, Strategy
from polytrain.strategies.pipeline.chunks import check_chunks
from polytrain.strategies.pipeline.options import FlushOptions, check_microbatches
from polytrain.strategies.pipeline.virtual_run import VirtualRun
from polytrain.strategies.pipeline.zb_h1 import check_split

if TYPE_CHECKING:
    from polytrain.cost.scene import Estimate, Scene


class VirtualOptions(FlushOptions):
    """Flush options plus ``virtual_stages``: model chunks per rank (V)."""

    partition: str = "uniform"
    virtual_stages: int = Field(2, ge=1, description="model chunks per rank V (the model is cut into P·V)")


def check_virtual_job(name: str, opts: VirtualOptions, cfg: JobConfig, world: int) -> None:
    """Everything `VirtualRun` needs, checked on the job description before any process starts."""
    if opts.checkpoint != "never":
        get_schedule(name).build(world, opts.microbatches, opts.virtual_stages)  # V and M first
        check_split(name, opts)
    if opts.replicate:
        raise ConfigError(
            f"'{name}' with replicate={opts.replicate}. Rule: virtual stages place one rank per "
            "chunk set, without replicas. Fix: drop --set replicate=…, or use mesh with dp=2."
        )
    check_chunks(name, world, opts.microbatches, opts.virtual_stages, opts.partition, cfg)


class _Virtual(Strategy):
    family = "pipeline"
    exact = True
    Options = VirtualOptions

    def check(self, cfg: JobConfig, world: int) -> None:
        opts: VirtualOptions = self.options  # type: ignore[assignment]
        check_microbatches(self.name, cfg, opts.microbatches)
        check_virtual_job(self.name, opts, cfg, world)

    def run(self, job: Job, ctx: RankContext) -> RankResult:
        opts: VirtualOptions = self.options  # type: ignore[assignment]
        return VirtualRun(job, ctx, opts, self.name, opts.virtual_stages).run()

    @classmethod
    def offers(cls, scene: Scene) -> Iterator[Offer]:
        """P = the cluster's world, the schedule's V, M in {P, 2P, 4P} (rounds of P), the
        planner's cut of the P·V chunks pinned."""
        from polytrain.cost.pipeline import planned_partition
        from polytrain.schedules.registry import get_schedule

        w, b = scene.cluster.world, scene.batch
        if w >= 2 and w * get_schedule(cls.name).default_virtual <= scene.layers:
            for m in sorted({w, 2 * w, 4 * w}):
                if m <= b and b % m == 0:
                    yield w, {"microbatches": m, "partition": planned_partition(scene, cls.name, w, m)}

    def price(self, scene: Scene, world: int) -> Estimate | str:
        """The registered orders over P·V chunks, replayed by the planner (`cost.pipeline`)."""
        from polytrain.cost.pipeline import price_pipeline

        o: VirtualOptions = self.options  # type: ignore[assignment]
        return price_pipeline(scene, self.name, world, o.microbatches, 1, o.partition,
                              virtual=o.virtual_stages)


class Interleaved1F1B(_Virtual):
    name = "interleaved-1f1b"
    summary = "Interleaved 1F1B (Megatron): V chunks per rank, bubble / V, one synchronous update"


class LoopedBFS(_Virtual):
    name = "looped-bfs"
    summary = "Looped BFS: GPipe looped over V chunks per rank, one synchronous update"


class ZeroBubbleV(_Virtual):
    name = "zbv"
    summary = "ZB-V: 2 chunks per rank in a V, split backward (B now, W later), one update"


class DualPipeV(_Virtual):
    name = "dualpipev"
    summary = "DualPipeV (DeepSeek-V3 cut in half): 2 chunks per rank in a V, one update"
