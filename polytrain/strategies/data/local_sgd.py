"""``local-sgd``: parallel SGD with periodic model averaging (PSGD, Zinkevich et al. 2010).

Each of the W ranks runs the job's optimizer on its own part of every global batch (B/W samples)
and never exchanges gradients; every ``period`` steps the replicas average their *parameters*
(one all-reduce of the flat parameter vector, mean). ``period=0`` averages only once, after the
last step: Zinkevich's one-shot PSGD. The first ``warmup`` steps average after every step.
Whatever the period, the last step is followed by an average, so the run ends with one model.

With plain SGD and ``period=1``, averaging the W replicas after each local step is one SGD step
on the mean gradient — the oracle: equal to ``allreduce`` (and ``single``) to float tolerance.
Optimizer state (momentum, Adam moments) stays local: it is not averaged.

Bytes: every average sends 2(W−1)/W of the parameters per rank (ring all-reduce), so
``period=p`` sends about 1/p of what ``allreduce`` sends. strategy_metrics reports the measured
``bytes_per_worker`` next to ``allreduce_bytes_per_worker``, the ring all-reduce traffic of the
gradients every step (what ``allreduce`` measures on this model: same formula, same counter).

``--set compression=CODEC`` compresses what an average sends: each replica's *change since the
last average* (the parameters minus the shared anchor, which every rank holds alike), through
:func:`polytrain.comm.exchange.compressed_mean`; the anchor then moves by the mean change. With
error feedback, what a codec did not send of a change is sent with the next one. The anchor and
the residuals are part of each rank's checkpoint.

Training features, per worker (each local step is the shared `loop.plain_step`): ``--grad-accum
K`` cuts each worker's B/W rows into K micro-batches for one local update; ``--clip-grad-norm X``
clips each worker's local gradient by its own global norm (the whole model's, on that worker),
before its local update — there is no cross-worker norm, since no gradient crosses workers;
``--precision`` autocasts each worker's forward with fp32 parameters, and fp16's scaler is each
worker's own (a worker whose gradient overflowed skips its local update; the average is of fp32
parameters). With ``period=1`` an update is the mean of the W individually clipped steps.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from pydantic import ConfigDict, Field

from polytrain.comm.codecs.engine import Engine
from polytrain.comm.exchange import Item, codec_report, compressed_mean
from polytrain.comm.options import CodecOptions, CollectiveOptions, check_codec
from polytrain.comm.ring import record_ring, ring_all_reduce
from polytrain.config import JobConfig
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.loop import LoopSpec, plain_step, run_loop
from polytrain.runtime.supports import Supports
from polytrain.strategies.base import Offer, Strategy
from polytrain.strategies.data.allreduce import check_divisible, codec_engine

if TYPE_CHECKING:
    from polytrain.cost.scene import Estimate, Scene


class LocalSgdOptions(CollectiveOptions, CodecOptions):
    model_config = ConfigDict(extra="forbid")
    period: int = Field(4, ge=0, description="steps between averages; 0 = once, at the end")
    warmup: int = Field(0, ge=0, description="first steps that average after every step")


def averages_after(step: int, steps: int, period: int, warmup: int) -> bool:
    """Whether the replicas average their parameters after ``step`` (1-based) of ``steps``."""
    return step <= warmup or step == steps or (period > 0 and step % period == 0)


@torch.no_grad()
def average_parameters(model: torch.nn.Module, ctx: RankContext, op: str = "average",
                       collective: str = "builtin") -> None:
    """Replace every rank's parameters by their mean over ranks (one flat all-reduce)."""
    params = list(model.parameters())
    flat = torch.cat([p.reshape(-1) for p in params])
    if collective == "ring":
        record_ring(ctx.recorder, ring_all_reduce(flat, ctx.comm, op=op))
    else:
        ctx.comm.all_reduce(flat, op=op)
    flat.div_(ctx.world)
    pos = 0
    for p in params:
        p.copy_(flat[pos : pos + p.numel()].view_as(p))
        pos += p.numel()


class DeltaAverager:
    """Averages the replicas' changes since the last average through a codec."""

    def __init__(self, model: torch.nn.Module, engine: Engine, ctx: RankContext, collective: str) -> None:
        self.params = list(model.named_parameters())
        self.anchor = [p.detach().clone() for _, p in self.params]
        self.engine, self.ctx, self.collective = engine, ctx, collective

    @torch.no_grad()
    def __call__(self) -> None:
        items = [Item(i, n, p.detach() - a) for i, ((n, p), a) in enumerate(zip(self.params, self.anchor,
                                                                               strict=True))]
        means = compressed_mean(self.engine, self.ctx.comm, items, collective=self.collective,
                                op="average", rec=self.ctx.recorder)
        for (_, p), a, m in zip(self.params, self.anchor, means, strict=True):
            a.add_(m.view_as(a))
            p.copy_(a)

    def state_dict(self) -> dict[str, Any]:
        return {"engine": self.engine.state_dict(), "anchor": {n: a for (n, _), a in
                                                               zip(self.params, self.anchor, strict=True)}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.engine.load_state_dict(state["engine"])
        self.anchor = [state["anchor"][n].clone() for n, _ in self.params]


def ring_bytes(params: int, world: int, rounds: int) -> int:
    """Bytes one rank sends in ``rounds`` ring all-reduces of ``params`` float32 values."""
    return rounds * 2 * (world - 1) * params * 4 // world if world > 1 else 0


def bytes_vs_allreduce(ctx: RankContext, params: int, steps: int) -> dict[str, Any]:
    """This rank's measured bytes next to a ring all-reduce of the gradients every step."""
    ring = ring_bytes(params, ctx.world, steps)
    return {"bytes_per_worker": ctx.comm.bytes_sent, "allreduce_bytes_per_worker": ring,
            "bytes_vs_allreduce": round(ctx.comm.bytes_sent / ring, 4) if ring else None}


class LocalSgd(Strategy):
    name = "local-sgd"
    family = "data"
    summary = "local SGD on each rank, parameters averaged every `period` steps (PSGD)"
    Options = LocalSgdOptions
    supports = Supports(compression=True, lr_schedule=True, clip=True, grad_accum=True, precision=True,
                        means={"clip": "per worker: each worker's local gradient clipped by its own "
                                       "global norm before its local update",
                               "grad_accum": "per worker: K micro-batches of its B/W rows per local update"})

    @classmethod
    def offers(cls, scene: Scene) -> Iterator[Offer]:
        w = scene.cluster.world
        if w >= 2 and scene.batch % w == 0:
            for period in (4, 16):
                yield w, {"period": period}

    def price(self, scene: Scene, world: int) -> Estimate | str:
        from polytrain.cost import estimate as est

        return est.local_sgd(scene, world, self.options.period)  # type: ignore[attr-defined]

    def check(self, cfg: JobConfig, world: int) -> None:
        check_divisible(cfg, world, self.name)
        check_codec(self.name, self.options, world, hooks=False,  # type: ignore[arg-type]
                    optimizer=cfg.optimizer)

    def run(self, job: Job, ctx: RankContext) -> RankResult:
        opts: LocalSgdOptions = self.options  # type: ignore[assignment]
        model = job.build_model().to(ctx.device)
        optimizer = job.make_optimizer(model.parameters())
        rec = ctx.recorder
        averages = 0
        engine = codec_engine(opts, job, ctx)
        delta = DeltaAverager(model, engine, ctx, opts.collective) if engine is not None else None

        local = plain_step(job, ctx, model, optimizer)  # per worker: accumulation, clipping, precision

        def step(i: int, x: torch.Tensor, y: torch.Tensor) -> float:
            nonlocal averages
            loss = local(i, x, y)
            if averages_after(i, job.steps, opts.period, opts.warmup):
                with rec.span("average", "comm", step=i):
                    if delta is not None:
                        delta()
                    else:
                        average_parameters(model, ctx, collective=opts.collective)
                averages += 1
            return loss

        n = sum(p.numel() for p in model.parameters())
        # Replicas differ between averages, so each rank checkpoints its own (replicated=False).
        spec = LoopSpec(model=model, optimizer=optimizer, step_fn=step, part=ctx.rank,
                        parts=ctx.world, replicated=False, precision=local.precision,  # type: ignore[attr-defined]
                        state=delta.state_dict if delta else None,
                        load_state=delta.load_state_dict if delta else None)
        result = run_loop(job, ctx, spec)
        result.strategy_metrics = {
            "period": opts.period, "warmup": opts.warmup, "averages": averages,
            **bytes_vs_allreduce(ctx, n, result.steps),
        }
        if engine is not None:
            result.strategy_metrics["codec"] = codec_report(engine, ctx.comm, result.steps, op="average")
        return result
