"""The training shell every data-parallel strategy shares: data shard, steps, progress, metrics,
checkpoint/resume, evaluation. A strategy supplies only ``step_fn`` (how gradients travel and
who updates) and, if it keeps more state than the model and optimizer, ``extra_state``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from polytrain.runtime.checkpoint import CheckpointStore
from polytrain.runtime.job import Job, RankContext, RankResult

StepFn = Callable[[int, torch.Tensor, torch.Tensor], float]


@dataclass
class LoopSpec:
    """How the shell drives one rank.

    ``part``/``parts``: this rank's slice of each global batch. ``replicated``: every rank holds
    the same parameters, so rank 0 alone checkpoints and evaluates. ``state``/``load_state``
    extend checkpoints with strategy state (e.g. error-feedback residuals).
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    step_fn: StepFn
    part: int = 0
    parts: int = 1
    replicated: bool = True
    state: Callable[[], dict[str, Any]] | None = None
    load_state: Callable[[dict[str, Any]], None] | None = None
    eval_model: nn.Module | None = None
    metrics: dict[str, Any] = field(default_factory=dict)


def plain_step(job: Job, ctx: RankContext, forward: Callable[[torch.Tensor], torch.Tensor],
               optimizer: torch.optim.Optimizer,
               before_update: Callable[[], None] | None = None) -> StepFn:
    """The ordinary step (zero grads, forward, backward, update) with timeline spans.

    ``forward`` is the model, or a wrapper around it (e.g. DDP, a tensor-parallel model) whose
    forward/backward communicates; ``before_update`` runs between backward and the update (e.g.
    a data-parallel gradient all-reduce).
    """
    rec = ctx.recorder

    def step(i: int, x: torch.Tensor, y: torch.Tensor) -> float:
        x, y = x.to(ctx.device), y.to(ctx.device)
        optimizer.zero_grad(set_to_none=True)
        with rec.span("forward", step=i):
            loss = job.loss(forward(x), y)
        with rec.span("backward", step=i):
            loss.backward()
        if before_update is not None:
            before_update()
        with rec.span("optimizer", step=i):
            optimizer.step()
        return float(loss.detach())

    return step


def _snapshot(spec: LoopSpec, step: int) -> dict[str, Any]:
    state: dict[str, Any] = {
        "step": torch.tensor(step),
        "model": spec.model.state_dict(),
        "optimizer": spec.optimizer.state_dict(),
        "rng": torch.get_rng_state(),
    }
    if spec.state is not None:
        state["strategy"] = spec.state()
    return state


def save_checkpoint(job: Job, ctx: RankContext, spec: LoopSpec, step: int) -> None:
    """Collective: every rank calls it; replicated jobs are written by rank 0 alone."""
    if not spec.replicated or ctx.is_leader:
        ctx.checkpoints.write_rank(step, ctx.rank, _snapshot(spec, step))
    if not spec.replicated:
        ctx.comm.barrier()
    if ctx.is_leader:
        path = ctx.checkpoints.commit(step, keep=job.config.keep_checkpoints)
        ctx.recorder.emit("checkpoint", step=step, path=str(path.relative_to(ctx.run_dir)))


def restore_checkpoint(ctx: RankContext, spec: LoopSpec) -> int:
    """Load the newest good checkpoint into the model and optimizer; returns its step."""
    ckpt, warnings = ctx.checkpoints.find_good()
    for w in warnings:
        ctx.recorder.emit("note", text=f"warning: {w}; using {ckpt.name}")
    state = CheckpointStore.load_rank(ckpt, 0 if spec.replicated else ctx.rank)
    spec.model.load_state_dict(state["model"])
    spec.optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"])
    if spec.load_state is not None and "strategy" in state:
        spec.load_state(state["strategy"])
    return int(state["step"])


def run_loop(job: Job, ctx: RankContext, spec: LoopSpec) -> RankResult:
    """Run steps ``start+1 .. job.steps`` and return this rank's result."""
    cfg = job.config
    start = restore_checkpoint(ctx, spec) if ctx.resume else 0
    batches = job.batches()
    ctx.comm.barrier()
    ctx.recorder.start_clock()
    ctx.recorder.emit("start", first_step=start + 1, steps=job.steps)
    t0 = time.perf_counter()
    loss = float("nan")
    evaluates = ctx.is_leader or not spec.replicated
    eval_model = spec.eval_model or spec.model
    for step in range(start + 1, job.steps + 1):
        x, y = batches.shard(step, spec.part, spec.parts)
        t_step = time.perf_counter()
        loss = spec.step_fn(step, x, y)
        ctx.straggle(time.perf_counter() - t_step)
        ctx.recorder.step(step, loss, samples=step * job.batch_size)
        if ctx.progress is not None:
            ctx.progress.update(step, loss)
        if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
            save_checkpoint(job, ctx, spec, step)
        if cfg.eval_every and step % cfg.eval_every == 0 and step < job.steps and evaluates:
            ctx.recorder.emit("eval", step=step, **job.evaluate(eval_model))
    wall = time.perf_counter() - t0
    result = RankResult(steps=job.steps - start, samples=(job.steps - start) * job.batch_size,
                        wall_s=wall, final_loss=loss, strategy_metrics=dict(spec.metrics))
    if evaluates:
        result.eval = job.evaluate(eval_model)
        ctx.recorder.emit("eval", step=job.steps, **result.eval)
        result.model_state = {k: v.detach().clone() for k, v in spec.model.state_dict().items()}
    return result
