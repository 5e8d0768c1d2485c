"""The virtual-stage strategies' run: one pipeline of V chunks per rank over every rank.

The chunks, their channels and the dispatch of each action to its chunk are `chunks.ChunkPipeline`
(shared with ``mesh`` dp × pp); this shell adds the run's loop, evaluation on rank 0's gathered
model, checkpoints and the pipeline metrics: the measured bubble over the ranks' compute windows
and its replay (``bubble_fraction_schedule``: the same orders replayed with each action's measured
seconds, `metrics.schedule_bubble`).

Checkpoints. Every step ends in a flush (every chunk drained, one update), so the state at a step
boundary is each rank's chunks and optimizer state, nothing in flight: each rank writes its own
(``--checkpoint-every``), and a resumed run loads them and goes on with the next step's data, as
the uninterrupted run would; a weight tied across chunks is in each holding rank's file, equal
(`ties`). Not built here: replicated stages (refused before launch).
"""

from __future__ import annotations

import gc
import time
from typing import Any

from polytrain.runtime import interrupt
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.loop import LoopSpec, restore_checkpoint, save_checkpoint
from polytrain.strategies.pipeline.chunks import ChunkPipeline
from polytrain.strategies.pipeline.heap import keep_heap
from polytrain.strategies.pipeline.meter import Window
from polytrain.strategies.pipeline.metrics import summarise
from polytrain.strategies.pipeline.options import FlushOptions
from polytrain.strategies.pipeline.shell import BatchFeed, _collector_paused


class VirtualRun:
    """One rank of a pipeline with V chunks per rank (see the module docstring)."""

    def __init__(self, job: Job, ctx: RankContext, opts: FlushOptions, schedule: str, virtual: int) -> None:
        self.job, self.ctx, self.opts, self.schedule = job, ctx, opts, schedule
        self.heap_kept = opts.heap == "keep" and keep_heap()  # before the chunks allocate anything
        ranks = list(range(ctx.world))
        self.pipe = ChunkPipeline(job, ctx, ranks, ctx.comm, opts.partition, schedule, opts.microbatches,
                                  job.batch_size, virtual)
        self.windows: list[Window] = []
        self.loss = float("nan")
        self.loop = LoopSpec(model=self.pipe.module, optimizer=self.pipe.optimizer,
                             step_fn=lambda *_: float("nan"),  # unused: this shell drives the steps
                             replicated=False, state=self.pipe.weights.state,
                             load_state=self.pipe.weights.load_state)

    def run(self) -> RankResult:
        job, ctx, cfg = self.job, self.ctx, self.job.config
        start = restore_checkpoint(ctx, self.loop) if ctx.resume else 0
        batches = job.batches()
        gc.collect()
        gc.freeze()
        ctx.comm.barrier()
        ctx.recorder.start_clock()
        ctx.recorder.emit("start", first_step=start + 1, steps=job.steps)
        t0 = time.perf_counter()
        last = start
        for step in range(start + 1, job.steps + 1):
            with _collector_paused(True):
                self._step(step, BatchFeed(batches, [step], self.opts.microbatches, ctx.device))
            last = step
            stop = step < job.steps and interrupt.stop_after(step, job.steps)  # SIGTERM / Ctrl-C
            if cfg.checkpoint_every and (step % cfg.checkpoint_every == 0 or stop):
                save_checkpoint(job, ctx, self.loop, step)
            if stop:
                ctx.recorder.emit("interrupted", step=step, signal=interrupt.signal_name())
                break
            if cfg.eval_every and step % cfg.eval_every == 0 and step < job.steps:
                self._gather()
                if self.full is not None:
                    ctx.recorder.emit("eval", step=step, **job.evaluate(self.full))
        wall = time.perf_counter() - t0
        done = last - start
        result = RankResult(steps=done, samples=done * job.batch_size, wall_s=wall, final_loss=self.loss)
        result.strategy_metrics = self._metrics()
        self._gather()
        if self.full is not None and last == job.steps:  # else stopped: see the checkpoint
            result.eval = job.evaluate(self.full)
            ctx.recorder.emit("eval", step=job.steps, **result.eval)
            result.model_state = {k: v.detach().clone() for k, v in self.full.state_dict().items()}
        return result

    def _step(self, step: int, feed: BatchFeed) -> None:
        """One mini-batch: the rank's order on its chunks, then the flush."""
        self.loss, window = self.pipe.run_feed(feed)
        self.windows.append(window)
        self.pipe.update(step)
        self.ctx.recorder.step(step, self.loss, samples=step * self.job.batch_size)
        if self.ctx.progress is not None:
            self.ctx.progress.update(step, self.loss)

    def _gather(self) -> None:
        """Collective: every chunk's weights into rank 0's full model."""
        state = self.pipe.gather()
        if self.full is not None and state is not None:
            self.full.load_state_dict(state)

    @property
    def full(self) -> Any:
        return self.pipe.full

    def _metrics(self) -> dict[str, Any]:
        """Collective: each rank's record (its chunks as one lane) summarised at rank 0."""
        pipe = self.pipe
        execs = list(pipe.execs.values())
        metrics = [ex.metrics() for ex in execs]
        record: dict[str, Any] = {
            "stage": self.ctx.rank,
            "replica": 0,
            "layers": [name for c in pipe.mine for name, _ in pipe.pieces[c].named_children()],
            "windows": [w.to_json() for w in self.windows],
            # each action's compute seconds, tagged with its chunk: the replay of the same orders
            "ops": [[[*o, a.stage] for o, a in zip(w.ops, pipe.orders[pipe.index], strict=True)]
                    for w in self.windows],
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
            "chunks": pipe.chunks,
            "virtual_stages": pipe.chunks // self.ctx.world,
            "chunks_of_rank": [[c for c in range(pipe.chunks) if pipe.homes[c] == r]
                               for r in range(self.ctx.world)],
            "microbatches": self.opts.microbatches,
            "partition": pipe.partition.to_json(),
        }
        return summarise(records, head)
