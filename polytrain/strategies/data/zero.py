"""``zero``: sharded data parallelism, ZeRO stages 1–3 (Rajbhandari et al., SC'20), on polytrain's
accounted communicator, so every byte it sends is counted.

``--set stage=1`` shards the optimizer state: each rank updates its 1/W of every flat unit, then
all-gathers the updated units. ``stage=2`` also keeps only its 1/W of the gradients (each unit's
gradient is reduce-scattered as soon as backward has produced it, and the full one freed).
``stage=3`` also shards the parameters: each layer is all-gathered just before its forward and
again before its backward, and freed after each. Stages 1–2 send what an all-reduce sends
(reduce-scatter + all-gather = 2(W−1)/W·Ψ' elements per rank per step); stage 3 sends 3(W−1)/W·Ψ'
(one more all-gather), Ψ' the parameter count padded per unit to a multiple of W. The layout and
the hooks live in :mod:`polytrain.strategies.data.zero_shard`.

Training features: ``--precision bf16|fp16`` keeps the shards as fp32 master weights and
gathers, computes and reduce-scatters in the low precision (under autocast, as ``single`` does);
fp16's loss scaler agrees on overflows across the ranks (``Precision(shards=...)``).
``--grad-accum K`` runs K micro-steps (stage 1: one reduce-scatter a step; stages 2–3: one a
micro-step, added into the shard). ``--clip-grad-norm X`` takes the global norm from the gradient
shards (each element on one rank) with one 4-byte all-reduce (:mod:`polytrain.runtime.clip`).
``--activation-checkpointing`` recomputes each block's forward in backward
(:mod:`polytrain.runtime.recompute`); at stage 3 the layer is gathered again before its
recomputation (the gradient hook on its output fires first), and a layer inside a checkpointed
block is gathered by its forward pre-hook when the recomputation reaches it and kept until its
gradients are reduced, so the bytes sent do not change.

Checkpoints: each rank writes its shards and its optimizer state (``rank<r>.pt``); rank 0 also
writes the consolidated ``model.pt`` in the model's own key names. A resume needs the same W.
"""

from __future__ import annotations

import resource
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from polytrain.comm.ddp_hooks import sync_buffers
from polytrain.config import JobConfig
from polytrain.errors import ConfigError
from polytrain.runtime import recompute
from polytrain.runtime.accumulate import accumulate
from polytrain.runtime.checkpoint import CheckpointStore
from polytrain.runtime.clip import GradSplit, clip_grad_norm
from polytrain.runtime.divergence import all_finite
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.loop import LoopSpec, StepFn, commit_with_model, newest_checkpoint, run_loop
from polytrain.runtime.precision import Precision
from polytrain.runtime.supports import Supports
from polytrain.strategies.base import Offer, Strategy
from polytrain.strategies.data.allreduce import check_divisible
from polytrain.strategies.data.zero_memory import formula_bytes, held_bytes
from polytrain.strategies.data.zero_shard import ShardedModel
from polytrain.strategies.data.zero_units import bucket_units, layer_units

if TYPE_CHECKING:
    from polytrain.cost.scene import Estimate, Scene

DEFAULT_BUCKET_MB = 25.0
NO_CODEC = ("zero's reduce-scatter and all-gather carry dense shards, and no codec is wired into "
            "them")


class ZeroOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    stage: int = Field(2, description="1: optimizer state, 2: + gradients, "
                       "3: + parameters sharded over the ranks")
    bucket_mb: float | None = Field(None, gt=0, description="stages 1-2: MiB of parameters per "
                                    f"flat unit (default {DEFAULT_BUCKET_MB:g}); stage 3 shards by layer")
    prefetch: int = Field(0, ge=0, le=1, description="stage 3: 1 gathers the next layer while "
                          "this one computes (forward and backward)")

    @field_validator("stage")
    @classmethod
    def _stage(cls, v: int) -> int:
        if v not in (1, 2, 3):
            raise ValueError("stage must be 1 (optimizer state), 2 (+ gradients) or 3 "
                             "(+ parameters sharded); use --set stage=1, 2 or 3")
        return v


def optimizer_state_bytes(cfg: JobConfig) -> int:
    """K: bytes of optimizer state per fp32 parameter (Adam, AdamW: two moments; momentum: a
    velocity)."""
    return {"adam": 8, "adamw": 8, "momentum": 4}.get(cfg.optimizer, 0)


def count_params(cfg: JobConfig) -> int | None:
    """The model's parameter count, built on the meta device (None where it cannot be)."""
    from polytrain.strategies.pipeline.options import meta_model

    model = meta_model(cfg)
    return None if model is None else sum(p.numel() for p in model.parameters())


def check_param_count(total: int, world: int) -> None:
    if total < world:
        raise ConfigError(
            f"Strategy 'zero' shards every parameter over the {world} ranks, so the model needs at "
            f"least {world} parameters (it has {total}). Use at most --procs {max(total, 1)}, or "
            "--strategy allreduce.")


class Zero(Strategy):
    name = "zero"
    family = "data"
    summary = "ZeRO stages 1-3: optimizer state, gradients and parameters sharded over the ranks"
    Options = ZeroOptions
    supports = Supports(lr_schedule=True, clip=True, grad_accum=True, precision=True,
                        recompute=True, why={"compression": NO_CODEC})
    exact = True

    @classmethod
    def offers(cls, scene: Scene) -> Iterator[Offer]:
        w = scene.cluster.world
        if w >= 2 and scene.batch % w == 0 and scene.profile.param_bytes >= 4 * w:
            for stage in (1, 2, 3):
                yield w, {"stage": stage}
            yield w, {"stage": 3, "prefetch": 1}

    def price(self, scene: Scene, world: int) -> Estimate | str:
        from polytrain.cost.sharded import sharded

        o: ZeroOptions = self.options  # type: ignore[assignment]
        return sharded(scene, world, o.stage, o.bucket_mb or DEFAULT_BUCKET_MB, bool(o.prefetch),
                       reduce_each_micro=o.stage >= 2)

    def check(self, cfg: JobConfig, world: int) -> None:
        opts: ZeroOptions = self.options  # type: ignore[assignment]
        check_divisible(cfg, world, self.name)
        if opts.stage == 3 and opts.bucket_mb is not None:
            raise ConfigError(
                f"Strategy 'zero' at stage 3 gathers one layer at a time, so bucket_mb (got "
                f"{opts.bucket_mb:g}) does not apply. Drop --set bucket_mb, or use stage=1 or 2.")
        if opts.stage < 3 and opts.prefetch:
            raise ConfigError(
                f"Strategy 'zero' prefetches parameters at stage 3 only (got prefetch=1 with "
                f"stage={opts.stage}): stages 1-2 keep every parameter. Drop --set prefetch, or "
                "use --set stage=3.")
        total = count_params(cfg)
        if total is not None:
            check_param_count(total, world)

    def run(self, job: Job, ctx: RankContext) -> RankResult:
        opts: ZeroOptions = self.options  # type: ignore[assignment]
        model = job.build_model().to(ctx.device)
        blocks = recompute.apply(model, job.config.activation_checkpointing)
        sync_buffers(model, ctx.comm)
        params = list(model.parameters())
        check_param_count(sum(p.numel() for p in params), ctx.world)
        units = (layer_units(model, ctx.world) if opts.stage == 3 else
                 bucket_units(params, ctx.world, opts.bucket_mb or DEFAULT_BUCKET_MB))
        amp = Precision(job.config.precision, ctx.device, shards=ctx.comm)
        sm = ShardedModel(model, units, ctx.comm, opts.stage, opts.prefetch, dtype=amp.dtype)
        optimizer = job.make_optimizer(sm.optimizer_params())

        def evaluate() -> dict[str, float]:
            with amp.autocast():  # the units are in the compute dtype under mixed precision
                return job.evaluate(model)

        spec = LoopSpec(model=model, optimizer=optimizer, step_fn=zero_step(job, ctx, sm, optimizer, amp),
                        part=ctx.rank, parts=ctx.world, replicated=not sm.collective_state,
                        save=lambda step: save_sharded(job, ctx, sm, optimizer, amp, step),
                        restore=lambda: restore_sharded(ctx, sm, optimizer, amp), evaluate=evaluate,
                        metrics={"stage": opts.stage, "units": len(units), "prefetch": opts.prefetch,
                                 "recomputed_blocks": blocks},
                        precision=amp)
        result = run_loop(job, ctx, spec)
        result.strategy_metrics.update(memory_report(job, ctx, sm, optimizer))
        if sm.collective_state and result.model_state is not None:
            full = sm.consolidated()  # collective: every rank evaluated, every rank gathers
            result.model_state = full if ctx.is_leader else None
        return result


def zero_step(job: Job, ctx: RankContext, sm: ShardedModel, optimizer: torch.optim.Optimizer,
              amp: Precision) -> StepFn:
    """One step: ``--grad-accum`` micro-steps of forward and backward (the hooks reduce-scatter
    each unit's gradient as it is ready, and at stage 3 gather and free layers), each followed by
    waiting for its reductions; then unscale (fp16), clip by the global norm, update the shards."""
    rec, cfg = ctx.recorder, job.config
    skip_nonfinite = cfg.on_nonfinite == "skip" and amp.scaler is None  # a scaler skips itself
    split = GradSplit(ctx.comm)  # every gradient element on exactly one rank

    def step(i: int, x: torch.Tensor, y: torch.Tensor) -> float:
        x, y = x.to(ctx.device), y.to(ctx.device)
        sm.begin_step()

        def loss_of(f: Any, xm: torch.Tensor, ym: torch.Tensor) -> torch.Tensor:
            with rec.span("forward", step=i), amp.autocast():
                return job.forward_loss(f, xm, ym)

        def backward(loss: torch.Tensor) -> None:
            with rec.span("backward", step=i):
                amp.backward(loss)
            with rec.span("reducescatter-wait", "comm", step=i):
                sm.finish_backward()

        loss = accumulate(sm, x, y, cfg.grad_accum, loss_of, backward)
        amp.unscale(optimizer)
        if cfg.clip_grad_norm is not None:
            clip_grad_norm(sm.shards, cfg.clip_grad_norm, split)
        if skip_nonfinite and not _all_ranks_finite(ctx, sm):
            rec.emit("skipped", step=i, reason="non-finite gradient")
            return loss
        with rec.span("optimizer", step=i):
            if not sm.optimizer_step(optimizer, amp):
                rec.emit("skipped", step=i, reason="fp16 gradient overflow; loss scale halved")
        return loss

    return step


def _all_ranks_finite(ctx: RankContext, sm: ShardedModel) -> bool:
    """Whether every rank's gradient shards are finite (one all-reduce of a flag: a step is
    skipped everywhere or nowhere)."""
    bad = torch.tensor([0.0 if all_finite(s.grad for s in sm.shards) else 1.0], device=sm.device)
    ctx.comm.all_reduce(bad, op="nonfinite")
    return float(bad) == 0.0


def save_sharded(job: Job, ctx: RankContext, sm: ShardedModel, optimizer: torch.optim.Optimizer,
                 amp: Precision, step: int) -> None:
    """Collective: every rank writes its shards and optimizer state; rank 0 also writes the
    consolidated ``model.pt`` (the model's own key names), then seals the checkpoint."""
    ctx.checkpoints.write_rank(step, ctx.rank, {
        "step": torch.tensor(step), "rng": torch.get_rng_state(),
        "shards": {str(i): s.detach().clone() for i, s in enumerate(sm.shards)},
        "optimizer": optimizer.state_dict(), "precision": amp.state()})
    commit_with_model(job, ctx, step, sm.consolidated() if sm.collective_state or ctx.is_leader else None)


def restore_sharded(ctx: RankContext, sm: ShardedModel, optimizer: torch.optim.Optimizer,
                    amp: Precision) -> int:
    """Load this rank's shards and optimizer state from the newest good checkpoint."""
    ckpt = newest_checkpoint(ctx)
    state = CheckpointStore.load_rank(ckpt, ctx.rank)
    shards = state["shards"]
    if len(shards) != len(sm.shards) or any(shards[str(i)].shape != s.shape
                                            for i, s in enumerate(sm.shards)):
        raise ConfigError(f"Checkpoint {ckpt} holds shards of another layout (world size or "
                          "stage differ); resume with the --procs and stage it was written with.")
    sm.load_shards([shards[str(i)] for i in range(len(sm.shards))])
    optimizer.load_state_dict(state["optimizer"])
    amp.load_state(state.get("precision", {}))
    torch.set_rng_state(state["rng"])
    return int(state["step"])


def peak_memory(device: torch.device) -> dict[str, Any]:
    """This process's peak memory as measured: CUDA's allocator peak, or the CPU RSS peak."""
    if device.type == "cuda":
        return {"peak_memory_bytes": int(torch.cuda.max_memory_allocated(device)),
                "peak_memory_source": "torch.cuda.max_memory_allocated"}
    return {"peak_memory_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "peak_memory_source": "getrusage ru_maxrss (process RSS peak)"}


def memory_report(job: Job, ctx: RankContext, sm: ShardedModel,
                  optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Held bytes counted from the rank's tensors, ZeRO's formula for them, and the peak."""
    padded = sum(u.padded for u in sm.units)
    k = optimizer_state_bytes(job.config)
    return {"params_total": sum(u.numel for u in sm.units), "params_padded": padded,
            "unit_params": [u.numel for u in sm.units], "optimizer_bytes_per_param": k,
            "held_bytes": held_bytes(sm, optimizer),
            "formula_bytes": formula_bytes(sm.stage, padded, ctx.world, k, sm.dtype.itemsize,
                                           sm.mixed),
            **peak_memory(ctx.device)}
