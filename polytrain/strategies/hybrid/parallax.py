"""``hybrid-ps-ar``: Parallax's hybrid — parameter servers for sparse parameters, all-reduce for
dense ones, chosen per parameter.

Source: S. Kim, G.-I. Yu, H. Park, S. Cho, E. Jeong, H. Ha, S. Lee, J. S. Jeong, B.-G. Chun,
"Parallax: Sparsity-aware Data Parallel Training of Deep Neural Networks", EuroSys 2019 (the
survey 004 §4.3, ref. [7]): all-reduce suits dense updates, parameter servers suit sparse ones,
so Parallax sends each variable the way that suits its gradient.

    polytrain train --strategy hybrid-ps-ar --procs 4 --model sparse-bow --optimizer sgd --lr 0.5

Per parameter (:mod:`.parallax_plan`): ``nn.Embedding``/``nn.EmbeddingBag`` weights, and any
parameter whose measured row density (rows with a non-zero gradient, on worker 0's first batch)
is below ``sparse_threshold``, go to the servers, rows partitioned over them by ``hash`` or
``range``; each step a worker pushes only the rows it touched and pulls only the rows that
changed (:mod:`.parallax_rows`). Every other parameter is all-reduced among the workers by DDP
(the sparse ones are left out of DDP), overlapped with backward, and updated by the job's
optimizer on every worker. The run reports each parameter's path and why (summary.json
``strategy_metrics.paths``, and a table on the console).

Ranks: ``servers=0`` (the default) co-locates a server with every worker, as Parallax runs one
server per machine: all W = --procs ranks train, and rank w also owns partition w of the rows.
``servers=S`` makes the last S ranks dedicated servers (no training): workers come first, so
rank 0 is worker 0, which evaluates and writes the trained model (its replica is complete).

Synchronous (the only mode here): a step is complete on every worker before the next begins, so
with ``--optimizer sgd`` (no weight decay) training equals ``single``. Simplified against the
paper: no asynchronous mode; no automatic choice of the number of servers or of partitions per
variable (Parallax searches it); no local aggregation of a machine's workers before the push
(one worker per rank); sparse rows update lazily (see :mod:`.parallax_rows`); sparsity is
measured once, on one batch, instead of read off TensorFlow's IndexedSlices gradient type.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from polytrain.comm.ddp_hooks import counted_ddp
from polytrain.comm.groups import GroupComm, new_groups
from polytrain.config import JobConfig
from polytrain.errors import ConfigError
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.loop import LoopSpec, run_loop
from polytrain.strategies.base import Strategy
from polytrain.strategies.data.allreduce import check_divisible
from polytrain.strategies.hybrid.parallax_plan import Assignment, assign_paths, paths_table, row_density
from polytrain.strategies.hybrid.parallax_rows import RowExchange, RowServer, SparseParam, write_rows
from polytrain.strategies.ps.strategy import check_roles


class HybridOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    servers: int = Field(0, ge=0, description="dedicated server ranks; 0: one on every worker")
    partition: Literal["hash", "range"] = "hash"
    sparse_threshold: float = Field(0.1, ge=0.0, le=1.0,
                                    description="row density below which a parameter goes to the servers")


def _hook(comm: GroupComm, ctx: RankContext) -> Any:
    """DDP comm hook: the bucket's mean over the workers, through the accounted communicator."""
    rec = ctx.recorder

    # unannotated: DDP checks the hook's annotation at run time, which a string annotation fails
    def hook(_state, bucket):  # type: ignore[no-untyped-def]
        buf = bucket.buffer().div_(comm.world)
        start, index = rec.now(), bucket.index()
        return comm.all_reduce_future(
            buf, on_done=lambda: rec.add_span("allreduce", "comm", start, rec.now(), bucket=index))

    return hook


def _server_state(exchange: RowExchange) -> dict[str, Any]:
    """LoopSpec hooks that put a server's rows and optimizer state into its rank's checkpoint
    (every rank writes its own file: a worker's model replica and dense optimizer, a server's rows)."""
    server = exchange.server
    if server is None:
        return {}
    return {"state": server.state, "load_state": server.load_state}


class HybridPsAr(Strategy):
    name = "hybrid-ps-ar"
    family = "hybrid"
    summary = "Parallax: sparse parameters (embeddings) on parameter servers as rows, dense ones all-reduced"
    Options = HybridOptions

    @property
    def opts(self) -> HybridOptions:
        return self.options  # type: ignore[return-value]

    def ranks(self, world: int) -> tuple[list[int], list[int]]:
        """(server ranks, worker ranks)."""
        s = self.opts.servers
        if s == 0:
            return list(range(world)), list(range(world))
        return list(range(world - s, world)), list(range(world - s))

    def roles(self, world: int) -> list[str]:
        workers = self.ranks(world)[1]
        return ["worker" if r in workers else "server" for r in range(world)]

    def check(self, cfg: JobConfig, world: int) -> None:
        workers = check_roles(self.name, self.opts.servers, world) if self.opts.servers else world
        check_divisible(cfg, workers, self.name)
        if cfg.optimizer == "adamw":  # its sparse rows keep their own sgd/momentum/adam state
            raise ConfigError(f"Strategy '{self.name}' does not support --optimizer adamw: its "
                              "servers update sparse rows with their own sgd, momentum or adam. "
                              "Use --optimizer adam (or sgd, momentum).")

    def run(self, job: Job, ctx: RankContext) -> RankResult:
        servers, workers = self.ranks(ctx.world)
        model = job.build_model()
        paths = self._paths(job, ctx, model, len(workers))
        named = dict(model.named_parameters())
        sparse = [a for a in paths if a.path == "ps"]
        specs = [SparseParam(a.name, a.shape[0], named[a.name][0].numel()) for a in sparse]
        exchange = RowExchange(ctx.comm, specs, self.opts.partition, workers, servers)
        if ctx.rank in servers:
            cfg = job.config
            exchange.server = RowServer(
                specs, [named[a.name].detach() for a in sparse], self.opts.partition,
                servers.index(ctx.rank), len(servers), len(workers), optimizer=cfg.optimizer,
                lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
        groups = [workers] + ([servers] if self.opts.servers else [])
        wcomm = new_groups(ctx.comm, groups) if len(workers) > 1 else None
        if ctx.rank in workers:
            result = self._work(job, ctx, model, exchange, sparse, workers, wcomm)
        else:
            result = self._serve(job, ctx, model, exchange)
        stats = {"rank": ctx.rank, "server": exchange.server is not None,
                 "rows_held": exchange.server.held if exchange.server else 0,
                 "rows_received": exchange.server.rows_received if exchange.server else 0,
                 "rows_pushed": exchange.rows_pushed, "rows_pulled": exchange.rows_pulled,
                 "bytes_by_op": ctx.comm.by_op()}
        everyone = ctx.comm.gather_json(stats)
        if everyone is not None:
            result.strategy_metrics = self._metrics(paths, everyone, job.steps, len(workers))
        return result

    def _paths(self, job: Job, ctx: RankContext, model: nn.Module, workers: int) -> list[Assignment]:
        """Rank 0 measures each parameter's row density on worker 0's first batch and assigns
        the paths; every rank takes its answer (so all agree)."""
        found: list[dict[str, Any]] | None = None
        if ctx.rank == 0:
            x, y = job.batches().shard(1, 0, workers)
            model.zero_grad(set_to_none=True)
            job.forward_loss(model, x, y).backward()
            density = {n: row_density(p.grad) for n, p in model.named_parameters()}
            model.zero_grad(set_to_none=True)
            found = [a.to_json() for a in assign_paths(model, density, self.opts.sparse_threshold)]
        got = ctx.comm.broadcast_json(found, src=0)
        return [Assignment(**{**a, "shape": tuple(a["shape"])}) for a in got]

    def _work(self, job: Job, ctx: RankContext, model: nn.Module, exchange: RowExchange,
              sparse: list[Assignment], workers: list[int], wcomm: GroupComm | None) -> RankResult:
        named = dict(model.named_parameters())
        held = [named[a.name] for a in sparse]
        dense = [p for n, p in named.items() if n not in {a.name for a in sparse}]
        forward: Any = model
        if dense and wcomm is not None:
            DDP._set_params_and_buffers_to_ignore_for_model(model, [a.name for a in sparse])
            forward = counted_ddp(model, wcomm, process_group=wcomm.group,
                                  device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
            forward.register_comm_hook(None, _hook(wcomm, ctx))
        optimizer = job.make_optimizer(dense) if dense else None
        rec, specs = ctx.recorder, exchange.params

        def step(i: int, x: torch.Tensor, y: torch.Tensor) -> float:
            if optimizer is not None:
                optimizer.zero_grad(set_to_none=True)
            for p in held:
                p.grad = None
            with rec.span("forward", step=i):
                loss = job.forward_loss(forward, x, y)
            with rec.span("backward", step=i):
                loss.backward()  # DDP all-reduces the dense gradients meanwhile
            grads = [torch.zeros(s.rows, s.width) if p.grad is None else p.grad.view(s.rows, s.width)
                     for p, s in zip(held, specs, strict=True)]
            with rec.span("ps_rows", "comm", step=i):
                write_rows(held, exchange.step(grads), specs)
            if optimizer is not None:
                with rec.span("optimizer", step=i):
                    optimizer.step()
            return float(loss.detach())

        first = workers.index(ctx.rank) == 0
        spec = LoopSpec(model=model, optimizer=optimizer, step_fn=step, part=workers.index(ctx.rank),
                        parts=len(workers), replicated=False, evaluates=first, final_eval=first,
                        **_server_state(exchange))
        result = run_loop(job, ctx, spec)
        result.role = "worker"
        return result

    def _serve(self, job: Job, ctx: RankContext, model: nn.Module, exchange: RowExchange) -> RankResult:
        """A dedicated server: one exchange per step in the shared loop, no training of its own."""

        def serve(i: int) -> float:
            with ctx.recorder.span("serve_rows", "compute", step=i):
                exchange.step(None)
            return float("nan")

        spec = LoopSpec(model=model, optimizer=None, own_step=serve, replicated=False, reports=False,
                        evaluates=False, final_eval=False, **_server_state(exchange))
        result = run_loop(job, ctx, spec)
        result.role, result.steps, result.final_loss = "server", 0, None
        return result

    def _metrics(self, paths: list[Assignment], everyone: list[dict[str, Any]], steps: int,
                 workers: int) -> dict[str, Any]:
        servers = [r for r in everyone if r["server"]]

        def op_bytes(*ops: str) -> int:
            return sum(r["bytes_by_op"].get(op, 0) for r in everyone for op in ops)

        ps_bytes = op_bytes("ps_header", "ps_push_rows", "ps_pull_rows")
        return {
            "paths": [a.to_json() for a in paths],
            "console_table": paths_table(paths),
            "ps_params": sum(1 for a in paths if a.path == "ps"),
            "allreduce_params": sum(1 for a in paths if a.path == "allreduce"),
            "servers": len(servers), "workers": workers,
            "colocated": self.opts.servers == 0, "partition": self.opts.partition,
            "sparse_threshold": self.opts.sparse_threshold,
            "server_rows_held": [r["rows_held"] for r in servers],
            "server_rows_received": [r["rows_received"] for r in servers],
            "rows_pushed_per_step": sum(r["rows_pushed"] for r in everyone) / max(steps, 1),
            "rows_pulled_per_step": sum(r["rows_pulled"] for r in everyone) / max(steps, 1),
            "ps_bytes_per_step": ps_bytes / max(steps, 1),
            "allreduce_bytes_per_step": op_bytes("allreduce") / max(steps, 1),
        }
