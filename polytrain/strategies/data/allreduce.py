"""``allreduce``: synchronous data parallelism (BSP over a collective) with PyTorch DDP.

Every step each of the W ranks computes gradients on its B/W samples of the global batch; DDP
all-reduces them in buckets while backward is still running (overlap) and divides by W, so every
replica applies the same update — the one single-process training applies on the whole batch.
The bucket all-reduce goes through a comm hook into polytrain's accounted communicator, so the
bytes are counted, and each bucket's all-reduce is recorded as a ``comm`` span on the timeline.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator
from torch.nn.parallel import DistributedDataParallel as DDP

from polytrain.config import JobConfig
from polytrain.errors import ConfigError
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.loop import LoopSpec, plain_step, run_loop
from polytrain.strategies.base import Strategy


class AllreduceOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    bucket_mb: float = 25.0

    @field_validator("bucket_mb")
    @classmethod
    def _positive(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("the DDP bucket size in MiB must be positive (default 25)")
        return v


def check_divisible(cfg: JobConfig, parts: int, strategy: str) -> None:
    """The global batch must split evenly over the data-parallel parts."""
    if cfg.batch_size % parts:
        lower = max(parts, cfg.batch_size - cfg.batch_size % parts)
        raise ConfigError(
            f"Strategy '{strategy}' splits the global batch over {parts} data-parallel ranks, "
            f"so --batch-size must be a multiple of {parts} (got {cfg.batch_size}). "
            f"Use --batch-size {lower} or {lower + parts}."
        )


def _accounted_hook(ctx: RankContext) -> Any:
    """A DDP comm hook: mean of the bucket over ranks, through the accounted communicator."""
    rec = ctx.recorder

    # DDP checks the hook's annotation at run time, which a postponed (string) annotation fails,
    # so the hook (GradBucket -> Future[Tensor]) is left unannotated.
    def hook(_state, bucket):  # type: ignore[no-untyped-def]
        buf = bucket.buffer()
        buf.div_(ctx.world)
        start, index = rec.now(), bucket.index()
        return ctx.comm.all_reduce_future(
            buf, on_done=lambda: rec.add_span("allreduce", "comm", start, rec.now(), bucket=index))

    return hook


class Allreduce(Strategy):
    name = "allreduce"
    family = "data"
    summary = "synchronous data parallelism: DDP bucketed all-reduce overlapped with backward"
    Options = AllreduceOptions

    def check(self, cfg: JobConfig, world: int) -> None:
        check_divisible(cfg, world, self.name)

    def run(self, job: Job, ctx: RankContext) -> RankResult:
        opts: AllreduceOptions = self.options  # type: ignore[assignment]
        model = job.build_model().to(ctx.device)
        ddp = DDP(model, bucket_cap_mb=opts.bucket_mb,
                  device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
        ddp.register_comm_hook(None, _accounted_hook(ctx))
        optimizer = job.make_optimizer(ddp.parameters())
        spec = LoopSpec(model=model, optimizer=optimizer, step_fn=plain_step(job, ctx, ddp, optimizer),
                        part=ctx.rank, parts=ctx.world,
                        metrics={"bucket_mb": opts.bucket_mb, "overlap": True})
        return run_loop(job, ctx, spec)
