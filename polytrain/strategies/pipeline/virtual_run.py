"""Virtual stages: one rank runs V model chunks of a P·V-chunk pipeline, on the one executor.

The model is cut into C = P·V chunks (``--set virtual_stages=V``; ``partition=uniform`` needs V·P
to divide the layers, or give C layer counts); rank r keeps the chunks the schedule places on it
(`schedule_virtual.chunk_rank`) and runs one `StageExecutor` per chunk, dispatching each action
of its order to the chunk it names. So F, B and W of a chunk are exactly those of a one-chunk stage.

Channels. Messages between two ranks travel on one FIFO stream per process group, and two chunks
of a rank may talk to the same neighbour rank (interleaving: every chunk boundary r → r+1); the
receiver would have to post its receives in the sender's global order. Instead every chunk
boundary c → c+1 gets its own two-rank process group, hence its own stream, and each chunk's
executor keeps today's FIFO channels on it. A boundary inside one rank (the turn of a V at rank
P−1) is a `LocalComm`: the message is a tensor handed over in memory.

Each chunk has its own optimizer over its own parameters: the optimizers polytrain runs update
each tensor from its own gradient, so C optimizers step exactly as one over the whole model. Not
built here: checkpoints/resume, replicated stages and weights tied across chunks (refused before
launch), and the per-action replay of the bubble (``bubble_fraction_schedule``) — the measured
bubble over the rank's compute windows is reported.
"""

from __future__ import annotations

import gc
import time
from collections import deque
from typing import Any

import torch
import torch.distributed as dist

from polytrain.comm import Comm, GroupComm
from polytrain.plan.partition import Partition, cut, layers_of, uniform
from polytrain.plan.profile import boundary_metas
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.strategies.pipeline.activations_wire import recv_state, send_state
from polytrain.strategies.pipeline.executor import StageExecutor, StageSpec
from polytrain.strategies.pipeline.heap import keep_heap
from polytrain.strategies.pipeline.meter import MemoryMeter, Window
from polytrain.strategies.pipeline.metrics import summarise
from polytrain.strategies.pipeline.options import FlushOptions
from polytrain.strategies.pipeline.schedule import get_schedule, stage_orders
from polytrain.strategies.pipeline.schedule_virtual import chunk_rank
from polytrain.strategies.pipeline.shell import BatchFeed, _collector_paused
from polytrain.strategies.pipeline.weights import FlushWeights


class _Done:
    def wait(self) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


class _LocalRecv:
    def __init__(self, comm: LocalComm, buf: torch.Tensor) -> None:
        self.comm, self.buf, self.done = comm, buf, False

    def wait(self) -> bool:
        if not self.done:  # the matching send ran earlier on this rank (the order says so)
            self.buf.copy_(self.comm.queue.popleft())
            self.done = True
        return True

    def is_completed(self) -> bool:
        return self.done


class LocalComm(Comm):
    """A chunk boundary inside one rank: sends queue a copy, receives take them in order."""

    def __init__(self, parent: Comm) -> None:
        super().__init__(0, 1, group=None, check=False)
        self.queue: deque[torch.Tensor] = deque()

    def isend(self, tensor: torch.Tensor, dst: int, op: str = "send") -> Any:
        self.queue.append(tensor.clone())
        return _Done()

    def irecv(self, tensor: torch.Tensor, src: int, op: str = "send") -> Any:
        return _LocalRecv(self, tensor)


def chunk_partition(opts: FlushOptions, layers: int, chunks: int) -> Partition:
    """``uniform``/``auto``: equal layer counts over the chunks; else the counts given."""
    if opts.partition in ("uniform", "auto"):
        return uniform(layers, chunks)
    return Partition.parse(opts.partition)


def boundary_comms(ctx: RankContext, homes: list[int]) -> dict[int, tuple[Comm, int, int]]:
    """Boundary c → c+1 -> (its communicator, the rank of chunk c in it, that of chunk c+1), for
    the boundaries this rank takes part in. Collective: every rank creates every group, in order."""
    out: dict[int, tuple[Comm, int, int]] = {}
    for c in range(len(homes) - 1):
        a, b = homes[c], homes[c + 1]
        if a == b:
            if ctx.rank == a:
                out[c] = (LocalComm(ctx.comm), 0, 0)
            continue
        members = sorted((a, b))
        group = dist.new_group(members)  # group ranks follow the sorted global ranks
        if ctx.rank in members:
            out[c] = (GroupComm(ctx.comm, members, group), members.index(a), members.index(b))
    return out


class VirtualRun:
    """One rank of a pipeline with V chunks per rank (see the module docstring)."""

    def __init__(self, job: Job, ctx: RankContext, opts: FlushOptions, schedule: str, virtual: int) -> None:
        self.job, self.ctx, self.opts, self.schedule = job, ctx, opts, schedule
        self.heap_kept = opts.heap == "keep" and keep_heap()  # before the chunks allocate anything
        spec, m = get_schedule(schedule), opts.microbatches
        ranks = ctx.world
        self.orders = stage_orders(schedule, ranks, m, virtual)
        self.chunks = ranks * virtual
        self.homes = [chunk_rank(c, ranks, spec.placement) for c in range(self.chunks)]
        model = job.build_model().to(ctx.device)
        x, _ = job.batches().shard(1)
        sample = x[: job.batch_size // m].to(ctx.device)
        metas = boundary_metas(model, sample)
        self.partition = chunk_partition(opts, len(layers_of(model)), self.chunks)
        bounds, pieces = self.partition.bounds, cut(model, self.partition)
        comms = boundary_comms(ctx, self.homes)
        self.mine = [c for c in range(self.chunks) if self.homes[c] == ctx.rank]
        self.meter = MemoryMeter()
        self.execs: dict[int, StageExecutor] = {}
        self.weights: dict[int, FlushWeights] = {}
        self.pieces = pieces
        for c in self.mine:
            back = comms.get(c - 1)
            fwd = comms.get(c)
            stage = StageSpec(
                stage=c, stages=self.chunks, module=pieces[c],
                prev_ranks=(back[1],) if back else (), next_ranks=(fwd[2],) if fwd else (),
                in_meta=metas[bounds[c][0] - 1] if c > 0 else None,
                out_meta=metas[bounds[c][1] - 1] if c < self.chunks - 1 else None,
                loss_scale=1.0 / m,
            )
            self.weights[c] = FlushWeights(pieces[c], job.make_optimizer(pieces[c].parameters()))
            pair = ((back or fwd or (ctx.comm,))[0], (fwd or back or (ctx.comm,))[0])
            self.execs[c] = StageExecutor(job, ctx, stage, self.weights[c], pair, self.meter)
        self.full = model if ctx.is_leader else None
        self.windows: list[Window] = []
        self.loss = float("nan")

    def run(self) -> RankResult:
        job, ctx = self.job, self.ctx
        batches = job.batches()
        gc.collect()
        gc.freeze()
        ctx.comm.barrier()
        ctx.recorder.start_clock()
        ctx.recorder.emit("start", first_step=1, steps=job.steps)
        t0 = time.perf_counter()
        for step in range(1, job.steps + 1):
            with _collector_paused(True):
                self._step(step, BatchFeed(batches, [step], self.opts.microbatches, ctx.device))
            if job.config.eval_every and step % job.config.eval_every == 0 and step < job.steps:
                self._gather()
                if self.full is not None:
                    ctx.recorder.emit("eval", step=step, **job.evaluate(self.full))
        wall = time.perf_counter() - t0
        result = RankResult(steps=job.steps, samples=job.steps * job.batch_size, wall_s=wall,
                            final_loss=self.loss)
        result.strategy_metrics = self._metrics()
        self._gather()
        if self.full is not None:
            result.eval = job.evaluate(self.full)
            ctx.recorder.emit("eval", step=job.steps, **result.eval)
            result.model_state = {k: v.detach().clone() for k, v in self.full.state_dict().items()}
        return result

    def _step(self, step: int, feed: BatchFeed) -> None:
        """One mini-batch: the rank's order, each action on its chunk's executor, then the flush."""
        losses: dict[int, float] = {}

        def done(mb: int, loss: float) -> None:
            losses[mb] = loss  # every chunk learns each micro-batch's loss; keep one per mb

        order = self.orders[self.ctx.rank]
        window = Window()
        for c, ex in self.execs.items():
            ex.begin([a for a in order if a.stage == c])
        for a in order:
            self.execs[a.stage].act(a, feed, window, done)
        for ex in self.execs.values():
            ex.end()
        self.windows.append(window)
        with self.ctx.recorder.span("optimizer", stage=self.mine[0], step=step):
            for w in self.weights.values():
                w.end_segment()
        self.loss = sum(losses.values()) / self.opts.microbatches
        self.ctx.recorder.step(step, self.loss, samples=step * self.job.batch_size)
        if self.ctx.progress is not None:
            self.ctx.progress.update(step, self.loss)

    def _gather(self) -> None:
        """Collective: every chunk's weights into rank 0's full model."""
        state = self.full.state_dict() if self.full is not None else None
        for c in range(self.chunks):
            home = self.homes[c]
            if home == 0:
                continue
            if self.ctx.rank == home:
                send_state(self.ctx.comm, self.pieces[c].state_dict(), 0)
            elif state is not None:
                recv_state(self.ctx.comm, state, list(self.pieces[c].state_dict()), src=home)

    def _metrics(self) -> dict[str, Any]:
        """Collective: each rank's record (its chunks as one lane) summarised at rank 0."""
        execs = list(self.execs.values())
        metrics = [ex.metrics() for ex in execs]
        record: dict[str, Any] = {
            "stage": self.ctx.rank,
            "replica": 0,
            "layers": [name for c in self.mine for name, _ in self.pieces[c].named_children()],
            "windows": [w.to_json() for w in self.windows],
            "ops": [],  # actions of several chunks: the per-stage replay does not apply
            "busy_s": sum(w.busy for w in self.windows),
            **metrics[0],
            "peak_outstanding_sends": max(m["peak_outstanding_sends"] for m in metrics),
        }
        records = self.ctx.comm.gather_json(record)
        if records is None:
            return {}
        head = {
            "schedule": self.schedule,
            "flush": True,
            "stages": self.ctx.world,
            "chunks": self.chunks,
            "virtual_stages": self.chunks // self.ctx.world,
            "chunks_of_rank": [[c for c in range(self.chunks) if self.homes[c] == r]
                               for r in range(self.ctx.world)],
            "microbatches": self.opts.microbatches,
            "partition": self.partition.to_json(),
        }
        return summarise(records, head)
