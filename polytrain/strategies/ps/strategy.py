"""``ps``: a parameter server over the network — S server ranks own shards, W worker ranks push
gradients to and pull parameters from all of them, under one of four consistency models.

    polytrain train --strategy ps --procs 5 --set servers=1 --set consistency=ssp --set staleness=2

Ranks 0..S-1 are servers, ranks S..S+W-1 workers. Each server holds its shard as one flat tensor
and applies the optimizer (``server_optimizer``, default the job's --optimizer) when the
consistency model says so (:mod:`.consistency`); the wire protocol is in :mod:`.server`; the plans
in :mod:`.sharding`. When the workers are done, the servers send their shards to rank 0, which
evaluates the trained model and writes it to the run directory.

strategy_metrics: ``server_bytes`` (sent + received per server, before the final collection),
``server_busy_s`` (per server: wall time spent receiving a push or handling a message), ``server_params``,
``staleness_hist``/``staleness_max`` (in steps; one entry per shard update, i.e. per accepted
push and server), ``update_lag_hist``/``update_lag_max`` (optimizer applications between a
worker's pull and its push), ``dropped_gradients`` (k-of-n: pushes dropped, the most any server
dropped; per server in ``dropped_by_server``), and per worker ``worker_wait_s`` and
``worker_steps`` (steps each computed).

``--set compression=CODEC`` compresses each worker's pushes (one payload per server shard, error
feedback per shard on the worker; the server decodes with the same codec) and, with
``compress_pulls=true`` (the default; not with ``dgc``), the server's replies: the change since
the worker's copy, with the server's per-worker copy as the error feedback (:mod:`.pulls`).
A worker's checkpoint holds its residuals (and dgc's velocity) as flat vectors, so a resume may
re-shard them; the per-push counters restart at 0 on both sides.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import ConfigDict, Field

from polytrain.comm.codecs.engine import Engine
from polytrain.comm.exchange import codec_report
from polytrain.comm.options import CodecOptions, check_codec
from polytrain.config import JobConfig
from polytrain.errors import ConfigError
from polytrain.runtime import schedule
from polytrain.runtime.flat import flat_params, load_flat
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.loop import LoopSpec, run_loop
from polytrain.runtime.sharding import ShardPlan, make_plan, param_infos
from polytrain.runtime.supports import Supports, refusing
from polytrain.strategies.base import Offer, Strategy
from polytrain.strategies.data.allreduce import check_divisible
from polytrain.strategies.ps.checkpoint import restore_server, server_saver
from polytrain.strategies.ps.client import PSClient, gather_shards, shard_name
from polytrain.strategies.ps.consistency import histogram, make_consistency
from polytrain.strategies.ps.pulls import PullDecoder, PullEncoder, pulls_compressible
from polytrain.strategies.ps.server import ParameterServer
from polytrain.strategies.ps.worker import WorkerLoop

if TYPE_CHECKING:
    from polytrain.cost.scene import Estimate, Scene


class PsOptions(CodecOptions):
    model_config = ConfigDict(extra="forbid")
    servers: int = Field(1, ge=1, description="server ranks (the first S ranks); the rest are workers")
    sharding: Literal["layer", "size"] = "layer"
    consistency: Literal["bsp", "async", "ssp", "k-of-n"] = "bsp"
    staleness: int | None = Field(None, ge=0, description="ssp: clocks a worker may run ahead (default 2)")
    k: int | None = Field(None, ge=1, description="k-of-n: gradients aggregated per step (default W-1)")
    n_push: int = Field(1, ge=1, description="async: push accumulated gradients every n_push steps")
    n_fetch: int = Field(1, ge=1, description="async: fetch parameters every n_fetch steps")
    server_optimizer: Literal["sgd", "momentum", "adagrad", "adam", "adamw"] | None = None
    sparse_push: bool = Field(True, description="push (index, value) pairs when under half non-zero")
    compress_pulls: bool = Field(True, description="with compression=: replies as codec-compressed "
                                                   "parameter changes (not dgc)")


def model_plan(cfg: JobConfig, kind: str, servers: int) -> ShardPlan:
    """The sharding plan of the job's model, built on the meta device (nothing allocated)."""
    from polytrain.data import dataset_spec
    from polytrain.models import resolve_model

    spec = dataset_spec(cfg.dataset, cfg.data_options)
    with torch.device("meta"):
        model = resolve_model(cfg.model, spec, cfg.model_options)
    return make_plan(kind, param_infos(model), servers)


def check_no_buffers(cfg: JobConfig, name: str) -> None:
    """Parameter servers hold parameters only: a model's buffers (BatchNorm's running statistics)
    would never reach the model the servers evaluate and save. Refused before launch."""
    from torch.nn.modules.batchnorm import _NormBase

    from polytrain.strategies.pipeline.options import meta_model

    model = meta_model(cfg)  # None: a factory that cannot build on meta (not checked here)
    # buffers that training changes: running statistics; constants (rotary frequencies, position
    # ids) are rebuilt the same by every model the servers and workers make
    names = [f"{m}.{b}" if m else b for m, mod in (model.named_modules() if model is not None else [])
             if isinstance(mod, _NormBase) and mod.track_running_stats
             for b, _ in mod.named_buffers(recurse=False)]
    if names:
        raise ConfigError(
            f"Strategy '{name}' keeps the model's parameters on its servers but not its buffers, "
            f"and --model {cfg.model} has {len(names)} ({names[0]}, ...: BatchNorm running "
            "statistics), which the model it evaluates and saves would carry untrained. Fix: a model "
            "without buffers (GroupNorm instead of BatchNorm; for vgg16 drop model.batch_norm), or "
            "--strategy allreduce / local-sgd."
        )


def check_roles(name: str, servers: int, world: int, role: str = "worker") -> int:
    """The number of workers; at least one must remain after the servers."""
    if servers >= world:
        raise ConfigError(
            f"Strategy '{name}' with servers={servers} needs at least one {role} besides the "
            f"servers, but --procs is {world}. Use --procs {servers + 1} or more, or fewer servers."
        )
    return world - servers


class Ps(Strategy):
    name = "ps"
    family = "parameter-server"
    exact = True  # with consistency=bsp (`is_exact`)
    learning_evidence = ("ps_consistency",)  # time to accuracy per consistency model

    def is_exact(self) -> bool:
        return super().is_exact() and self.options.consistency == "bsp"  # type: ignore[attr-defined]

    summary = "parameter servers (layer|size sharding) with bsp, async (Downpour), ssp or k-of-n"
    Options = PsOptions
    supports = Supports(compression=True, lr_schedule=True, clip=True, grad_accum=True, means={
        "clip": "per worker, per push: each push clipped by its own L2 norm, before the servers "
                "apply it (bsp: the mean of W individually clipped gradients, not the global norm)",
        "grad_accum": "per worker: each worker's B/W rows of a step in K micro-batches, one push"},
        why=refusing({"precision": (
            "its workers push fp32 gradients that the servers apply with their own optimizers; "
            "fp16 would need each worker's loss scaler to skip a push on overflow, which the "
            "bsp/ssp clocks (every worker pushes every step) do not allow")}))

    @classmethod
    def offers(cls, scene: Scene) -> Iterator[Offer]:
        w = scene.cluster.world
        groups = {name.split(".", 1)[0] for name, _ in scene.profile.params}
        for servers in sorted({1, 2, w // 4, w // 2} - {0}):
            if servers >= w or scene.batch % (w - servers):
                continue
            for sharding in ("layer", "size"):
                if sharding == "layer" and servers > len(groups):
                    continue
                for consistency in ("bsp", "async", "ssp", "k-of-n"):
                    yield w, {"servers": servers, "sharding": sharding, "consistency": consistency}

    def price(self, scene: Scene, world: int) -> Estimate | str:
        from polytrain.cost import estimate as est

        o: PsOptions = self.options  # type: ignore[assignment]
        return est.ps(scene, world, o.servers, o.sharding, o.consistency)

    @property
    def opts(self) -> PsOptions:
        return self.options  # type: ignore[return-value]

    def roles(self, world: int) -> list[str]:
        s = min(self.opts.servers, world)
        return ["server"] * s + ["worker"] * (world - s)

    @classmethod
    def resume_view(cls, cfg: JobConfig) -> dict[str, Any]:
        """A resume may change the number of servers and the sharding (the server state is
        re-sharded, :mod:`.checkpoint`), not the number of workers."""
        servers = int(cfg.options.get("servers", 1))
        kept = {k: v for k, v in cfg.options.items() if k not in ("servers", "sharding")}
        return {"options": kept, "workers": cfg.procs - servers}

    def supports_for(self, cfg: JobConfig) -> Supports:
        if self.opts.consistency == "k-of-n":
            return self.declared().without(
                "under k-of-n the workers' steps are not one sequence (a late worker skips steps), "
                "so there is no step at which every worker has pushed the same clock; use "
                "consistency=bsp, ssp or async", "checkpoint", "resume")
        return self.declared()

    def check(self, cfg: JobConfig, world: int) -> None:
        o = self.opts
        workers = check_roles(self.name, o.servers, world)
        check_divisible(cfg, workers, self.name)
        check_no_buffers(cfg, self.name)
        check_codec(self.name, o, world, hooks=False, optimizer=cfg.optimizer)
        if o.select == "tensor":
            raise ConfigError(f"Strategy '{self.name}' encodes each server's shard as one vector, so "
                              "select=tensor (each tensor's largest entries) cannot apply to it. Drop "
                              "select (the shard's largest entries) or use allreduce, local-sgd or mesh.")
        if o.staleness is not None and o.consistency != "ssp":
            raise ConfigError(f"Option staleness={o.staleness} applies to consistency=ssp only "
                              f"(got consistency={o.consistency}). Drop it or --set consistency=ssp.")
        if o.k is not None and (o.consistency != "k-of-n" or o.k > workers):
            raise ConfigError(f"Option k={o.k} needs consistency=k-of-n and 1 <= k <= workers "
                              f"({workers} here; got consistency={o.consistency}). "
                              f"Use --set consistency=k-of-n --set k={max(1, workers - 1)}.")
        if (o.n_push, o.n_fetch) != (1, 1) and o.consistency != "async":
            raise ConfigError(f"n_push={o.n_push}/n_fetch={o.n_fetch} apply to consistency=async "
                              f"(Downpour) only; {o.consistency} pushes and pulls every step. "
                              "Drop them or --set consistency=async.")
        try:
            model_plan(cfg, o.sharding, o.servers)
        except ConfigError:
            raise
        except Exception:  # a user model that cannot be built on the meta device: checked at run time
            pass

    def updates(self, steps: int, world: int) -> int:
        """How many updates each server applies in ``steps`` steps (the lr schedule's horizon):
        one per step under bsp and k-of-n (the aggregate of a step), one per push under async
        (every n_push steps, from each worker) and ssp (every step, from each worker)."""
        o = self.opts
        if o.consistency in ("bsp", "k-of-n"):
            return steps
        return (world - o.servers) * -(-steps // o.n_push)

    def setup(self, cfg: JobConfig, world: int) -> dict[str, Any]:
        o = self.opts
        workers = world - o.servers
        return {
            "servers": list(range(o.servers)),
            "workers": list(range(o.servers, world)),
            "optimizer": o.server_optimizer or cfg.optimizer,
            "staleness": 2 if o.staleness is None else o.staleness,
            "k": o.k or max(1, workers - 1),
        }

    def run(self, job: Job, ctx: RankContext) -> RankResult:
        cfg, o = job.config, self.opts
        if ctx.resume and o.consistency == "k-of-n":
            raise ConfigError("Strategy 'ps' with consistency=k-of-n cannot resume; start a new run.")
        s = self.setup(cfg, ctx.world)
        policy = make_consistency(o.consistency, len(s["workers"]), staleness=s["staleness"], k=s["k"])
        model = job.build_model()
        plan = make_plan(o.sharding, param_infos(model), o.servers)
        if ctx.rank in s["servers"]:
            server = ParameterServer(ctx.comm, s["workers"], plan.gather(flat_params(model), ctx.rank),
                                     s["optimizer"], policy, lr=cfg.lr, momentum=cfg.momentum,
                                     weight_decay=cfg.weight_decay, recorder=ctx.recorder,
                                     straggle=ctx.straggle,
                                     decoder=_decoder(o, job, ctx, s["workers"], plan.sizes()[ctx.rank]),
                                     pulls=PullEncoder(o, ctx.world, ctx.rank, cfg.seed)
                                     if pulls_compressible(o) else None)
            schedule.attach(server.optimizer, schedule.from_config(cfg, self.updates(job.steps, ctx.world)))
            server.on_save = server_saver(job, ctx, server, s["servers"], o.sharding)
            start = 0
            if ctx.resume:
                start = restore_server(ctx, server, ctx.rank, len(s["workers"]), plan,
                                       lambda kind, n: make_plan(kind, param_infos(model), n))
            _start(job, ctx, start, losses=False)
            server.serve()
            return self._finish_server(job, ctx, server, plan, s)
        engine = (Engine.from_options(o, ctx.world, ctx.rank, cfg.seed) if o.compressing else None)
        pulls = PullDecoder(o, ctx.world, cfg.seed) if pulls_compressible(o) else None
        client = PSClient(ctx.comm, plan, s["servers"], o.sparse_push, engine, pulls)
        loop = WorkerLoop(job, ctx, client, policy, index=ctx.rank - o.servers, workers=len(s["workers"]),
                          n_push=o.n_push, n_fetch=o.n_fetch)
        if o.consistency == "k-of-n":
            _start(job, ctx)
            last = loop.run_k_of_n(s["k"])
            part = job.batch_size // len(s["workers"])
            result = RankResult(role="worker", steps=last, samples=last * s["k"] * part,
                                final_loss=loop.last_loss)
        else:
            spec = LoopSpec(model=loop.model, optimizer=None, own_step=loop.clocked_step,
                            replicated=False, evaluates=loop.index == 0, final_eval=False,
                            save=loop.save, restore=loop.restore)
            result = run_loop(job, ctx, spec)
        loop.client.done()
        if engine is not None:
            loop.codec = codec_report(engine, ctx.comm, loop.computed, op="ps_push")
        # this launch's time: the recorder's clock continues a resumed run's (t_base)
        result.role, result.wall_s = "worker", ctx.recorder.now() - ctx.recorder.t_base
        ctx.comm.gather_json(loop.stats())
        return result

    def _finish_server(self, job: Job, ctx: RankContext, server: ParameterServer, plan: ShardPlan,
                       s: dict[str, Any]) -> RankResult:
        stats = {"role": "server", "rank": ctx.rank, **server.stats()}
        flat = gather_shards(ctx.comm, plan, s["servers"], server.shard, dst=0)
        everyone = ctx.comm.gather_json(stats)
        result = RankResult(role="server", steps=0, wall_s=server.wall_s)
        if flat is None or everyone is None:
            return result
        model = job.build_model()
        load_flat(model, flat)
        result.eval = job.evaluate(model)
        ctx.recorder.emit("eval", step=job.steps, **result.eval)
        result.model_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        result.strategy_metrics = self._metrics(everyone, plan, s)
        if schedule.updates_taken(server.optimizer):  # server 0's: whose updates it counted
            result.strategy_metrics["lr_schedule"] = {
                "updates": schedule.updates_taken(server.optimizer),
                "last_lr": server.optimizer.param_groups[0]["lr"]}
        return result

    def _metrics(self, everyone: list[dict[str, Any]], plan: ShardPlan, s: dict[str, Any]) -> dict[str, Any]:
        servers = [r for r in everyone if r["role"] == "server"]
        workers = [r for r in everyone if r["role"] == "worker"]
        stale = [int(k) for r in servers for k, n in r["staleness"].items() for _ in range(n)]
        lag = [int(k) for r in servers for k, n in r["update_lag"].items() for _ in range(n)]
        return {
            "servers": len(servers), "workers": len(workers), "sharding": plan.kind,
            "consistency": self.opts.consistency, "server_optimizer": s["optimizer"],
            **({"staleness_bound": s["staleness"]} if self.opts.consistency == "ssp" else {}),
            **({"k": s["k"]} if self.opts.consistency == "k-of-n" else {}),
            "server_params": [r["params"] for r in servers],
            "server_bytes": [r["bytes"] for r in servers],
            "server_busy_s": [round(r["busy_s"], 6) for r in servers],
            "server_messages": [r["messages"] for r in servers],
            "server_replies_in_flight_max": [r["replies_in_flight_max"] for r in servers],
            "staleness_hist": histogram(stale), "staleness_max": max(stale, default=0),
            "update_lag_hist": histogram(lag), "update_lag_max": max(lag, default=0),
            "dropped_gradients": max((r["dropped"] for r in servers), default=0),
            "dropped_by_server": [r["dropped"] for r in servers],
            "accepted_by_worker": servers[0]["accepted"] if servers else [],
            "worker_steps": [r["steps_computed"] for r in workers],
            "worker_wait_s": [r["wait_s"] for r in workers],
            "worker_compute_s": [r["compute_s"] for r in workers],
            "sparse_pushes": sum(r["sparse_pushes"] for r in workers),
            **({"codec": workers[0]["codec"]} if workers and "codec" in workers[0] else {}),
            **({"pull_codec": _pull_report(servers)} if servers and "pulls" in servers[0] else {}),
        }


def _pull_report(servers: list[dict[str, Any]]) -> dict[str, Any]:
    """Compressed pulls over all servers: payload bytes sent vs the dense float32 replies."""
    sent = sum(r["pulls"]["payload_bytes"] for r in servers)
    fp32 = sum(r["pulls"]["fp32_bytes"] for r in servers)
    return {"codec": servers[0]["pulls"]["codec"], "payload_bytes": sent, "fp32_bytes": fp32,
            "dense_replies": sum(r["pulls"]["dense_replies"] for r in servers),
            "ratio_vs_fp32": round(fp32 / sent, 3) if sent else None}


def _decoder(o: PsOptions, job: Job, ctx: RankContext, workers: list[int],
             size: int) -> Callable[[int, torch.Tensor], torch.Tensor] | None:
    """The server's decoder of codec pushes: one codec per worker (its pushes arrive in order,
    so the per-push counters that ``randomk`` seeds with stay in step with the worker's)."""
    if not o.compressing:
        return None
    engines = {w: Engine.from_options(o, ctx.world, w, job.config.seed) for w in workers}
    me = ctx.rank

    def decode(src: int, buf: torch.Tensor) -> torch.Tensor:
        e = engines[src]
        grad = e.decode(me, shard_name(me), buf, (size,), source=f" from worker rank {src}")
        e.done(me)
        return grad

    return decode


def _start(job: Job, ctx: RankContext, start: int = 0, losses: bool = True) -> None:
    """Every rank, servers included, starts the clock after the same barrier (``losses``: the
    rank reports a loss per step; a server does not)."""
    ctx.comm.barrier()
    ctx.recorder.start_clock()
    ctx.recorder.emit("start", first_step=start + 1, steps=job.steps, losses=losses)
