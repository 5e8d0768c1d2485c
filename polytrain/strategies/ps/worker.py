"""The worker side of ``ps``: compute gradients on this worker's part of each global batch, push
them, pull parameters — when, is the consistency model's call.

Worker w of W computes step s on part w of global batch s (``GlobalBatches.shard(s, w, W)``), so
the union of the workers' parts is single-process training's batch s: the basis of the BSP
oracle. Under bsp, ssp and async a worker's steps run in the shared loop
(:func:`polytrain.runtime.loop.run_loop`, with :meth:`WorkerLoop.clocked_step` as the strategy's
own step), which evaluates (worker 0) and checkpoints (:mod:`.checkpoint`). Under k-of-n a worker
always computes the step after the newest one the servers have aggregated (a late worker skips
steps rather than falling further behind), so its steps are not a fixed sequence: it runs its
own loop (:meth:`WorkerLoop.run_k_of_n`) and does not checkpoint.

Per worker, per push: ``--grad-accum K`` cuts the worker's B/W rows of a step into K
micro-batches for that step's one gradient; ``--clip-grad-norm X`` scales each push (one step's
gradient, or under async with ``n_push`` > 1 the sum of the steps since the last push) to L2
norm at most X, by its own norm — the servers then apply the clipped pushes as they do any
(bsp: their mean). No global norm is formed: under async and ssp no two workers' gradients
belong to one update.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from polytrain.comm.codecs.engine import Engine
from polytrain.runtime import interrupt
from polytrain.runtime.accumulate import accumulate
from polytrain.runtime.clip import clip_flat
from polytrain.runtime.flat import flat_grads, load_flat
from polytrain.runtime.job import Job, RankContext
from polytrain.runtime.sharding import ShardPlan
from polytrain.strategies.ps.client import PSClient, shard_name
from polytrain.strategies.ps.consistency import Consistency


def work_seconds(wall0: float, cpu0: float) -> float:
    """The work done since (perf_counter, process_time) = (wall0, cpu0), for straggler emulation:
    the smaller of wall and CPU time. Wall time alone also counts time the rank waited for a core
    while other ranks computed, and a straggler that sleeps (F-1)x that would turn CPU contention
    into extra slowness (measured: ssp with a 30x straggler ran at half bsp's speed)."""
    return min(time.perf_counter() - wall0, time.process_time() - cpu0)


def codec_state(engine: Engine, plan: ShardPlan) -> dict[str, torch.Tensor]:
    """The push codec's per-shard state (residuals, dgc's velocity) as flat (N,) vectors."""
    residuals = engine.ef.residuals if engine.ef is not None else {}
    velocity = engine.codec.state_dict()
    out = {}
    for key, get in (("residual", lambda s: residuals.get(shard_name(s))),
                     ("velocity", lambda s: velocity.get(str(s)))):
        flat = torch.zeros(plan.total, dtype=torch.float64 if key == "residual" else torch.float32)
        for s in range(plan.servers):
            t = get(s)
            if t is not None:
                plan.scatter(flat, s, t)
        out[key] = flat
    return out


def load_codec_state(engine: Engine, plan: ShardPlan, state: dict[str, torch.Tensor]) -> None:
    """Inverse of :func:`codec_state` under ``plan`` (which may differ from the saved one)."""
    if engine.ef is not None:
        engine.ef.load_state_dict({shard_name(s): plan.gather(state["residual"], s).contiguous()
                                   for s in range(plan.servers)})
    engine.codec.load_state_dict({str(s): plan.gather(state["velocity"], s).contiguous()
                                  for s in range(plan.servers)})


@dataclass
class WorkerLoop:
    """One worker's training loop (everything but the wire protocol, which PSClient speaks)."""

    job: Job
    ctx: RankContext
    client: PSClient
    policy: Consistency
    index: int  # w, this worker's place among the W workers
    workers: int  # W
    n_push: int = 1
    n_fetch: int = 1
    model: nn.Module = field(init=False)
    compute_s: float = 0.0
    computed: int = 0
    last_loss: float = float("nan")
    acc: torch.Tensor | None = None  # gradients computed since the last push (async n_push)
    codec: dict[str, Any] | None = None  # the push codec's report (compression=), at the end

    def __post_init__(self) -> None:
        self.model = self.job.build_model()  # same seed on every rank: same start as the servers
        self.batches = self.job.batches()
        self.every = self.job.config.checkpoint_every

    def _gradient(self, step: int) -> torch.Tensor:
        """Forward and backward on this worker's part of global batch ``step``: flat grad (N,)."""
        x, y = self.batches.shard(step, self.index, self.workers)
        rec = self.ctx.recorder
        t0, cpu0 = time.perf_counter(), time.process_time()
        self.model.zero_grad(set_to_none=True)

        def loss_of(model: Any, xm: torch.Tensor, ym: torch.Tensor) -> torch.Tensor:
            with rec.span("forward", step=step):
                return self.job.forward_loss(model, xm, ym)

        def backward(loss: torch.Tensor) -> None:
            with rec.span("backward", step=step):
                loss.backward()

        # --grad-accum K: K micro-batches of this worker's rows, one gradient (per worker)
        self.last_loss = accumulate(self.model, x, y, self.job.config.grad_accum, loss_of, backward)
        self.ctx.straggle(work_seconds(t0, cpu0))  # slow at computing, not at waiting
        self.compute_s += time.perf_counter() - t0
        self.computed += 1
        return flat_grads(self.model)

    def _clipped(self, push: torch.Tensor) -> torch.Tensor:
        """--clip-grad-norm X: what this worker pushes, clipped by its own norm (per push)."""
        limit = self.job.config.clip_grad_norm
        if limit is not None:
            clip_flat(push, limit)
        return push

    def _load(self) -> list[int]:
        flat, steps, _ = self.client.wait()
        load_flat(self.model, flat)
        return steps

    def _record(self, step: int, samples: int) -> None:
        ctx = self.ctx
        ctx.recorder.step(step, self.last_loss, samples=samples)
        if ctx.progress is not None:
            ctx.progress.update(step, self.last_loss)
        every = self.job.config.eval_every
        if self.index == 0 and every and step % every == 0 and step < self.job.steps:
            ctx.recorder.emit("eval", step=step, **self.job.evaluate(self.model))

    def clocked_step(self, step: int) -> float:
        """bsp, ssp, async: step ``step`` on this worker's clock; its loss (on its part)."""
        steps = self.job.steps
        grad = self._gradient(step)
        self.acc = grad if self.acc is None else self.acc.add_(grad)
        # a checkpoint step pushes what it has: a checkpoint holds no half-accumulated push
        checkpoint = bool(self.every and step % self.every == 0)
        push = step % self.n_push == 0 or step == steps or checkpoint
        # the last step pulls too when it checkpoints: the checkpoint then holds what a longer
        # run holds at this step (the pulled model, the servers' read_step/read_version), so
        # extending a finished run with --resume --steps N equals the uninterrupted N-step run
        fetch = step % self.n_fetch == 0 and (step < steps or checkpoint)
        if push:
            self.client.push(self._clipped(self.acc), step, self.policy.need(step) if fetch else None)
            self.acc = None
        elif fetch:
            self.client.pull(step, self.policy.need(step))
        if fetch:
            self._load()
        return self.last_loss

    def save(self, step: int) -> None:
        """Checkpoint at ``step``: this worker's file, then the servers' (see :mod:`.checkpoint`)."""
        from polytrain.strategies.ps.checkpoint import worker_state

        state = worker_state(self.ctx, self.model)
        if self.client.engine is not None:
            state["codec"] = codec_state(self.client.engine, self.client.plan)
        self.ctx.checkpoints.write_rank(step, self.ctx.rank, state)
        self.client.save(step)

    def restore(self) -> int:
        from polytrain.strategies.ps.checkpoint import restore_worker

        engine, plan = self.client.engine, self.client.plan

        def codec(state: dict[str, Any]) -> None:
            if engine is not None and "codec" in state:
                load_codec_state(engine, plan, state["codec"])

        return restore_worker(self.ctx, self.model, self.index, self.workers, codec)

    def run_k_of_n(self, k: int) -> int:
        """k-of-n: compute the step after the servers' newest, push it, wait for its aggregate.
        Returns the newest aggregated step (the last step, unless stopped on request).

        A stop request (SIGTERM, Ctrl-C) is checked against the servers' newest step, before a
        worker computes the next: no worker then pushes beyond the agreed step, whose aggregate
        every worker still waiting needs, so none waits on a step the others have left."""
        steps, part = self.job.steps, self.job.batch_size // self.workers
        newest = 0
        while newest < steps:
            if interrupt.stop_after(newest, steps):
                self.ctx.recorder.emit("interrupted", step=newest, signal=interrupt.signal_name())
                break
            step = newest + 1
            self.client.push(self._clipped(self._gradient(step)), step, need=step)
            newest = min(self._load())
            self._record(step, step * k * part)
        return newest

    def stats(self) -> dict[str, Any]:
        return {"role": "worker", "rank": self.ctx.rank, "steps_computed": self.computed,
                "compute_s": round(self.compute_s, 6), "wait_s": round(self.client.wait_s, 6),
                "sparse_pushes": self.client.sparse_pushes,
                **({"codec": self.codec} if self.codec is not None else {})}
