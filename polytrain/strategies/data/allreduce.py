"""``allreduce``: synchronous data parallelism (BSP over a collective) with PyTorch DDP.

Every step each of the W ranks computes gradients on its B/W samples of the global batch; DDP
all-reduces them in buckets while backward is still running (overlap) and divides by W, so every
replica applies the same update — the one single-process training applies on the whole batch.
The bucket all-reduce goes through a comm hook into polytrain's accounted communicator, so the
bytes are counted, and each bucket's all-reduce is recorded as a ``comm`` span on the timeline.
``--set compression=CODEC`` compresses each parameter's gradient in the hook
(:mod:`polytrain.comm.codecs`; ``powersgd`` is PyTorch's own hook), with error-feedback residuals
saved in checkpoints (every rank writes its own); ``onebit-adam`` replaces Adam's step and this
hook after a warm-up (:mod:`polytrain.comm.onebit_adam`). ``--set collective=ring`` replaces the
backend's all-reduce by polytrain's explicit ring (:mod:`polytrain.comm.ring`; blocking, so no
overlap with backward), one span per ring phase.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pydantic import ConfigDict, field_validator
from torch import nn

from polytrain.comm.accounted import Comm
from polytrain.comm.codecs.engine import Engine
from polytrain.comm.ddp_hooks import (
    builtin_hook,
    codec_hook,
    counted_ddp,
    onebit_hook,
    powersgd,
    ring_hook,
)
from polytrain.comm.exchange import codec_report
from polytrain.comm.onebit_adam import OneBitAdam
from polytrain.comm.options import (
    CodecOptions,
    CollectiveOptions,
    check_codec,
    check_onebit_nonfinite,
)
from polytrain.config import JobConfig
from polytrain.errors import ConfigError
from polytrain.runtime import recompute
from polytrain.runtime.accumulate import check_accum
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.loop import LoopSpec, plain_step, run_loop
from polytrain.runtime.supports import Supports
from polytrain.strategies.base import Offer, Strategy

if TYPE_CHECKING:
    from polytrain.cost.scene import Estimate, Scene


class AllreduceOptions(CollectiveOptions, CodecOptions):
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
    check_accum(cfg.batch_size, parts, cfg.grad_accum, strategy)
    if cfg.batch_size % parts:
        lower = max(parts, cfg.batch_size - cfg.batch_size % parts)
        raise ConfigError(
            f"Strategy '{strategy}' splits the global batch over {parts} data-parallel ranks, "
            f"so --batch-size must be a multiple of {parts} (got {cfg.batch_size}). "
            f"Use --batch-size {lower} or {lower + parts}."
        )


def codec_engine(opts: CodecOptions, job: Job, ctx: RankContext) -> Engine | None:
    """The rank's compression engine, or None without ``compression`` (or with powersgd, or
    onebit-adam, which compresses in the optimizer)."""
    if not opts.compressing or opts.compression in ("powersgd", "onebit-adam"):
        return None
    return Engine.from_options(opts, ctx.world, ctx.rank, job.config.seed)


def codec_loop_fields(engine: Engine | None, ctx: RankContext) -> dict[str, Any]:
    """LoopSpec fields for a codec: its state (residuals) goes into every rank's checkpoint."""
    if engine is None:
        return {}
    return {"state": engine.state_dict, "load_state": engine.load_state_dict, "replicated": False,
            "evaluates": ctx.is_leader}


def param_names(model: nn.Module) -> dict[int, tuple[int, str]]:
    return {id(p): (i, n) for i, (n, p) in enumerate(model.named_parameters())}


def onebit_adam(opts: CodecOptions, job: Job, ctx: RankContext, model: nn.Module,
                comm: Comm | None = None) -> OneBitAdam | None:
    """The job's Adam as 1-bit Adam (with ``compression=onebit-adam``), else None. ``comm``: the
    ranks that hold the same parameters and exchange their momentum (default: every rank)."""
    if opts.compression != "onebit-adam":
        return None
    c = job.config
    return OneBitAdam(list(model.named_parameters()), lr=c.lr, weight_decay=c.weight_decay,
                      warmup=opts.onebit_warmup, comm=comm or ctx.comm, rec=ctx.recorder,
                      entropy=opts.entropy, seed=c.seed)


def onebit_loop_fields(onebit: OneBitAdam, ctx: RankContext) -> dict[str, Any]:
    """LoopSpec fields for 1-bit Adam: the residuals differ per rank, every rank checkpoints its own
    (m, v and the step are the optimizer's state, checkpointed as usual)."""
    return {"state": onebit.exchange.state_dict, "load_state": onebit.exchange.load_state_dict,
            "replicated": False, "evaluates": ctx.is_leader}


POWERSGD_STATE = "PyTorch's PowerSGDState (its error and warm-start matrices) is not checkpointed"


class Allreduce(Strategy):
    name = "allreduce"
    family = "data"
    summary = "synchronous data parallelism: DDP bucketed all-reduce overlapped with backward"
    exact = True
    Options = AllreduceOptions
    supports = Supports(compression=True, lr_schedule=True, clip=True, grad_accum=True, precision=True,
                        recompute=True)

    @classmethod
    def offers(cls, scene: Scene) -> Iterator[Offer]:
        from polytrain.cost.codecs import DEFAULT_CODECS

        w = scene.cluster.world
        if w >= 2 and scene.batch % w == 0:
            yield w, {}
            for codec, options in DEFAULT_CODECS:
                yield w, {"compression": codec, **options}

    def price(self, scene: Scene, world: int) -> Estimate | str:
        from polytrain.cost import estimate as est
        from polytrain.cost.codecs import codec_price

        o: AllreduceOptions = self.options  # type: ignore[assignment]
        return est.allreduce(scene, world, o.bucket_mb, codec_price(o, scene.profile.params))

    def supports_for(self, cfg: JobConfig) -> Supports:
        if self.options.compression == "powersgd":  # type: ignore[attr-defined]
            return self.declared().without(POWERSGD_STATE, "checkpoint", "resume")
        return self.declared()

    def check(self, cfg: JobConfig, world: int) -> None:
        check_divisible(cfg, world, self.name)
        check_codec(self.name, self.options, world, hooks=True,  # type: ignore[arg-type]
                    optimizer=cfg.optimizer)
        check_onebit_nonfinite(self.name, self.options.compression, cfg.on_nonfinite)  # type: ignore[attr-defined]

    def run(self, job: Job, ctx: RankContext) -> RankResult:
        opts: AllreduceOptions = self.options  # type: ignore[assignment]
        model = job.build_model().to(ctx.device)
        recompute.apply(model, job.config.activation_checkpointing)  # before DDP wraps it
        ddp = counted_ddp(model, ctx.comm, bucket_cap_mb=opts.bucket_mb,
                          device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
        engine = codec_engine(opts, job, ctx)
        onebit = onebit_adam(opts, job, ctx, model)
        if engine is not None:
            ddp.register_comm_hook(None, codec_hook(ctx.comm, ctx.world, ctx.recorder, engine,
                                                    param_names(model), opts.collective))
        elif onebit is not None:
            ddp.register_comm_hook(None, onebit_hook(ctx.comm, ctx.world, ctx.recorder,
                                                     lambda: onebit.compressing))
        elif opts.compression == "powersgd":
            ddp.register_comm_hook(*powersgd(ctx.comm, opts.powersgd_rank))
        else:
            hook = ring_hook if opts.collective == "ring" else builtin_hook
            ddp.register_comm_hook(None, hook(ctx.comm, ctx.world, ctx.recorder))
        optimizer = onebit if onebit is not None else job.make_optimizer(ddp.parameters())
        overlap = opts.collective == "builtin" and engine is None
        fields = codec_loop_fields(engine, ctx)
        if onebit is not None:
            fields = onebit_loop_fields(onebit, ctx)
        spec = LoopSpec(model=model, optimizer=optimizer, step_fn=plain_step(job, ctx, ddp, optimizer),
                        part=ctx.rank, parts=ctx.world,
                        metrics={"bucket_mb": opts.bucket_mb, "overlap": overlap,
                                 "collective": opts.collective, "compression": opts.compression},
                        **fields)
        result = run_loop(job, ctx, spec)
        if engine is not None:
            result.strategy_metrics["codec"] = codec_report(engine, ctx.comm, result.steps)
        elif onebit is not None:
            result.strategy_metrics["codec"] = onebit.report(result.steps)
        elif opts.compression == "powersgd":
            result.strategy_metrics["codec"] = {
                "codec": f"powersgd(rank={opts.powersgd_rank})",
                "wire_bytes_per_step": round(ctx.comm.by_op().get("powersgd", 0) / max(result.steps, 1), 1)}
        return result
