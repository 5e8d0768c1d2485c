"""``sandblaster``: synchronous batch L-BFGS with a coordinator (Sandblaster, DistBelief, Dean et
al. 2012). Rank 0 is the coordinator, ranks 1..S parameter servers, the rest workers.

One iteration k (the batch is the whole training set, or with ``batch=job`` global batch k)::

    servers ──x shard──▶ every worker                                    op sb_params
    coordinator cuts the batch into P portions (P = ``portions``, default 4·W) and hands one
      to each worker; a worker that reports a portion done gets the next (load balancing:
      a slow worker simply does fewer)                                   ops sb_portion, sb_done
    worker: Σ over its portions of ∇(n_p · mean loss) ──shard──▶ every server   op sb_grad
    servers: g = Σ/n, then the shard-wise two-loop recursion (:mod:`.lbfgs`); every dot product
      is a round: each server sends its partial to the coordinator, which sums the S partials
      and sends the scalar back — only scalars ever reach the coordinator   op sb_scalar

The oracle: ``torch.optim.LBFGS(history_size=history, lr=lr, max_iter=1, line_search_fn=None)``
stepped once per iteration on the same batch gives the same parameters and losses.

strategy_metrics: ``portions_per_worker`` (the load balance), ``reduce_rounds``,
``server_bytes``/``server_busy_s`` per server, ``coordinator_bytes``.
"""

from __future__ import annotations

import time
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from polytrain.config import JobConfig
from polytrain.errors import ConfigError
from polytrain.runtime.flat import flat_grads, flat_params, load_flat
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.layout import Layout
from polytrain.runtime.loop import LoopSpec, run_loop
from polytrain.runtime.sharding import make_plan, param_infos
from polytrain.runtime.supports import Supports, refusing
from polytrain.strategies.base import Strategy
from polytrain.strategies.ps.client import gather_shards
from polytrain.strategies.ps.lbfgs import LbfgsShard
from polytrain.strategies.ps.strategy import check_no_buffers, check_roles, model_plan
from polytrain.strategies.ps.worker import work_seconds

OPS = {"sum": 1.0, "max": 2.0}
END = 0.0


class SandblasterOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    servers: int = Field(1, ge=1, description="parameter servers (ranks 1..S)")
    sharding: Literal["layer", "size"] = "size"
    portions: int | None = Field(None, ge=1, description="portions per batch (default 4 x workers)")
    history: int = Field(10, ge=1, description="L-BFGS history size m")
    batch: Literal["full", "job"] = "full"


class Work:
    """Who is who (coordinator 0, servers 1..S, workers S+1..world-1) and the batch split."""

    def __init__(self, job: Job, opts: SandblasterOptions, world: int) -> None:
        self.ranks = Layout(servers=opts.servers, coordinator=1).resolve(world)
        self.servers = list(self.ranks.server_ranks)
        self.workers = list(self.ranks.replica_ranks)
        self.portions = opts.portions or 4 * len(self.workers)
        self.full = opts.batch == "full"
        self.job = job
        self._batches = job.batches()
        self.plan = make_plan(opts.sharding, param_infos(job.build_model()), opts.servers)

    def batch(self, step: int) -> torch.Tensor:
        """Sample indices of iteration ``step``."""
        return torch.arange(self.job.spec.train_size) if self.full else self._batches.indices(step)

    def portion(self, step: int, p: int) -> torch.Tensor:
        return torch.tensor_split(self.batch(step), self.portions)[p]

    @property
    def samples(self) -> int:
        return self.job.spec.train_size if self.full else self.job.batch_size


def _due(job: Job, step: int) -> bool:
    """Whether the coordinator needs the model after ``step`` (an evaluation, or the end)."""
    every = job.config.eval_every
    return step == job.steps or bool(every and step % every == 0)


class Coordinator:
    """Rank 0: hand out portions, combine the servers' scalars, record each iteration's loss."""

    def __init__(self, job: Job, ctx: RankContext, lay: Work) -> None:
        self.job, self.ctx, self.lay = job, ctx, lay
        self.done_by = dict.fromkeys(lay.workers, 0)
        self.rounds = 0
        self.model = job.build_model()  # the servers' parameters, gathered when evaluated

    def step(self, step: int) -> float:
        loss = _hand_out(self.ctx, self.lay, self.done_by) / self.lay.samples
        self.rounds += _reduce_rounds(self.ctx, self.lay)
        return loss

    def after_update(self, step: int, _loss: float) -> None:
        if _due(self.job, step):
            flat = gather_shards(self.ctx.comm, self.lay.plan, self.lay.servers, None, dst=0)
            assert flat is not None
            load_flat(self.model, flat)

    def state(self) -> dict[str, torch.Tensor]:
        return {"done_by": torch.tensor(list(self.done_by.values())), "rounds": torch.tensor(self.rounds)}

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        self.done_by = dict(zip(self.lay.workers, state["done_by"].tolist(), strict=True))
        self.rounds = int(state["rounds"])

    def finish(self, result: RankResult) -> RankResult:
        comm, lay = self.ctx.comm, self.lay
        everyone = comm.gather_json({"role": "coordinator", "bytes": comm.bytes_sent + comm.bytes_received})
        assert everyone is not None
        servers = [r for r in everyone if r["role"] == "server"]
        result.role = "coordinator"
        result.strategy_metrics = {
            "portions": lay.portions, "batch": "full" if lay.full else "job",
            "portions_per_worker": list(self.done_by.values()), "reduce_rounds": self.rounds,
            "server_bytes": [r["bytes"] for r in servers], "server_busy_s": [r["busy_s"] for r in servers],
            "server_params": [r["params"] for r in servers], "coordinator_bytes": everyone[0]["bytes"],
        }
        return result


def _hand_out(ctx: RankContext, lay: Work, done_by: dict[int, int]) -> float:
    """One batch's portions to the workers, first come first served; returns the loss sum."""
    comm, nxt, active, loss_sum = ctx.comm, 0, 0, 0.0
    sends = []
    for w in lay.workers:
        p = nxt if nxt < lay.portions else -1
        nxt, active = nxt + (p >= 0), active + (p >= 0)
        msg = torch.tensor([p], dtype=torch.int64)
        sends.append((comm.isend(msg, w, op="sb_portion"), msg))
    report = torch.zeros(3, dtype=torch.float64)
    while active:
        w = comm.recv(report, None, op="sb_done")  # only workers talk to rank 0 in this phase
        loss_sum += float(report[1])
        done_by[w] += 1
        p = nxt if nxt < lay.portions else -1
        nxt, active = nxt + (p >= 0), active - (p < 0)
        msg = torch.tensor([p], dtype=torch.int64)
        sends.append((comm.isend(msg, w, op="sb_portion"), msg))
    for work, _ in sends:
        work.wait()
    return loss_sum


def _reduce_rounds(ctx: RankContext, lay: Work) -> int:
    """Sum (or max) the servers' partial scalars until every server reports END."""
    rounds = 0
    while True:
        parts = []
        for s in lay.servers:
            buf = torch.zeros(4, dtype=torch.float64)
            ctx.comm.recv(buf, s, op="sb_scalar")
            parts.append(buf)
        ops = {float(b[0]) for b in parts}
        if ops == {END}:
            return rounds
        if len(ops) != 1:
            raise RuntimeError(f"sandblaster servers out of step: ops {sorted(ops)}")
        stacked = torch.stack(parts)
        total = stacked.max(0).values if ops.pop() == OPS["max"] else stacked.sum(0)
        for s in lay.servers:
            ctx.comm.send(total.clone(), s, op="sb_scalar")
        rounds += 1


class Server:
    """A server: send x, sum the workers' gradients, run the shard-wise L-BFGS iteration."""

    def __init__(self, job: Job, ctx: RankContext, lay: Work, opts: SandblasterOptions) -> None:
        self.job, self.ctx, self.lay = job, ctx, lay
        me = lay.servers.index(ctx.rank)
        self.shard = LbfgsShard(lay.plan.gather(flat_params(job.build_model()), me).clone(),
                                job.config.lr, opts.history)
        self.busy = 0.0

    def step(self, _step: int) -> float:
        comm, lay, shard = self.ctx.comm, self.lay, self.shard
        sends = [comm.isend(shard.x, w, op="sb_params") for w in lay.workers]
        acc = torch.zeros_like(shard.x)
        buf = torch.empty_like(shard.x)
        for _ in lay.workers:
            comm.recv(buf, None, op="sb_grad")  # only workers send to a server in this phase
            acc.add_(buf)
        for work in sends:
            work.wait()  # x must not change while it is on the wire
        t0 = time.perf_counter()
        gen = shard.iterate(acc.div_(lay.samples))
        try:
            op, values = next(gen)
            while True:
                self.busy += time.perf_counter() - t0
                out = torch.tensor([OPS[op], *values, *[0.0] * (3 - len(values))], dtype=torch.float64)
                comm.send(out, 0, op="sb_scalar")
                comm.recv(out, 0, op="sb_scalar")
                t0 = time.perf_counter()
                op, values = gen.send(out[1 : 1 + len(values)].tolist())
        except StopIteration:
            self.busy += time.perf_counter() - t0
        comm.send(torch.tensor([END, 0.0, 0.0, 0.0], dtype=torch.float64), 0, op="sb_scalar")
        return float("nan")  # the loss is the coordinator's

    def after_update(self, step: int, _loss: float) -> None:
        if _due(self.job, step):
            gather_shards(self.ctx.comm, self.lay.plan, self.lay.servers, self.shard.x, dst=0)

    def state(self) -> dict[str, object]:
        return self.shard.state()

    def load_state(self, state: dict[str, object]) -> None:
        self.shard.load_state(state)

    def finish(self, result: RankResult) -> RankResult:
        comm = self.ctx.comm
        comm.gather_json({"role": "server", "bytes": comm.bytes_sent + comm.bytes_received,
                          "busy_s": round(self.busy, 6), "params": self.shard.x.numel()})
        return RankResult(role="server")


class Worker:
    """A worker: fetch x, compute portions until told to stop, push the gradient sum."""

    def __init__(self, job: Job, ctx: RankContext, lay: Work) -> None:
        self.job, self.ctx, self.lay = job, ctx, lay
        self.model = job.build_model()
        self.flat = torch.zeros(lay.plan.total)
        self.computed = 0

    def step(self, step: int) -> float:
        comm, plan, lay, model = self.ctx.comm, self.lay.plan, self.lay, self.model
        x_all, y_all = self.job.dataset.x_train, self.job.dataset.y_train
        for s, rank in enumerate(lay.servers):
            buf = torch.empty(plan.sizes()[s])
            comm.recv(buf, rank, op="sb_params")
            plan.scatter(self.flat, s, buf)
        load_flat(model, self.flat)
        model.zero_grad(set_to_none=False)
        msg = torch.zeros(1, dtype=torch.int64)
        while True:
            comm.recv(msg, 0, op="sb_portion")
            p = int(msg[0])
            if p < 0:
                break
            idx = lay.portion(step, p)
            t0, cpu0 = time.perf_counter(), time.process_time()
            loss = self.job.forward_loss(model, x_all[idx], y_all[idx]) * idx.numel()  # a sum, not a mean
            loss.backward()
            self.ctx.straggle(work_seconds(t0, cpu0))
            self.computed += 1
            comm.send(torch.tensor([p, float(loss.detach()), idx.numel()], dtype=torch.float64), 0,
                      op="sb_done")
        grad = flat_grads(model)
        pushes = [(comm.isend(part, rank, op="sb_grad"), part) for rank, part in
                  zip(lay.servers, (plan.gather(grad, s).contiguous() for s in range(plan.servers)),
                      strict=True)]
        for w, _ in pushes:
            w.wait()
        return float("nan")  # the loss is the coordinator's

    def after_update(self, step: int, _loss: float) -> None:
        pass

    def state(self) -> dict[str, object]:
        return {"computed": torch.tensor(self.computed)}

    def load_state(self, state: dict[str, object]) -> None:
        self.computed = int(state["computed"])  # type: ignore[call-overload]

    def finish(self, result: RankResult) -> RankResult:
        self.ctx.comm.gather_json({"role": "worker", "portions": self.computed})
        return RankResult(role="worker")


def _refuse_ignored(cfg: JobConfig, opts: SandblasterOptions) -> None:
    """L-BFGS has no --optimizer/--momentum/--weight-decay, and batch=full no --batch-size."""
    default = JobConfig()
    for key, flag in (("optimizer", "--optimizer"), ("momentum", "--momentum"),
                      ("weight_decay", "--weight-decay")):
        if getattr(cfg, key) != getattr(default, key):
            raise ConfigError(
                f"Strategy 'sandblaster' runs L-BFGS (step size --lr, memory --set history=M), so "
                f"{flag} {getattr(cfg, key)} would be ignored. Drop {flag}.")
    if opts.batch == "full" and cfg.batch_size != default.batch_size:
        raise ConfigError(
            f"Strategy 'sandblaster' with batch=full uses the whole training set every iteration, "
            f"so --batch-size {cfg.batch_size} would be ignored. Drop it, or --set batch=job to "
            "take one global batch of --batch-size samples per iteration.")


class Sandblaster(Strategy):
    name = "sandblaster"
    family = "parameter-server"
    summary = "synchronous batch L-BFGS: coordinator, load-balanced portions, shard-wise two-loop"
    Options = SandblasterOptions
    supports = Supports(why=refusing({
        "clip": ("its L-BFGS direction comes from the gradients and the curvature pairs on the "
                 "servers' shards; clipping the gradient would bend the curvature pairs and the "
                 "line search, so it is refused"),
        "grad_accum": ("its workers already sum the gradients of load-balanced portions of the "
                       "batch (set portions=); --grad-accum would repeat that, so it is refused"),
        "precision": "its workers compute fp32 gradients for L-BFGS; autocast is not wired in"}))

    @property
    def opts(self) -> SandblasterOptions:
        return self.options  # type: ignore[return-value]

    def roles(self, world: int) -> list[str]:
        s = min(self.opts.servers, max(0, world - 1))
        return ["coordinator"] + ["server"] * s + ["worker"] * max(0, world - 1 - s)

    def check(self, cfg: JobConfig, world: int) -> None:
        check_roles(self.name, self.opts.servers + 1, world)
        check_no_buffers(cfg, self.name)
        try:
            model_plan(cfg, self.opts.sharding, self.opts.servers)
        except ConfigError:
            raise
        except Exception:  # a user model that cannot be built on the meta device
            pass
        _refuse_ignored(cfg, self.opts)
        if self.opts.batch == "job" and self.opts.portions and self.opts.portions > cfg.batch_size:
            raise ConfigError(f"portions={self.opts.portions} exceeds the batch of "
                              f"{cfg.batch_size} samples; use --set portions={cfg.batch_size} or fewer.")

    def run(self, job: Job, ctx: RankContext) -> RankResult:
        lay = Work(job, self.opts, ctx.world)
        role: Coordinator | Server | Worker
        if ctx.rank == 0:
            role = Coordinator(job, ctx, lay)
        elif ctx.rank in lay.servers:
            role = Server(job, ctx, lay, self.opts)
        else:
            role = Worker(job, ctx, lay)
        model = role.model if not isinstance(role, Server) else nn.Module()
        spec = LoopSpec(model=model, optimizer=None, own_step=role.step, after_update=role.after_update,
                        replicated=False, state=role.state, load_state=role.load_state,  # type: ignore[arg-type]
                        samples_at=lambda s: s * lay.samples, evaluates=ctx.rank == 0,
                        reports=ctx.rank == 0)
        return role.finish(run_loop(job, ctx, spec))
