"""Inside one RL process: join the group, run this rank's role, return its figures."""

from __future__ import annotations

import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from polytrain.comm import Comm
from polytrain.metrics.recorder import Recorder
from polytrain.rl.config import make_rl_config
from polytrain.rl.links import Link, make_links
from polytrain.rl.roles import RoleContext, describe, layout_ranks, role


def _dispatch(ctx: RoleContext) -> dict[str, Any]:
    name, index = role(ctx.ranks, ctx.rank)
    algo = ctx.cfg.algo
    if algo == "dqn":
        from polytrain.rl.dqn import run_dqn

        return run_dqn(ctx)
    if name == "actor":
        from polytrain.rl.actor import run_actor

        return run_actor(ctx)
    if name == "replay":
        from polytrain.rl.replay_server import ReplayServer

        return ReplayServer(ctx).serve()
    if name == "server":
        from polytrain.rl.gorila import run_shard

        return run_shard(ctx, index)
    if algo == "apex":
        from polytrain.rl.apex import run_apex_learner

        return run_apex_learner(ctx)
    from polytrain.rl.gorila import run_gorila_learner

    return run_gorila_learner(ctx, index)


def _warm_up(ctx_role: str) -> None:
    """Pay one-off import costs before the shared clock starts, so that time-to-target measures
    learning. Building the first optimizer imports torch._dynamo (~1.5 s idle, 5 s+ on a busy
    2-core box); actors build none, so without this the actors would get a head start."""
    import gymnasium  # noqa: F401
    import torch

    import polytrain.rl.actor
    import polytrain.rl.dqn  # noqa: F401

    if ctx_role != "actor":
        torch.optim.Adam([torch.zeros(1, requires_grad=True)])


def _received_by_peer(comm: Comm) -> dict[str, int]:
    """What this rank received from each peer: how a dead actor's sent bytes are still measured."""
    out: dict[str, int] = defaultdict(int)
    for (peer, _), n in comm.received.items():
        out[str(peer)] += n
    return dict(out)


def run_role(payload: dict[str, Any], rank: int, recorder: Recorder) -> dict[str, Any]:
    import resource

    import torch.distributed as dist

    from polytrain.launch.worker import init_distributed

    cfg = make_rl_config(payload["config"])
    world = int(payload["world"])
    ranks = layout_ranks(cfg)
    comm = None
    links: dict[int, Link] = {}
    _warm_up(role(ranks, rank)[0])
    if world > 1:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(payload["port"])
        os.environ.update(payload.get("env") or {})  # the launcher's private store
        init_distributed("gloo", rank, world, cfg.timeout_s)
        comm = Comm(rank, world)
        if ranks.replay_rank is not None:  # one group per (replay, client) pair
            clients = [*ranks.replica_ranks, *ranks.actor_ranks]
            links = make_links(comm, ranks.replay_rank, clients, cfg.timeout_s)
        dist.barrier()  # everyone is up: start the shared clock together
    extra: dict[str, object] = {"resume": bool(payload.get("resume"))}
    if extra["resume"]:  # as the training loop does: the record and the clock go on from the checkpoint
        from polytrain.rl.resume import resume_point

        point = resume_point(Path(payload["run_dir"]), cfg)
        recorder.start_clock()  # (again below, after the barrier): the resume event at the cut's time
        recorder.rewind(point["env_steps"], point["t"], env_steps=point["env_steps"],
                        updates=point["updates"])
        extra["save"] = point["save"]
    recorder.start_clock()
    cpu0 = time.process_time()  # CPU this process used from here on (its threads included)
    recorder.emit("start", role=describe(ranks, rank), epoch=time.time())
    ctx = RoleContext(cfg, rank, ranks, recorder, Path(payload["run_dir"]), comm, links, extra=extra)
    result = _dispatch(ctx)
    record: dict[str, Any] = {"rank": rank, "role": describe(ranks, rank), "result": result,
                              "cpu_s": time.process_time() - cpu0,
                              "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if comm is not None:
        record.update(comm.summary(), received_by_peer=_received_by_peer(comm))
    # No destroy_process_group(): it is local bookkeeping only, and a peer that died can make
    # gloo's teardown wait on its sockets; the process exits right after this anyway.
    return record
