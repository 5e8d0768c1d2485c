"""`gorila` (Nair et al. 2015): actors, a shared replay, several learners, sharded parameter servers.

    actors ──ADD──▶ replay ◀──SAMPLE── learner 0..L-1 ──push grad slice k──▶ ps shard k (0..S-1)
       ▲               │                       ▲                                   │
       └──FETCH────────┘◀─PUBLISH (learner 0)──┴────────── updated slice ◀─────────┘

Each learner samples the shared replay (uniform by default, ``alpha = 0``, as in the paper;
Gorila's "replay per actor or shared": shared here), computes a double-DQN gradient against its
own target network, and pushes it to every shard; each shard applies it at once with its own
optimizer (Downpour's asynchronous rule) — no learner waits for another, so a gradient may be
computed on parameters some updates old (the shards measure that lag). The reply is the updated
shard, so a learner always goes on from the newest parameters. Every ``target_update`` (C) of
its own updates a learner copies its parameters into its target network.

The servers are polytrain's `ps` servers (:mod:`polytrain.strategies.ps.server`, ``async``
consistency, ``size`` sharding), reused as they are. They serve the learners only: a `ps` server
finishes when every client has said DONE, which a killed actor never would. So actors take the
servers' parameters from the replay's relay instead — learner 0 publishes what the servers last
sent it every ``publish_every`` (K) updates, and actors FETCH every ``fetch_every`` env steps —
one hop more than in the paper, which lets the run survive a lost actor.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from polytrain.rl.checkpoint import load_part
from polytrain.rl.core import build_qnet
from polytrain.rl.dqn import make_learner
from polytrain.rl.learner import Publisher, ReplayClient, batch_tensors, learn_loop
from polytrain.rl.monitor import Counters, Monitor
from polytrain.rl.protocol import Kind, Msg, send_msg, wind_down
from polytrain.rl.replay import Batch
from polytrain.rl.roles import RoleContext
from polytrain.rl.snapshot import Saver, learner_state, restore_learner, write_part
from polytrain.runtime.flat import flat_params, load_flat


def _plan(ctx: RoleContext) -> Any:
    from polytrain.runtime.sharding import param_infos, size_plan

    torch.manual_seed(ctx.cfg.seed)  # the same initial network on every rank
    net = build_qnet(ctx.cfg.model, ctx.cfg.info, ctx.cfg.hidden, ctx.cfg.depth)
    return size_plan(param_infos(net), len(ctx.ranks.server_ranks)), flat_params(net)


def run_shard(ctx: RoleContext, index: int) -> dict[str, Any]:
    from polytrain.strategies.ps.checkpoint import load_server_state, server_state
    from polytrain.strategies.ps.consistency import make_consistency
    from polytrain.strategies.ps.server import ParameterServer

    plan, flat = _plan(ctx)
    learners = list(ctx.ranks.replica_ranks)
    server = ParameterServer(ctx.net_comm, learners, plan.gather(flat, index), ctx.cfg.optimizer,
                             make_consistency("async", len(learners)), lr=ctx.cfg.lr)
    if ctx.extra.get("resume"):
        load_server_state(server, load_part(ctx.run_dir, ctx.cfg, ctx.rank))
    # a checkpoint: once every learner has sent SAVE(k) (each after its last push before it)
    server.on_save = lambda k: write_part(ctx.run_dir, ctx.cfg, ctx.rank, k,
                                          {"save": k, **server_state(server)})
    server.serve()  # until every learner has sent DONE
    return {"shard": index, **server.stats()}


def run_gorila_learner(ctx: RoleContext, index: int) -> dict[str, Any]:
    from polytrain.strategies.ps.client import PSClient

    cfg = ctx.cfg
    learner = make_learner(ctx)
    plan, _ = _plan(ctx)
    ps = PSClient(ctx.net_comm, plan, list(ctx.ranks.server_ranks), sparse=False)
    client = ReplayClient(ctx)
    lead = index == 0
    monitor = Monitor(cfg, ctx.recorder) if lead else None
    publisher = Publisher(learner.net, cfg.publish_every) if lead else None
    c = Counters()
    if ctx.extra.get("resume"):
        state = load_part(ctx.run_dir, ctx.cfg, ctx.rank)
        c.updates = restore_learner(learner, state, publisher)
        if monitor is not None:
            monitor.eval_index = state["eval_index"]
    saver = Saver(ctx, lead, lambda k: learner_state(
        learner, c.updates, k, False, publisher, monitor.eval_index if monitor is not None else 0), ps)

    def learn(batch: Batch) -> np.ndarray:
        grad, _, td_abs = learner.gradient(*batch_tensors(batch))
        ps.push(grad, clock=c.updates + 1, need=-1)  # async: the reply never waits
        flat, _, _ = ps.wait()
        load_flat(learner.net, flat)
        c.updates += 1
        if c.updates % cfg.target_update == 0:
            learner.sync_target()
        return td_abs

    def between() -> Msg | None:
        return publisher.due(c.updates) if publisher is not None else None

    timing = learn_loop(ctx, client, learn, c, monitor, learner.net, between, saver)
    if lead:
        wind_down(ctx.links, (client.replay,))
    else:  # every reply in flight was taken (learn_loop drained them): now say goodbye
        send_msg(ctx.link(client.replay), client.replay, Msg(Kind.BYE), "control")
    ps.done()
    result: dict[str, Any] = {"learner": index, "ps_wait_s": ps.wait_s, **timing}
    if monitor is not None and publisher is not None:
        result.update(monitor.final(learner.net, c))
        result.update(env_steps=c.env_steps, episodes=c.episodes, replay_size=c.replay_size,
                      params_published=publisher.version)
        ctx.save_model(learner.net)
    return result
