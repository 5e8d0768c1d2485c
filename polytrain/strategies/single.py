"""``single``: one process, plain training — the reference every other strategy is held to."""

from __future__ import annotations

import torch

from polytrain.config import JobConfig
from polytrain.errors import ConfigError
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.loop import LoopSpec, run_loop
from polytrain.strategies.base import Strategy


class Single(Strategy):
    name = "single"
    family = "reference"
    summary = "one process, plain SGD steps on the whole global batch (the reference)"

    def check(self, cfg: JobConfig, world: int) -> None:
        if world != 1:
            raise ConfigError(
                f"Strategy 'single' runs on exactly 1 process (got --procs {world}). "
                "Use --procs 1, or a parallel strategy such as --strategy allreduce."
            )

    def run(self, job: Job, ctx: RankContext) -> RankResult:
        model = job.build_model().to(ctx.device)
        optimizer = job.make_optimizer(model.parameters())
        rec = ctx.recorder

        def step(i: int, x: torch.Tensor, y: torch.Tensor) -> float:
            x, y = x.to(ctx.device), y.to(ctx.device)
            optimizer.zero_grad(set_to_none=True)
            with rec.span("forward", step=i):
                loss = job.loss(model(x), y)
            with rec.span("backward", step=i):
                loss.backward()
            with rec.span("optimizer", step=i):
                optimizer.step()
            return float(loss.detach())

        return run_loop(job, ctx, LoopSpec(model=model, optimizer=optimizer, step_fn=step))
