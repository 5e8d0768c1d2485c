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
from polytrain.runtime.accumulate import accumulate
from polytrain.runtime.checkpoint import CheckpointStore
from polytrain.runtime.clip import GradSplit, clip_grad_norm, unique
from polytrain.runtime.divergence import (
    DivergenceWatch,
    FiniteWatch,
    all_finite,
    check_param_bound,
)
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.precision import SKIPPED, Precision
from polytrain.runtime.schedule import updates_taken
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
    precision: Precision | None = None  # default: plain_step's

    def __post_init__(self) -> None:
        if (self.step_fn is None) == (self.own_step is None):
            raise ValueError("a LoopSpec needs exactly one of step_fn and own_step")
        if self.precision is None:
            self.precision = getattr(self.step_fn, "precision", None)


def plain_step(job: Job, ctx: RankContext, forward: Callable[[torch.Tensor], torch.Tensor],
               optimizer: torch.optim.Optimizer,
               before_update: Callable[[], None] | None = None,
               split: GradSplit | None = None) -> StepFn:
    """The ordinary step (zero grads, forward, backward, update) with timeline spans.

    ``forward`` is the model, or a wrapper around it (e.g. DDP, a tensor-parallel model) whose
    forward/backward communicates; ``before_update`` runs between backward and the update (e.g.
    a data-parallel gradient all-reduce). ``split``: how this rank's gradients make up the
    model's, for ``--clip-grad-norm`` (None: this rank holds the whole gradient). The step
    carries its :class:`Precision` (``step.precision``) for the loop's checkpoints and metrics.
    """
    rec, cfg = ctx.recorder, job.config
    amp = Precision(cfg.precision, ctx.device)
    skip_nonfinite = cfg.on_nonfinite == "skip" and amp.scaler is None  # a scaler skips itself
    params = unique(p for g in optimizer.param_groups for p in g["params"])
    watch = DivergenceWatch(cfg, rec.earlier_losses) if cfg.on_divergence == "skip" else None

    def step(i: int, x: torch.Tensor, y: torch.Tensor) -> float:
        x, y = x.to(ctx.device), y.to(ctx.device)
        optimizer.zero_grad(set_to_none=True)

        def loss_of(f: Any, xm: torch.Tensor, ym: torch.Tensor) -> torch.Tensor:
            with rec.span("forward", step=i), amp.autocast():
                return job.forward_loss(f, xm, ym)

        def backward(loss: torch.Tensor) -> None:
            with rec.span("backward", step=i):
                amp.backward(loss)

        loss = accumulate(forward, x, y, cfg.grad_accum, loss_of, backward)
        if before_update is not None:
            before_update()
        amp.unscale(optimizer, split.comm if split is not None else None)  # ranks agree on overflow
        if cfg.clip_grad_norm is not None:
            clip_grad_norm(params, cfg.clip_grad_norm, split)
        if skip_nonfinite and not all_finite(p.grad for p in params):
            optimizer.zero_grad(set_to_none=True)  # --on-nonfinite skip: no update this step
            rec.emit("skipped", step=i, reason="non-finite gradient")
            return loss
        if watch is not None and _divergent_anywhere(ctx, watch, loss):
            optimizer.zero_grad(set_to_none=True)  # --on-divergence skip: a loss spike's update
            rec.emit("skipped", step=i, reason="loss above the divergence bound")
            return loss
        with rec.span("optimizer", step=i):
            if not amp.step(optimizer):
                rec.emit("skipped", step=i, reason=SKIPPED)
        return loss

    step.precision = amp  # type: ignore[attr-defined]
    return step


def _divergent_anywhere(ctx: RankContext, watch: DivergenceWatch, loss: float) -> bool:
    """Whether any rank's loss is over its bound (one 4-byte all-reduce, only under
    --on-divergence skip): every rank then skips the same update, so replicas stay equal."""
    over = watch.over(loss)
    if ctx.world > 1:
        flag = torch.tensor([1.0 if over else 0.0])
        ctx.comm.all_reduce(flag, op="divergence")
        over = bool(flag.item() > 0)
    if not over:
        watch.accept(loss)
    return over


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
    if spec.precision is not None and spec.precision.state():
        state["precision"] = spec.precision.state()
    return state


def save_checkpoint(job: Job, ctx: RankContext, spec: LoopSpec, step: int) -> None:
    """Collective: every rank calls it; replicated jobs are written by rank 0 alone.

    Every rank's events up to ``step`` reach its file before the checkpoint is committed, so a
    rank killed after the commit has lost no step that the resumed run will not run again."""
    ctx.recorder.tally(step, ctx.comm.bytes_sent)
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
    path = ctx.checkpoints.commit(step, keep=job.config.keep_checkpoints,
                                  window=job.config.divergence_window)
    ctx.recorder.emit("checkpoint", step=step, path=str(path.relative_to(ctx.run_dir)))


def commit_with_model(job: Job, ctx: RankContext, step: int, full: dict[str, torch.Tensor] | None) -> None:
    """Rank 0 writes the consolidated model ``full`` beside the ranks' files of ``step`` (whole,
    then renamed), every rank waits until every file is written, and rank 0 commits the step."""
    if ctx.is_leader:
        assert full is not None
        path = ctx.checkpoints.stage(step) / "model.pt"
        torch.save(full, path.with_suffix(".part"))
        path.with_suffix(".part").rename(path)
    ctx.comm.barrier()  # every rank's file is written
    if ctx.is_leader:
        commit_checkpoint(job, ctx, step)


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
    if spec.precision is not None and "precision" in state:
        spec.precision.load_state(state["precision"])
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


def _metrics(spec: LoopSpec) -> dict[str, Any]:
    """The strategy's metrics, the precision's (fp16: skipped steps, loss scale) and the
    schedule's (updates its optimizer counted: whose steps the schedule followed)."""
    out = dict(spec.metrics)
    if spec.precision is not None:
        out.update(spec.precision.metrics())
    if spec.optimizer is not None and updates_taken(spec.optimizer):
        out["lr_schedule"] = {"updates": updates_taken(spec.optimizer),
                              "last_lr": spec.optimizer.param_groups[0]["lr"]}
    return out


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
    ctx.recorder.emit("start", first_step=start + 1, steps=job.steps, losses=True)
    rank_mark(ctx.run_dir, ctx.rank, "loop starts (after the start barrier)")
    t0 = time.perf_counter()
    loss = float("nan")
    evaluates = spec.evaluates if spec.evaluates is not None else ctx.is_leader or not spec.replicated
    eval_model = spec.eval_model or spec.model
    evaluate = spec.evaluate or (lambda: job.evaluate(eval_model))
    last = start
    watch = DivergenceWatch(cfg, ctx.recorder.earlier_losses) if spec.reports else None
    finite = FiniteWatch(spec.model, skipping=cfg.on_nonfinite == "skip", snapshot=spec.quiesce,
                         has_loss=spec.reports, start=start)
    for step in range(start + 1, job.steps + 1):
        loss = run_step(step)
        if spec.after_update is not None:
            spec.after_update(step, loss)
        stop = step < job.steps and interrupt.stop_after(step, job.steps)  # SIGTERM / Ctrl-C
        saves = bool(cfg.checkpoint_every) and (step % cfg.checkpoint_every == 0 or stop)
        evals = bool(cfg.eval_every) and step % cfg.eval_every == 0
        # before the step is recorded or checkpointed: a checkpoint is always a good state
        finite.after_step(step, loss, must=saves or evals or stop or step == job.steps)
        if watch is not None and watch.observe(step, loss) == "warn":
            ctx.recorder.emit("divergence", step=step, loss=loss, bound=watch.bound(),
                              text=f"warning: loss {loss:.4g} above the divergence bound")
        if spec.reports:
            ctx.recorder.step(step, loss, samples=samples_at(step))
        ctx.recorder.sample_resources(step=step)
        if ctx.progress is not None:
            ctx.progress.update(step, loss)
        if step == start + 1:
            rank_mark(ctx.run_dir, ctx.rank, "first step done")
        last = step
        if saves:
            check_param_bound(step, spec.model, cfg.max_param, cfg.divergence_window)
            if spec.save is not None:
                ctx.recorder.tally(step, ctx.comm.bytes_sent)
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
                        strategy_metrics=_metrics(spec))
    if last < job.steps:  # stopped on request: the checkpoint holds the model
        return result
    check_param_bound(last, spec.model, cfg.max_param, cfg.divergence_window)
    if evaluates if spec.final_eval is None else spec.final_eval:
        result.eval = evaluate()
        ctx.recorder.emit("eval", step=job.steps, **result.eval)
        result.model_state = {k: v.detach().clone() for k, v in spec.model.state_dict().items()}
    return result
