"""Checkpoints of a parameter-server job: server state at a consistent cut, re-sharded on resume.

A checkpoint at step c (``--checkpoint-every``) is written when every worker has pushed c: each
worker writes its own file (its RNG), then sends SAVE to every server and waits for the acks
(:meth:`PSClient.save`). A server that has every worker's SAVE holds exactly the pushes up to c
(:mod:`.server`) and writes its file: shard, optimizer state, consistency counters, measurements.
Servers 1..S-1 then tell server 0 (rank 0), which seals the checkpoint once all have written.

A worker's file holds its copy of the parameters (not necessarily the servers': under async
with ``n_fetch`` > 1 it fetches only now and then) and its RNG; a checkpoint step always pushes
what the worker has accumulated, so no push is half in the checkpoint.

Files: ``rank{r}.pt`` for every rank, servers first (``ps``: ranks 0..S-1, then the workers).
Resuming with another number of servers S' (or another sharding) re-shards: every new server
reads all S old server files, puts each shard (and each element-wise optimizer tensor) back into
the full flat vector with the old plan, and takes its part with the new plan. The consistency
counters and measurements are the same on every server (every push goes to all), so server 0's
are kept. A worker's file is found by its place among the workers (rank S + w), which does not
change when S does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from polytrain.errors import CheckpointError
from polytrain.runtime.checkpoint import CheckpointStore
from polytrain.runtime.job import Job, RankContext
from polytrain.runtime.loop import commit_checkpoint, newest_checkpoint
from polytrain.runtime.sharding import ShardPlan
from polytrain.strategies.ps.client import PSClient
from polytrain.strategies.ps.server import ParameterServer


def server_state(server: ParameterServer) -> dict[str, Any]:
    """What a checkpoint keeps of a server: shard, optimizer, consistency and measurements."""
    def counts(c: Counter[int]) -> torch.Tensor:
        return torch.tensor(sorted(c.items()), dtype=torch.int64).reshape(-1, 2)

    return {"shard": server.shard.clone(), "optimizer": server.optimizer.state_dict(),
            "policy": server.policy.state(), "version": torch.tensor(server.version),
            "read_step": torch.tensor(server.read_step), "read_version": torch.tensor(server.read_version),
            "staleness": counts(server.staleness), "update_lag": counts(server.update_lag)}


def load_server_state(server: ParameterServer, state: dict[str, Any]) -> None:
    with torch.no_grad():
        server.param.copy_(state["shard"])
    server.optimizer.load_state_dict(state["optimizer"])
    server.policy.load_state(state["policy"])
    server.version = int(state["version"])
    server.read_step = [int(v) for v in state["read_step"].tolist()]
    server.read_version = [int(v) for v in state["read_version"].tolist()]
    server.staleness = Counter({k: n for k, n in state["staleness"].tolist()})
    server.update_lag = Counter({k: n for k, n in state["update_lag"].tolist()})


def rank_files(ckpt: Path) -> int:
    return len(list(ckpt.glob("rank*.pt")))


def server_saver(job: Job, ctx: RankContext, server: ParameterServer, servers: list[int],
                 sharding: str) -> Any:
    """The ``on_save`` of server ``ctx.rank``: write its state; server 0 seals the checkpoint."""

    def save(step: int) -> None:
        state = {**server_state(server), "sharding": sharding, "servers": torch.tensor(len(servers))}
        ctx.recorder.tally(step, ctx.comm.bytes_sent)
        ctx.checkpoints.write_rank(step, ctx.rank, state)
        mark = torch.tensor([step], dtype=torch.int64)
        if ctx.rank != servers[0]:
            ctx.comm.send(mark, servers[0], op="ps_saved")
            return
        for rank in servers[1:]:
            ctx.comm.recv(mark, rank, op="ps_saved")
        commit_checkpoint(job, ctx, step)

    return save


def restore_server(ctx: RankContext, server: ParameterServer, index: int, workers: int,
                   plan: ShardPlan, plan_of: Any) -> int:
    """Load server ``index``'s state from the newest good checkpoint (re-sharding when it was
    written by another number of servers or another sharding); returns its step.
    ``plan_of(kind, servers)``: the model's plan for another layout."""
    ckpt = newest_checkpoint(ctx)
    old_servers = rank_files(ckpt) - workers
    if old_servers < 1:
        raise CheckpointError(f"Checkpoint {ckpt} holds {rank_files(ckpt)} rank files, fewer than "
                              f"the {workers} workers plus one server this job resumes with.")
    first = CheckpointStore.load_rank(ckpt, 0)
    kind = str(first["sharding"])
    if old_servers == plan.servers and kind == plan.kind:
        state = first if index == 0 else CheckpointStore.load_rank(ckpt, index)
    else:
        olds = [first] + [CheckpointStore.load_rank(ckpt, s) for s in range(1, old_servers)]
        state = reshard(olds, plan_of(kind, old_servers), plan, index)
    load_server_state(server, state)
    return CheckpointStore.step_of(ckpt)


def reshard(olds: list[dict[str, Any]], old: ShardPlan, new: ShardPlan, index: int) -> dict[str, Any]:
    """Server ``index``'s state under plan ``new``, from every server's state under ``old``."""
    def regather(parts: list[torch.Tensor]) -> torch.Tensor:
        flat = torch.zeros(old.total, dtype=parts[0].dtype)
        for s, part in enumerate(parts):
            old.scatter(flat, s, part)
        return new.gather(flat, index).clone()

    sizes = old.sizes()
    opt = olds[0]["optimizer"]
    slots = opt["state"].get(0, {})
    merged: dict[str, Any] = {}
    for key, value in slots.items():
        if isinstance(value, torch.Tensor) and value.numel() == sizes[0] and value.dim() == 1:
            merged[key] = regather([o["optimizer"]["state"][0][key] for o in olds])
        else:  # a scalar (e.g. Adam's step count): the same on every server
            merged[key] = value
    state = dict(olds[0])
    state["shard"] = regather([o["shard"] for o in olds])
    state["optimizer"] = {"state": {0: merged} if slots else {}, "param_groups": opt["param_groups"]}
    return state


def worker_state(ctx: RankContext, model: nn.Module) -> dict[str, Any]:
    """A worker's part: its copy of the parameters (under async with n_fetch > 1 older than the
    servers') and its RNG."""
    return {"model": model.state_dict(), "rng": torch.get_rng_state(), "rank": torch.tensor(ctx.rank)}


def restore_worker(ctx: RankContext, model: nn.Module, index: int, workers: int,
                   extra: Callable[[dict[str, Any]], None] | None = None) -> int:
    """Load worker ``index``'s parameters and RNG from the newest good checkpoint; its step.
    ``extra`` receives the worker's whole saved state (e.g. its codec's residuals)."""
    ckpt = newest_checkpoint(ctx)
    old_servers = rank_files(ckpt) - workers
    state = CheckpointStore.load_rank(ckpt, old_servers + index)
    model.load_state_dict(state["model"])
    torch.set_rng_state(state["rng"])
    if extra is not None:
        extra(state)
    return CheckpointStore.step_of(ckpt)


def attach_server(job: Job, ctx: RankContext, server: ParameterServer, servers: list[int],
                  sharding: str = "size") -> int:
    """For strategies that reuse the server with a fixed layout (distbelief): write checkpoints
    when the clients ask (``servers``: every server rank, the first seals), and on resume load
    this rank's own file. Returns the step to continue from."""
    server.on_save = server_saver(job, ctx, server, servers, sharding)
    if not ctx.resume:
        return 0
    ckpt = newest_checkpoint(ctx)
    load_server_state(server, CheckpointStore.load_rank(ckpt, ctx.rank))
    return CheckpointStore.step_of(ckpt)


def save_client(ctx: RankContext, module: nn.Module, client: PSClient, step: int) -> None:
    """A client rank's part of the checkpoint at ``step``: its file, then SAVE to its servers."""
    ctx.checkpoints.write_rank(step, ctx.rank, worker_state(ctx, module))
    client.save(step)


def restore_client(ctx: RankContext, module: nn.Module) -> int:
    """Load a client rank's own file (parameters, RNG); returns the step to continue from."""
    ckpt = newest_checkpoint(ctx)
    state = CheckpointStore.load_rank(ckpt, ctx.rank)
    module.load_state_dict(state["model"])
    torch.set_rng_state(state["rng"])
    return CheckpointStore.step_of(ckpt)
