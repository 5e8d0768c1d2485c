"""``allreduce``: synchronous data parallelism (BSP over a collective) with PyTorch DDP.

Every step each of the W ranks computes gradients on its B/W samples of the global batch; DDP
all-reduces them in buckets while backward is still running (overlap) and divides by W, so every
replica applies the same update — the one single-process training applies on the whole batch.
The bucket all-reduce goes through a comm hook into polytrain's accounted communicator, so the
bytes are counted, and each bucket's all-reduce is recorded as a ``comm`` span on the timeline.
``--set collective=ring`` replaces the backend's all-reduce by polytrain's explicit ring
(:mod:`polytrain.comm.ring`; blocking, so no overlap with backward), one span per ring phase.
"""

from __future__ import annotations

from pydantic import ConfigDict, field_validator
from torch.nn.parallel import DistributedDataParallel as DDP

from polytrain.comm.ddp_hooks import builtin_hook, ring_hook
from polytrain.comm.options import CollectiveOptions, check_collective
from polytrain.config import JobConfig
from polytrain.errors import ConfigError
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.loop import LoopSpec, plain_step, run_loop
from polytrain.strategies.base import Strategy


class AllreduceOptions(CollectiveOptions):
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


class Allreduce(Strategy):
    name = "allreduce"
    family = "data"
    summary = "synchronous data parallelism: DDP bucketed all-reduce overlapped with backward"
    Options = AllreduceOptions

    def check(self, cfg: JobConfig, world: int) -> None:
        check_divisible(cfg, world, self.name)
        check_collective(self.name, self.options.collective, world)  # type: ignore[attr-defined]

    def run(self, job: Job, ctx: RankContext) -> RankResult:
        opts: AllreduceOptions = self.options  # type: ignore[assignment]
        model = job.build_model().to(ctx.device)
        ddp = DDP(model, bucket_cap_mb=opts.bucket_mb,
                  device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
        hook = ring_hook if opts.collective == "ring" else builtin_hook
        ddp.register_comm_hook(None, hook(ctx.comm, ctx.world, ctx.recorder))
        optimizer = job.make_optimizer(ddp.parameters())
        spec = LoopSpec(model=model, optimizer=optimizer, step_fn=plain_step(job, ctx, ddp, optimizer),
                        part=ctx.rank, parts=ctx.world,
                        metrics={"bucket_mb": opts.bucket_mb, "overlap": opts.collective == "builtin",
                                 "collective": opts.collective})
        return run_loop(job, ctx, spec)
