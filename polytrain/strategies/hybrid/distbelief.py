"""``distbelief``: model-parallel replicas sharing parameter servers (Dean et al. 2012, Downpour
SGD; 000 §V, 004 §2). Reuses the ``ps`` server and client (:mod:`polytrain.strategies.ps.server`)
and the pipeline executor (`polytrain.strategies.pipeline.flush`, as ``layerwise``).

    polytrain train --strategy distbelief --procs 6 --set stages=2 --model mlp   # 2 servers,
                                                          # 2 replicas × 2 stages

Ranks: first the servers, ``servers`` per stage (stage p's are p·k … p·k+k−1), then the replicas,
each ``stages`` consecutive ranks (replica d, stage p at S + d·P + p). A replica trains like
``layerwise`` (a pipeline with one micro-batch) on part d of every global batch (D replicas); at
the flush each stage rank pushes its stage's gradient to that stage's servers and pulls the
stage's parameters — it never talks to the other stages' servers, so a model partition only
exchanges its own parameters.
``consistency``: ``async`` (Downpour, default: every push applied at once, no waiting), ``ssp``
(bounded staleness) or ``bsp`` (the servers wait for all replicas: equals single-process training).
At the end the servers send their shards to rank 0, which evaluates the whole model.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from polytrain.comm import new_groups
from polytrain.config import JobConfig
from polytrain.errors import ConfigError
from polytrain.models.partition import cut
from polytrain.runtime import interrupt
from polytrain.runtime.flat import flat_grads, flat_params, load_flat
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.layout import Layout
from polytrain.runtime.sharding import ShardPlan, make_plan, param_infos
from polytrain.runtime.supports import Supports
from polytrain.strategies.base import Strategy
from polytrain.strategies.data.allreduce import check_divisible
from polytrain.strategies.model.layerwise import check_partition_text, plan
from polytrain.strategies.pipeline.flush import FlushPipeline
from polytrain.strategies.pipeline.options import meta_model
from polytrain.strategies.pipeline.ties import refuse_ties
from polytrain.strategies.ps.checkpoint import attach_server, restore_client, save_client
from polytrain.strategies.ps.client import PSClient, gather_shards
from polytrain.strategies.ps.consistency import histogram, make_consistency
from polytrain.strategies.ps.server import ParameterServer
from polytrain.strategies.ps.strategy import check_no_buffers


class DistBeliefOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    stages: int = Field(2, ge=1, description="model-parallel ranks per replica")
    servers: int = Field(1, ge=1, description="parameter servers per stage")
    consistency: Literal["async", "ssp", "bsp"] = "async"
    staleness: int | None = Field(None, ge=0, description="ssp: clocks a replica may run ahead (default 2)")
    partition: str = "uniform"

    @field_validator("partition", mode="before")
    @classmethod
    def _partition(cls, v: Any) -> str:
        return check_partition_text(str(v))


def layout(o: DistBeliefOptions, world: int) -> Layout:
    """Servers first (``servers`` per stage), then replicas of ``stages`` ranks; ``check`` has
    refused a world that does not split so (here at least one replica, for ``roles``)."""
    servers = o.stages * o.servers
    return Layout(dp=max(1, (world - servers) // o.stages), pp=o.stages, servers=servers)


class DistBelief(Strategy):
    name = "distbelief"
    family = "hybrid"
    summary = "DistBelief/Downpour: model-parallel replicas sharing asynchronous parameter servers"
    Options = DistBeliefOptions
    supports = Supports().without("only rank 0 sees the whole model, and only at the end", "eval")

    @property
    def opts(self) -> DistBeliefOptions:
        return self.options  # type: ignore[return-value]

    def roles(self, world: int) -> list[str]:
        o = self.opts
        roles = [f"server/stage{r // o.servers}" for r in range(min(world, o.stages * o.servers))]
        return roles + [f"replica{i // o.stages}/stage{i % o.stages}" for i in range(world - len(roles))]

    def check(self, cfg: JobConfig, world: int) -> None:
        o, lay = self.opts, layout(self.opts, world)
        left = world - lay.servers
        if left < o.stages or left % o.stages:
            fit = lay.servers + o.stages * max(1, left // o.stages)
            raise ConfigError(
                f"Strategy 'distbelief' with stages={o.stages} and servers={o.servers} per stage uses "
                f"{lay.servers} server ranks; the other {left} of --procs {world} must form whole "
                f"replicas of {o.stages} ranks. Fix: --procs {fit} (or {fit + o.stages})."
            )
        check_divisible(cfg, lay.dp, self.name)
        check_no_buffers(cfg, self.name)
        refuse_ties(meta_model(cfg), cfg, self.name, "each stage's parameters live on that stage's own "
                    "servers")
        if o.staleness is not None and o.consistency != "ssp":  # as ps: never silently ignored
            raise ConfigError(f"Option staleness={o.staleness} applies to consistency=ssp only "
                              f"(got consistency={o.consistency}). Drop it or --set consistency=ssp.")

    def run(self, job: Job, ctx: RankContext) -> RankResult:
        o, lay = self.opts, layout(self.opts, ctx.world).resolve(ctx.world)
        groups = [[s] for s in lay.server_ranks] + lay.pp_groups()
        replica_comm = new_groups(ctx.comm, groups)
        policy = make_consistency(o.consistency, lay.dp,
                                  staleness=2 if o.staleness is None else o.staleness)
        plans = _stage_plans(job, o, lay)
        if ctx.rank < lay.servers:
            return _serve(job, ctx, o, lay, plans, policy)
        d, p, _ = lay.coords(ctx.rank)
        pipe = FlushPipeline(job, ctx, lay.pp_groups()[d], replica_comm, o.partition, "gpipe", 1,
                             job.batch_size // lay.dp, optimizer=False)
        client = PSClient(ctx.comm, plans[p], lay.stage_servers(p), sparse=False)
        _start(job, ctx)
        loss, wait, last = _train(job, ctx, pipe, client, policy, d, lay.dp)
        ctx.comm.gather_json({"role": "worker", "rank": ctx.rank, "wait_s": wait})
        return RankResult(steps=last, samples=last * job.batch_size,
                          wall_s=ctx.recorder.now() - ctx.recorder.t_base, final_loss=loss)


def _stage_plans(job: Job, o: DistBeliefOptions, lay: Layout) -> list[ShardPlan]:
    full = job.build_model()
    stages = cut(full, plan(o.partition, full, o.stages))
    return [make_plan("size", param_infos(s), o.servers) for s in stages]


def _start(job: Job, ctx: RankContext, losses: bool = True) -> None:
    ctx.comm.barrier()
    ctx.recorder.start_clock()
    ctx.recorder.emit("start", first_step=1, steps=job.steps, losses=losses)


def _train(job: Job, ctx: RankContext, pipe: FlushPipeline, client: PSClient, policy: Any, d: int,
           replicas: int) -> tuple[float, float, int]:
    """A replica's stage: one flush step, push the stage gradient, pull the stage parameters.
    Returns (last loss, seconds waiting for pulls, the last step run)."""
    batches = job.batches()
    loss = float("nan")
    start = step = restore_client(ctx, pipe.module) if ctx.resume else 0  # ps/checkpoint.py
    for step in range(start + 1, job.steps + 1):
        x, y = batches.shard(step, d, replicas)
        loss = pipe.run(step, x, y)  # every stage learns the loss (it travels with the gradients)
        fetch = step < job.steps
        client.push(flat_grads(pipe.module), step, policy.need(step) if fetch else None)
        if fetch:
            with ctx.recorder.span("pull_wait", cat="comm"):
                flat, _, _ = client.wait()
            load_flat(pipe.module, flat)
        ctx.recorder.step(step, loss, samples=step * job.batch_size)
        if ctx.progress is not None:
            ctx.progress.update(step, loss)
        stop = step < job.steps and interrupt.stop_after(step, job.steps)  # SIGTERM / Ctrl-C
        every = job.config.checkpoint_every
        if every and (step % every == 0 or stop):
            save_client(ctx, pipe.module, client, step)
        if stop:  # every replica's stages stop after the same step; the servers end with them
            ctx.recorder.emit("interrupted", step=step, signal=interrupt.signal_name())
            break
    client.done()
    return loss, client.wait_s, step


def _serve(job: Job, ctx: RankContext, o: DistBeliefOptions, lay: Layout, plans: list[ShardPlan],
           policy: Any) -> RankResult:
    p, i = divmod(ctx.rank, o.servers)
    full = job.build_model()
    stage = cut(full, plan(o.partition, full, o.stages))[p]
    cfg = job.config
    server = ParameterServer(ctx.comm, lay.stage_clients(p), plans[p].gather(flat_params(stage), i),
                             cfg.optimizer, policy, lr=cfg.lr, momentum=cfg.momentum,
                             weight_decay=cfg.weight_decay, recorder=ctx.recorder, straggle=ctx.straggle)
    attach_server(job, ctx, server, list(lay.server_ranks))
    _start(job, ctx, losses=False)
    server.serve()
    stats = {"role": "server", "rank": ctx.rank, **server.stats()}
    flats = [gather_shards(ctx.comm, plans[q], lay.stage_servers(q),
                           server.shard if q == p else None, dst=0)
             for q in range(o.stages) if q == p or ctx.rank == 0]
    everyone = ctx.comm.gather_json(stats)
    result = RankResult(role="server", steps=0, wall_s=server.wall_s)
    if ctx.rank != 0 or everyone is None:
        return result
    stages = cut(full, plan(o.partition, full, o.stages))
    for s, flat in zip(stages, flats, strict=True):
        assert flat is not None
        load_flat(s, flat)
    result.eval = job.evaluate(full)
    ctx.recorder.emit("eval", step=job.steps, **result.eval)
    result.model_state = {k: v.detach().clone() for k, v in full.state_dict().items()}
    result.strategy_metrics = _metrics(o, lay, everyone)
    return result


def _metrics(o: DistBeliefOptions, lay: Layout, everyone: list[dict[str, Any]]) -> dict[str, Any]:
    servers = [r for r in everyone if r["role"] == "server"]
    stale = [int(k) for r in servers for k, n in r["staleness"].items() for _ in range(n)]
    return {
        "consistency": o.consistency, "replicas": lay.dp, "stages": lay.pp,
        "servers_per_stage": o.servers,
        "server_params": [r["params"] for r in servers],
        "server_bytes": [r["bytes"] for r in servers],
        "staleness_hist": histogram(stale), "staleness_max": max(stale, default=0),
        "worker_wait_s": [round(r["wait_s"], 6) for r in everyone if r["role"] == "worker"],
    }
