"""The pipeline training shell: set up one stage, run segments of a schedule, checkpoint, evaluate.

Every rank builds the full model (same seed, same initial weights as ``single``), derives the
partition (``auto``/``time`` are decided on rank 0 from a measured profile and broadcast, so all
ranks agree), keeps its stage's slice and drops the rest; rank 0 keeps the full model, into which
it gathers every stage's weights for evaluation and the final ``model.pt``.

Segments. gpipe/1f1b run one segment per step: M micro-batches, then the flush (one optimizer
step). pipedream/spectrain run a stream: one segment spans the steps up to the next checkpoint,
evaluation or the end; inside it every stage updates after every backward, and at its end the
pipeline drains, so checkpoints are consistent across stages without any extra protocol.
A stop request (SIGTERM, Ctrl-C) ends a stream early: the input stage admits no mini-batch after
the step it proposes (`interrupt.propose`), sends STOP in place of the next activation, each
stage passes it on and drains what was admitted — the truncated order is the order of the
shorter stream — and pads the receives its neighbours had posted ahead; then every stage is at
that step, as at a segment's end, and checkpoints there.

Evaluation gathers the model on rank 0 and runs the test set there (one process; the run's
stage-to-stage traffic is unchanged). A model too large for one process would need a pipelined
forward instead; that is not built.

Replicated stages (``--set partition=3x2,5`` with gpipe/1f1b): stage s with R replicas runs on R
ranks, which take the micro-batches in turn and sum their gradients at the flush, so the run still
equals ``single``. Ranks are numbered stage by stage (`Partition.stage_of_rank`).

Heap. Each rank keeps freed memory in its heap (`heap.keep_heap`, ``--set heap=system`` to leave
glibc's defaults): a stage frees and reallocates the same large tensors every micro-batch, and
with the defaults they page-fault in again each time.

Garbage collector. Python's collector runs when allocations cross its thresholds, wherever that
happens to be; a full collection walks every object the rank holds (measured: 120 ms each, two per
run, on the bubble model), a young one ~0.1–1 ms. Inside a mini-batch that pause stalls one stage
and every stage waiting on it. So the objects built at setup are frozen (`gc.freeze`: never
scanned again), and automatic collection is off while a flush segment runs; it is back on at the
flush, where the allocations of the segment trigger it outside the pipeline's window. Reference
counting frees a segment's tensors and graphs as always; only cyclic garbage waits for the flush.

Each stage reports the same per-step loss (it travels with the gradients, see `activations_wire`), so the
``step`` events of every rank agree, as for data-parallel strategies.
"""

from __future__ import annotations

import gc
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from polytrain.comm import GroupComm, new_groups
from polytrain.errors import ConfigError
from polytrain.models.boundaries import boundary_metas
from polytrain.models.partition import Partition, cut
from polytrain.runtime import interrupt
from polytrain.runtime.batches import GlobalBatches
from polytrain.runtime.divergence import DivergenceWatch, check_finite, check_param_bound
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.loop import LoopSpec, restore_checkpoint, save_checkpoint
from polytrain.runtime.precision import SKIPPED, Precision
from polytrain.schedules.actions import Action
from polytrain.schedules.checks import dry_run, validate
from polytrain.schedules.registry import Orders, stage_orders
from polytrain.strategies.pipeline.activations_wire import recv_state, send_state
from polytrain.strategies.pipeline.executor import StageExecutor, StageSpec, Window
from polytrain.strategies.pipeline.heap import keep_heap
from polytrain.strategies.pipeline.metrics import summarise
from polytrain.strategies.pipeline.options import PipelineOptions
from polytrain.strategies.pipeline.planning import resolve_partition
from polytrain.strategies.pipeline.ties import TiedGrads, check_no_replicated_ties, find_ties
from polytrain.strategies.pipeline.weights import FlushWeights

MakeWeights = Callable[[nn.Module, torch.optim.Optimizer, int], FlushWeights]


@dataclass(frozen=True)
class RunPlan:
    """What a pipeline strategy asks of the shell."""

    strategy: str
    schedule: str  # a registered schedule (schedule.SCHEDULES)
    per_step: int  # micro-batches per step: M for gpipe/1f1b, 1 for a stream of mini-batches
    stream: bool  # no flush: a segment spans several steps, updates after every backward
    make_weights: MakeWeights
    checkpoint: str = "never"
    trace_versions: bool = False
    extra: tuple[tuple[str, Any], ...] = ()  # strategy options to report in strategy_metrics


class BatchFeed:
    """Micro-batch index of a segment -> its step and its slice of that step's global batch."""

    def __init__(self, batches: GlobalBatches, steps: list[int], per_step: int, device: torch.device) -> None:
        self.batches, self.steps, self.per_step, self.device = batches, steps, per_step, device
        self._cache: dict[int, tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]] = {}

    def step(self, mb: int) -> int:
        return self.steps[mb // self.per_step]

    def _parts(self, mb: int) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        step = self.step(mb)
        if step not in self._cache:
            x, y = self.batches.shard(step)  # the whole global batch (B, ...); chunks of B/M
            self._cache = {step: (x.chunk(self.per_step), y.chunk(self.per_step))}
        return self._cache[step]

    def inputs(self, mb: int) -> torch.Tensor:
        return self._parts(mb)[0][mb % self.per_step].to(self.device)

    def target(self, mb: int) -> torch.Tensor:
        return self._parts(mb)[1][mb % self.per_step].to(self.device)


@dataclass
class Stage:
    """One rank's part: its stage and replica, slice, and (rank 0 only) the full model.

    ``group``: the communicator of this stage's replicas (None when the stage has one rank).
    """

    partition: Partition
    stage: int
    replica: int
    module: nn.Sequential
    full: nn.Sequential | None
    spec: StageSpec
    plan_info: dict[str, Any]
    group: GroupComm | None = None
    tied: TiedGrads | None = None  # parameters shared with other stages (see ties.py)


def setup_stage(job: Job, ctx: RankContext, opts: PipelineOptions, plan: RunPlan) -> Stage:
    model = job.build_model().to(ctx.device)
    x, _ = job.batches().shard(1)
    sample = x[: job.batch_size // plan.per_step].to(ctx.device)  # one unit of work: (b, ...)
    partition, info = resolve_partition(opts, model, ctx, sample, plan.strategy)
    metas = boundary_metas(model, sample)
    bounds = partition.bounds
    for _, end in bounds[:-1]:
        if not metas[end - 1].dtype.is_floating_point:
            raise ConfigError(
                f"Partition {partition} cuts after layer {end - 1}, whose output is "
                f"{metas[end - 1].dtype} {list(metas[end - 1].shape)}. Rule: a cut must carry a "
                "floating-point tensor (its gradient flows back). Fix: move the cut later."
            )
    stage, replica = partition.stage_of_rank(ctx.rank)
    pieces = cut(model, partition)
    module = pieces[stage]
    last = partition.stages - 1
    group = None
    if partition.ranks > partition.stages:  # collective: every rank creates every stage's group
        group = new_groups(ctx.comm, [partition.stage_ranks(s) for s in range(partition.stages)])
        group = group if group.world > 1 else None
    ties = find_ties(model, pieces)
    if ties and plan.stream:  # check_pipeline refuses this before launch; a factory it could not build
        raise ConfigError(f"'{plan.strategy}' cannot keep weights tied across stages: "
                          f"{'; '.join(' = '.join(t.names) for t in ties)}. Fix: --strategy gpipe or 1f1b.")
    check_no_replicated_ties(ties, partition.replicas)
    tied = TiedGrads(ctx.comm, module, ties, [[partition.stage_ranks(s)[0] for s in range(partition.stages)]],
                     stage) if ties else None
    spec = StageSpec(
        stage=stage,
        stages=partition.stages,
        module=module,
        prev_ranks=tuple(partition.stage_ranks(stage - 1)) if stage > 0 else (),
        next_ranks=tuple(partition.stage_ranks(stage + 1)) if stage < last else (),
        in_meta=metas[bounds[stage][0] - 1] if stage > 0 else None,
        out_meta=metas[bounds[stage][1] - 1] if stage < last else None,
        checkpoint=plan.checkpoint,
        loss_scale=1.0 / plan.per_step,
        trace_versions=plan.trace_versions,
        record_ops=not plan.stream,
    )
    return Stage(partition, stage, replica, module, model if ctx.is_leader else None, spec, info, group,
                 tied)


def _segments(first: int, steps: int, plan: RunPlan, job: Job) -> Iterator[list[int]]:
    """Steps grouped into segments (see the module docstring)."""
    cfg, current = job.config, []
    for k in range(first, steps + 1):
        current.append(k)
        boundary = k == steps or any(
            every and k % every == 0 for every in (cfg.checkpoint_every, cfg.eval_every)
        )
        if not plan.stream or boundary:
            yield current
            current = []


def gather_model(ctx: RankContext, stage: Stage) -> None:
    """Collective: every stage's weights into rank 0's full model (from each stage's replica 0;
    replicas hold identical weights)."""
    part = stage.partition
    if stage.full is None:
        if stage.replica == 0:
            send_state(ctx.comm, stage.module.state_dict(), 0)
        return
    slices, state = cut(stage.full, part), stage.full.state_dict()
    for s in range(1, part.stages):
        recv_state(ctx.comm, state, list(slices[s].state_dict()), src=part.stage_ranks(s)[0])


@contextmanager
def _collector_paused(pause: bool) -> Iterator[None]:
    """Automatic garbage collection off inside the block (when ``pause`` and it was on)."""
    was = gc.isenabled()
    if pause and was:
        gc.disable()
    try:
        yield
    finally:
        if pause and was:
            gc.enable()


class PipelineRun:
    """One rank of a pipeline job (see the module docstring)."""

    def __init__(self, job: Job, ctx: RankContext, opts: PipelineOptions, plan: RunPlan) -> None:
        self.job, self.ctx, self.opts, self.plan = job, ctx, opts, plan
        self.heap_kept = opts.heap == "keep" and keep_heap()  # before the stage allocates anything
        self.stage = setup_stage(job, ctx, opts, plan)
        self.optimizer = job.make_optimizer(self.stage.module.parameters())
        self.weights = plan.make_weights(self.stage.module, self.optimizer, self.stage.stage)
        self.weights.replicas = self.stage.group
        self.weights.tied = self.stage.tied
        if not plan.stream:  # one update per flush (gpipe, 1f1b): clip the whole gradient there
            replicas = len(self.stage.partition.stage_ranks(self.stage.stage))
            self.weights.clip_by(job.config.clip_grad_norm, ctx.comm, replicas)
            self.weights.mixed(Precision(job.config.precision, ctx.device), ctx.comm)
        self.executor = StageExecutor(job, ctx, self.stage.spec, self.weights)
        self.windows: list[Window] = []
        self.loss = float("nan")
        self._orders: dict[int, Orders] = {}
        self.watch = DivergenceWatch(job.config, ctx.recorder.earlier_losses)
        self.loop = LoopSpec(
            model=self.stage.module,
            optimizer=self.optimizer,
            step_fn=lambda *_: float("nan"),  # unused: this shell drives the steps
            replicated=False,
            state=self.weights.state,
            load_state=self.weights.load_state,
            precision=self.weights.amp,  # its scaler's state in the checkpoint
        )

    def orders(self, units: int) -> Orders:
        """The schedule for ``units`` micro-batches, validated and dry-run once per size.

        A replicated stage's replicas take its micro-batches in turn (m mod R): each runs the
        stage's order restricted to its own micro-batches. Restriction keeps every order's
        sequence, so the schedule's deadlock-free execution, restricted, is one of the replicas'.
        """
        if units not in self._orders:
            orders = stage_orders(self.plan.schedule, self.stage.partition.stages, units)
            validate(orders, self.stage.partition.stages, units)
            dry_run(orders)
            self._orders[units] = orders
        return self._orders[units]

    def my_order(self, units: int) -> list[Action]:
        st = self.stage
        reps = st.partition.replicas[st.stage]
        return [a for a in self.orders(units)[st.stage] if a.microbatch % reps == st.replica]

    def run(self) -> RankResult:
        job, ctx = self.job, self.ctx
        start = restore_checkpoint(ctx, self.loop) if ctx.resume else 0
        batches = job.batches()
        gc.collect()
        gc.freeze()  # setup's objects: never scanned again (see the module docstring)
        ctx.comm.barrier()
        ctx.recorder.start_clock()
        ctx.recorder.emit("start", first_step=start + 1, steps=job.steps, losses=True)
        t0 = time.perf_counter()
        last = start
        for steps in _segments(start + 1, job.steps, self.plan, job):
            self._segment(steps, batches)
            left_out = self.executor.stopped  # a stream stopped early: every stage drained before it
            if left_out is not None:
                last, stop = steps[left_out - 1], True
                interrupt.propose(last)  # the input stage's step, which every stage now knows
            else:
                last = steps[-1]
                stop = last < job.steps and interrupt.stop_after(last, job.steps)  # SIGTERM / Ctrl-C
            self._boundary(last, stop)
            if stop:
                ctx.recorder.emit("interrupted", step=last, signal=interrupt.signal_name())
                break
        wall = time.perf_counter() - t0
        done = last - start
        result = RankResult(steps=done, samples=done * job.batch_size, wall_s=wall, final_loss=self.loss)
        result.strategy_metrics = {**self._metrics(), **self.weights.amp.metrics()}
        if last == job.steps:
            check_param_bound(last, self.stage.module, job.config.max_param,
                              job.config.divergence_window)
        gather_model(ctx, self.stage)
        if self.stage.full is not None and last == job.steps:  # else stopped: see the checkpoint
            result.eval = job.evaluate(self.stage.full)
            ctx.recorder.emit("eval", step=job.steps, **result.eval)
            result.model_state = {k: v.detach().clone() for k, v in self.stage.full.state_dict().items()}
        return result

    def _segment(self, steps: list[int], batches: GlobalBatches) -> None:
        per_step = self.plan.per_step
        feed = BatchFeed(batches, steps, per_step, self.ctx.device)
        order = self.my_order(len(steps) * per_step)
        losses: dict[int, list[float]] = defaultdict(list)

        def done(mb: int, loss: float) -> None:
            step = feed.step(mb)
            if self.plan.stream:  # an update follows every backward: the step is complete
                self._finish_step(step, loss)
            else:
                losses[step].append(loss)

        def stop(mb: int) -> bool:
            """The input stage of a stream, before admitting ``mb``: stop here on request?"""
            return interrupt.requested() and feed.step(mb) > interrupt.propose(feed.step(mb - 1))

        one_rank_each = self.stage.partition.ranks == self.stage.partition.stages
        early = stop if self.plan.stream and one_rank_each else None
        with _collector_paused(not self.plan.stream):
            self.windows.append(self.executor.run(order, feed, done, early))
        if not self.plan.stream:
            with self.ctx.recorder.span("optimizer", stage=self.stage.stage, step=steps[0]):
                if not self.weights.end_segment():  # on every stage alike (agreed overflow)
                    self.ctx.recorder.emit("skipped", step=steps[0], reason=SKIPPED)
            total = sum(losses[steps[0]])
            if self.stage.group is not None:  # each replica saw its own micro-batches' losses
                t = torch.tensor([total], dtype=torch.float64)
                self.stage.group.all_reduce(t, op="replica_loss")
                total = float(t)
            self._finish_step(steps[0], total / per_step)

    def _finish_step(self, step: int, loss: float) -> None:
        # every stage has this step's loss (it travels with the gradients), so every stage sees
        # a divergence at the same step; a finite blow-up included (runtime/divergence.py)
        check_finite(step, loss, self.stage.module)
        if self.watch.observe(step, loss) == "warn":
            self.ctx.recorder.emit("divergence", step=step, loss=loss, bound=self.watch.bound(),
                                   text=f"warning: loss {loss:.4g} above the divergence bound")
        self.loss = loss
        self.ctx.recorder.step(step, loss, samples=step * self.job.batch_size)
        self.ctx.recorder.sample_resources(step=step, outstanding_sends=self.executor.outbox.outstanding)
        if self.ctx.progress is not None:
            self.ctx.progress.update(step, loss)

    def _boundary(self, step: int, stop: bool = False) -> None:
        cfg, ctx = self.job.config, self.ctx
        if cfg.checkpoint_every and (step % cfg.checkpoint_every == 0 or stop):
            check_param_bound(step, self.stage.module, cfg.max_param, cfg.divergence_window)
            save_checkpoint(self.job, ctx, self.loop, step)
        if stop:
            return
        if cfg.eval_every and step % cfg.eval_every == 0 and step < self.job.steps:
            gather_model(ctx, self.stage)
            if self.stage.full is not None:
                ctx.recorder.emit("eval", step=step, **self.job.evaluate(self.stage.full))

    def _metrics(self) -> dict[str, Any]:
        """Collective: every stage's record gathered at rank 0, which summarises them."""
        module, stage = self.stage.module, self.stage.stage
        record: dict[str, Any] = {
            "stage": stage,
            "replica": self.stage.replica,
            "layers": [name for name, _ in module.named_children()],
            "windows": [w.to_json() for w in self.windows],
            "ops": [w.ops for w in self.windows] if not self.plan.stream else [],
            "busy_s": sum(w.busy for w in self.windows),
            **self.executor.metrics(),
            **self.weights.metrics(),
        }
        records = self.ctx.comm.gather_json(record)
        if records is None:  # rank 0 reports for every stage (its lists are indexed by stage)
            return {}
        head = {
            "schedule": self.plan.schedule,
            "flush": not self.plan.stream,
            "stages": self.stage.partition.stages,
            "microbatches": self.plan.per_step,
            "partition": self.stage.partition.to_json(),
            "partition_option": self.opts.partition,
            "checkpoint": self.plan.checkpoint,
            "heap": "keep" if self.heap_kept else "system",
            **dict(self.plan.extra),
            **self.stage.plan_info,
        }
        return summarise(records, head)
