"""The training shell every strategy shares: data shard, steps, progress, metrics,
checkpoint/resume, evaluation. A strategy supplies only ``step_fn`` (how gradients travel and
who updates) and, if it keeps more state than the model and optimizer, ``state``/``load_state``.

Hooks for strategies whose ranks do not all train alike (parameter servers, a coordinator, a
solver with its own data):

* ``own_step(step) -> loss``: a strategy-owned step that fetches its own data (instead of
  ``step_fn`` on this rank's part of the global batch);
* ``after_update(step, loss)``: runs after each step's update and before the step is recorded
  (e.g. a scheduler that observes the round's changes);
* ``samples_at(step)``: samples (or updates) processed up to ``step``, when not step × batch;
* ``save``/``restore``: the strategy's own checkpoint protocol (e.g. ``ps``: the servers write
  their shards and optimizer state at a consistent cut), replacing the collective default;
  ``quiesce``: every rank waits at a barrier before and after the snapshot (ranks that write
  into one shared copy, e.g. ``hogwild``, must not write while it is read); such ranks also
  check their parameters for NaN/inf on a private copy (see ``all_finite``);
* ``evaluate``: the strategy's own evaluation (default ``job.evaluate(eval_model)``),
  ``evaluates``: whether this rank evaluates (default: the leader, or every rank when the
  parameters are not replicated); ``final_eval``: whether it also evaluates at the end and
  reports its model (default: ``evaluates``; False where another rank holds the final model,
  e.g. a ``ps`` worker, whose servers report it); ``reports``: whether this rank records its
  steps' losses (False for a rank that computes none, e.g. a server).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from polytrain.runtime import interrupt
from polytrain.runtime.checkpoint import CheckpointStore
from polytrain.runtime.divergence import FiniteWatch, all_finite
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.startup_trace import rank_mark

StepFn = Callable[[int, torch.Tensor, torch.Tensor], float]
OwnStep = Callable[[int], float]


@dataclass
class LoopSpec:
    """How the shell drives one rank.

    ``part``/``parts``: this rank's slice of each global batch. ``replicated``: every rank holds
    the same parameters, so rank 0 alone checkpoints and evaluates. ``state``/``load_state``
    extend checkpoints with strategy state (e.g. error-feedback residuals).
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    step_fn: StepFn | None = None
    part: int = 0
    parts: int = 1
    replicated: bool = True
    state: Callable[[], dict[str, Any]] | None = None
    load_state: Callable[[dict[str, Any]], None] | None = None
    eval_model: nn.Module | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    own_step: OwnStep | None = None
    after_update: Callable[[int, float], None] | None = None
    samples_at: Callable[[int], int] | None = None
    save: Callable[[int], None] | None = None
    restore: Callable[[], int] | None = None
    quiesce: bool = False
    evaluate: Callable[[], dict[str, float]] | None = None
    evaluates: bool | None = None
    final_eval: bool | None = None
    reports: bool = True

    def __post_init__(self) -> None:
        if (self.step_fn is None) == (self.own_step is None):
            raise ValueError("a LoopSpec needs exactly one of step_fn and own_step")


def plain_step(job: Job, ctx: RankContext, forward: Callable[[torch.Tensor], torch.Tensor],
               optimizer: torch.optim.Optimizer,
               before_update: Callable[[], None] | None = None) -> StepFn:
    """The ordinary step (zero grads, forward, backward, update) with timeline spans.

    ``forward`` is the model, or a wrapper around it (e.g. DDP, a tensor-parallel model) whose
    forward/backward communicates; ``before_update`` runs between backward and the update (e.g.
    a data-parallel gradient all-reduce).
    """
    rec = ctx.recorder
    skip_nonfinite = job.config.on_nonfinite == "skip"

    def step(i: int, x: torch.Tensor, y: torch.Tensor) -> float:
        x, y = x.to(ctx.device), y.to(ctx.device)
        optimizer.zero_grad(set_to_none=True)
        with rec.span("forward", step=i):
            loss = job.forward_loss(forward, x, y)
        with rec.span("backward", step=i):
            loss.backward()
        if before_update is not None:
            before_update()
        if skip_nonfinite and not all_finite(p.grad for g in optimizer.param_groups for p in g["params"]):
            optimizer.zero_grad(set_to_none=True)  # --on-nonfinite skip: no update this step
            rec.emit("skipped", step=i, reason="non-finite gradient")
            return float(loss.detach())
        with rec.span("optimizer", step=i):
            optimizer.step()
        return float(loss.detach())

    return step


def _snapshot(spec: LoopSpec, step: int) -> dict[str, Any]:
    state: dict[str, Any] = {
        "step": torch.tensor(step),
        "model": spec.model.state_dict(),
        "rng": torch.get_rng_state(),
    }
    if spec.optimizer is not None:
        state["optimizer"] = spec.optimizer.state_dict()
    if spec.state is not None:
        state["strategy"] = spec.state()
    return state


def save_checkpoint(job: Job, ctx: RankContext, spec: LoopSpec, step: int) -> None:
    """Collective: every rank calls it; replicated jobs are written by rank 0 alone.

    Every rank's events up to ``step`` reach its file before the checkpoint is committed, so a
    rank killed after the commit has lost no step that the resumed run will not run again."""
    ctx.recorder.flush()
    if spec.quiesce:
        ctx.comm.barrier()  # every rank's writes of this step are in
    if not spec.replicated or ctx.is_leader:
        ctx.checkpoints.write_rank(step, ctx.rank, _snapshot(spec, step))
    ctx.comm.barrier()  # every rank's file and events of ``step`` are written
    if ctx.is_leader:
        commit_checkpoint(job, ctx, step)


def commit_checkpoint(job: Job, ctx: RankContext, step: int) -> None:
    """Rank 0, once every rank's file of ``step`` is written: seal it and say so."""
    path = ctx.checkpoints.commit(step, keep=job.config.keep_checkpoints)
    ctx.recorder.emit("checkpoint", step=step, path=str(path.relative_to(ctx.run_dir)))


def newest_checkpoint(ctx: RankContext) -> Path:
    """The newest good checkpoint directory (refused newer ones are noted in the metrics)."""
    ckpt, warnings = ctx.checkpoints.find_good()
    for w in warnings:
        ctx.recorder.emit("note", text=f"warning: {w}; using {ckpt.name}")
    ctx.recorder.rewind(CheckpointStore.step_of(ckpt), CheckpointStore.time_of(ckpt))  # no step twice
    return ckpt


def restore_checkpoint(ctx: RankContext, spec: LoopSpec) -> int:
    """Load the newest good checkpoint into the model and optimizer; returns its step."""
    ckpt = newest_checkpoint(ctx)
    state = CheckpointStore.load_rank(ckpt, 0 if spec.replicated else ctx.rank)
    spec.model.load_state_dict(state["model"])
    if spec.optimizer is not None:
        spec.optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"])
    if spec.load_state is not None and "strategy" in state:
        spec.load_state(state["strategy"])
    return int(state["step"])


def _stepper(job: Job, ctx: RankContext, spec: LoopSpec) -> OwnStep:
    """The step to run: the strategy's own, or ``step_fn`` on this rank's part of the batch."""
    if spec.own_step is not None:
        return spec.own_step
    step_fn, batches = spec.step_fn, job.batches()
    assert step_fn is not None

    def step(i: int) -> float:
        x, y = batches.shard(i, spec.part, spec.parts)
        t_step = time.perf_counter()
        loss = step_fn(i, x, y)
        ctx.straggle(time.perf_counter() - t_step)
        return loss

    return step


def run_loop(job: Job, ctx: RankContext, spec: LoopSpec) -> RankResult:
    """Run steps ``start+1 .. job.steps`` and return this rank's result."""
    cfg = job.config
    if ctx.resume:
        start = spec.restore() if spec.restore is not None else restore_checkpoint(ctx, spec)
    else:
        start = 0
    run_step = _stepper(job, ctx, spec)
    samples_at = spec.samples_at or (lambda s: s * job.batch_size)
    ctx.comm.barrier()
    ctx.recorder.start_clock()
    ctx.recorder.emit("start", first_step=start + 1, steps=job.steps)
    rank_mark(ctx.run_dir, ctx.rank, "loop starts (after the start barrier)")
    t0 = time.perf_counter()
    loss = float("nan")
    evaluates = spec.evaluates if spec.evaluates is not None else ctx.is_leader or not spec.replicated
    eval_model = spec.eval_model or spec.model
    evaluate = spec.evaluate or (lambda: job.evaluate(eval_model))
    last = start
    watch = FiniteWatch(spec.model, skipping=cfg.on_nonfinite == "skip", snapshot=spec.quiesce,
                        has_loss=spec.reports, start=start)
    for step in range(start + 1, job.steps + 1):
        loss = run_step(step)
        if spec.after_update is not None:
            spec.after_update(step, loss)
        stop = step < job.steps and interrupt.stop_after(step, job.steps)  # SIGTERM / Ctrl-C
        saves = bool(cfg.checkpoint_every) and (step % cfg.checkpoint_every == 0 or stop)
        evals = bool(cfg.eval_every) and step % cfg.eval_every == 0
        # before the step is recorded or checkpointed: a checkpoint is always a good state
        watch.after_step(step, loss, must=saves or evals or stop or step == job.steps)
        if spec.reports:
            ctx.recorder.step(step, loss, samples=samples_at(step))
        ctx.recorder.sample_resources(step=step)
        if ctx.progress is not None:
            ctx.progress.update(step, loss)
        if step == start + 1:
            rank_mark(ctx.run_dir, ctx.rank, "first step done")
        last = step
        if saves:
            if spec.save is not None:
                ctx.recorder.flush()  # this rank's steps are in its file before the commit
                spec.save(step)
            else:
                save_checkpoint(job, ctx, spec, step)
        if stop:
            ctx.recorder.emit("interrupted", step=step, signal=interrupt.signal_name())
            break
        if cfg.eval_every and step % cfg.eval_every == 0 and step < job.steps and evaluates:
            ctx.recorder.emit("eval", step=step, **evaluate())
    wall = time.perf_counter() - t0
    result = RankResult(steps=last - start, samples=samples_at(last) - samples_at(start),
                        wall_s=wall, final_loss=loss if spec.reports else None,
                        strategy_metrics=dict(spec.metrics))
    if last < job.steps:  # stopped on request: the checkpoint holds the model
        return result
    if evaluates if spec.final_eval is None else spec.final_eval:
        result.eval = evaluate()
        ctx.recorder.emit("eval", step=job.steps, **result.eval)
        result.model_state = {k: v.detach().clone() for k, v in spec.model.state_dict().items()}
    return result
