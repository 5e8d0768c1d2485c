"""``malt``: peer-to-peer data parallelism over a sparse peer graph (MALT, Li et al. 2015).

Every rank trains a replica on its part of each global batch. After its local step it pushes
its parameters (``exchange=params``, the default: gossip model averaging) — or, with
``exchange=grads``, its gradient before the step — one-sided to its out-peers: an ``isend`` the
receiver never asked for; the receiver has pre-posted an ``irecv`` per in-peer. It then replaces
its own vector by the mean of its own and what it received. No rank talks to all others unless
``graph=all``. Averaging parameters keeps the replicas close; averaging gradients lets them drift
(measured: 0.964 vs 0.900 test accuracy of replica 0, benchmarks/results/dp_bytes.md).

Peer graph (plain data, :func:`peer_graph`): MALT's Halton graph sends to ⌈log2 W⌉ peers at
offsets W·h(j) (mod W) for the base-2 Halton (van der Corput) sequence h = 1/2, 1/4, 3/4,
1/8, 5/8, …, skipping offset 0 and repeats. The same offsets at every rank make the graph
circulant: rank r receives from r − offset, so in-degree = out-degree. For W = 8:

    rank 0 -> 4, 2, 6      rank 1 -> 5, 3, 7      ...      (3 peers instead of 7)

``graph=all`` sends to every other rank: every replica ends each step with the mean of all W
replicas (with plain SGD, one step on the mean gradient; ``exchange=grads``: the mean gradient
for any optimizer) — the oracle: equal to ``allreduce`` (and ``single``) to float tolerance.

Bytes: a rank sends its vector once per out-peer per exchange, ⌈log2 W⌉·4N bytes, against
2(W−1)/W·4N for a ring all-reduce; so MALT saves bytes over all-to-all (W−1 copies), not over
a ring. strategy_metrics reports the measured ``bytes_per_worker`` and
``allreduce_bytes_per_worker`` (the ring all-reduce of the gradients every step).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from polytrain.config import JobConfig
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.loop import LoopSpec, run_loop
from polytrain.runtime.supports import Supports, refusing
from polytrain.strategies.base import Strategy
from polytrain.strategies.data.allreduce import check_divisible
from polytrain.strategies.data.local_sgd import bytes_vs_allreduce


class MaltOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    graph: Literal["halton", "all"] = "halton"
    exchange: Literal["params", "grads"] = "params"
    period: int = Field(1, ge=1, description="steps between exchanges")


def halton(index: int, base: int = 2) -> float:
    """The index-th (1-based) element of the base-``base`` Halton (van der Corput) sequence."""
    out, f = 0.0, 1.0
    while index > 0:
        f /= base
        out += f * (index % base)
        index //= base
    return out


def halton_offsets(world: int) -> list[int]:
    """⌈log2 W⌉ distinct non-zero offsets round(W·h(j)) mod W (fewer only when W is tiny)."""
    want = min(world - 1, max(1, math.ceil(math.log2(world)))) if world > 1 else 0
    out: list[int] = []
    j = 1
    while len(out) < want:
        off = int(world * halton(j)) % world
        if off and off not in out:
            out.append(off)
        j += 1
    return out


def peer_graph(kind: str, world: int) -> list[list[int]]:
    """Out-peers of every rank: ``graph[r]`` are the ranks r pushes to."""
    offsets = list(range(1, world)) if kind == "all" else halton_offsets(world)
    return [[(r + o) % world for o in offsets] for r in range(world)]


def in_peers(graph: list[list[int]], rank: int) -> list[int]:
    return [r for r, outs in enumerate(graph) if rank in outs]


def exchange(flat: torch.Tensor, ctx: RankContext, outs: list[int], ins: list[int]) -> torch.Tensor:
    """Push ``flat`` (N,) to ``outs``, take one from each of ``ins``: the mean of all (N,)."""
    bufs = [torch.empty_like(flat) for _ in ins]
    recvs = [ctx.comm.irecv(b, src, op="malt") for b, src in zip(bufs, ins, strict=True)]
    sends = [ctx.comm.isend(flat, dst, op="malt") for dst in outs]
    for w in recvs:
        w.wait()
    total = flat.clone()
    for b in bufs:
        total.add_(b)
    for w in sends:
        w.wait()
    return total.div_(1 + len(bufs))


def _write(tensors: list[torch.Tensor], flat: torch.Tensor) -> None:
    pos = 0
    for t in tensors:
        t.copy_(flat[pos : pos + t.numel()].view_as(t))
        pos += t.numel()


class Malt(Strategy):
    name = "malt"
    supports = Supports(lr_schedule=True, why=refusing({
        "clip": ("each replica mixes with its own peers only, so no rank holds a global gradient; "
                 "clipping here would mean each replica's gradient by its own norm before its step "
                 "(per worker), which is not built"),
        "grad_accum": ("its local step is one forward and backward of its B/W rows before the "
                       "exchange; K micro-batches per step (per worker) are not built"),
        "precision": ("with exchange=grads the replicas mix gradients that fp16 scalers of their "
                      "own would scale differently; not built")}))
    family = "data"
    summary = "peer-to-peer: one-sided pushes to ~log2(W) Halton peers, average what arrived"
    Options = MaltOptions

    def check(self, cfg: JobConfig, world: int) -> None:
        check_divisible(cfg, world, self.name)

    def run(self, job: Job, ctx: RankContext) -> RankResult:
        opts: MaltOptions = self.options  # type: ignore[assignment]
        model = job.build_model().to(ctx.device)
        params = list(model.parameters())
        optimizer = job.make_optimizer(params)
        graph = peer_graph(opts.graph, ctx.world)
        outs, ins = graph[ctx.rank], in_peers(graph, ctx.rank)
        rec = ctx.recorder

        def mix(tensors: list[torch.Tensor], i: int) -> None:
            with rec.span("exchange", "comm", step=i), torch.no_grad():
                _write(tensors, exchange(torch.cat([t.reshape(-1) for t in tensors]), ctx, outs, ins))

        def step(i: int, x: torch.Tensor, y: torch.Tensor) -> float:
            x, y = x.to(ctx.device), y.to(ctx.device)
            optimizer.zero_grad(set_to_none=True)
            with rec.span("forward", step=i):
                loss = job.forward_loss(model, x, y)
            with rec.span("backward", step=i):
                loss.backward()
            talk = i % opts.period == 0
            if talk and opts.exchange == "grads":
                grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
                for p, g in zip(params, grads, strict=True):  # every rank sends the same length
                    p.grad = g
                mix(grads, i)
            with rec.span("optimizer", step=i):
                optimizer.step()
            if talk and opts.exchange == "params":
                mix([p.data for p in params], i)
            return float(loss.detach())

        spec = LoopSpec(model=model, optimizer=optimizer, step_fn=step, part=ctx.rank,
                        parts=ctx.world, replicated=False)
        result = run_loop(job, ctx, spec)
        n = sum(p.numel() for p in params)
        result.strategy_metrics = {
            "graph": opts.graph, "exchange": opts.exchange, "peers": len(outs),
            "peer_graph": graph,
            **bytes_vs_allreduce(ctx, n, result.steps),
        }
        return result
