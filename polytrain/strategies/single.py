"""``single``: one process, plain training — the reference every other strategy is held to."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from polytrain.config import JobConfig
from polytrain.errors import ConfigError
from polytrain.runtime import recompute
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.loop import LoopSpec, plain_step, run_loop
from polytrain.runtime.supports import Supports
from polytrain.strategies.base import Offer, Strategy

if TYPE_CHECKING:
    from polytrain.cost.scene import Estimate, Scene


class Single(Strategy):
    name = "single"
    supports = Supports(lr_schedule=True, clip=True, grad_accum=True, precision=True,
                        recompute=True)
    fixed_procs = 1
    family = "reference"
    summary = "one process, plain SGD steps on the whole global batch (the reference)"
    exact = True

    @classmethod
    def offers(cls, scene: Scene) -> Iterator[Offer]:
        yield 1, {}

    def price(self, scene: Scene, world: int) -> Estimate | str:
        from polytrain.cost import estimate as est

        return est.single(scene)

    def check(self, cfg: JobConfig, world: int) -> None:
        if world != 1:
            raise ConfigError(
                f"Strategy 'single' runs on exactly 1 process (got --procs {world}). "
                "Use --procs 1, or a parallel strategy such as --strategy allreduce."
            )

    def run(self, job: Job, ctx: RankContext) -> RankResult:
        model = job.build_model().to(ctx.device)
        recompute.apply(model, job.config.activation_checkpointing)
        optimizer = job.make_optimizer(model.parameters())
        step = plain_step(job, ctx, model, optimizer)
        return run_loop(job, ctx, LoopSpec(model=model, optimizer=optimizer, step_fn=step))
