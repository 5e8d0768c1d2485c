"""The replay process: actors add experience, learners sample it and send back new priorities.

It also relays parameters: the lead learner PUBLISHes every K updates, and an actor's ADD
reply carries the newest ones when it asks (every ``fetch_every`` env steps). The learner then
never serves (or waits on) an actor, so a slow or dead actor costs it nothing; the price is one
extra hop for parameters (counted like every other byte).

Per-actor figures (env steps, episodes, last-100 returns) are collected here because every
transition passes through; the lead learner reads them in each SAMPLE reply.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch

from polytrain.rl.checkpoint import load_part
from polytrain.rl.monitor import ReturnWindow
from polytrain.rl.protocol import Hub, Kind, Msg
from polytrain.rl.replay import PrioritizedReplay
from polytrain.rl.roles import RoleContext
from polytrain.rl.snapshot import replay_state, restore_replay, write_part


class ReplayServer:
    def __init__(self, ctx: RoleContext) -> None:
        cfg = ctx.cfg
        self.ctx = ctx
        self.width = ctx.row.width
        self.replay = PrioritizedReplay(cfg.replay_capacity, self.width, cfg.priority_alpha,
                                        seed=cfg.seed + 1)
        self.window = ReturnWindow()
        self.env_steps = 0
        self.episodes = 0
        self.per_actor: dict[int, dict[str, float]] = {
            r: {"env_steps": 0, "episodes": 0, "messages": 0} for r in ctx.ranks.actor_ranks}
        self.samples = 0
        self.batches = 0
        self.priority_updates = 0
        self.stale_updates = 0
        self.params: torch.Tensor | None = None
        self.wants: dict[int, tuple[int, bool]] = {}  # actor -> (version held, wants params)
        self.version = 0
        self.learning_starts = max(cfg.learning_starts, cfg.batch_size)
        self.busy_s = 0.0
        self.saved = 0  # the newest checkpoint written here: announced in every SAMPLE reply
        learners, actors = ctx.ranks.replica_ranks, ctx.ranks.actor_ranks
        clients = {r: "learner" for r in learners} | {r: "actor" for r in actors}
        depth = dict.fromkeys(learners, cfg.prefetch)  # SAMPLE requests in flight
        depth[ctx.ranks.lead] = cfg.prefetch + 2  # and, at a checkpoint, a SAVE and one more SAMPLE
        from polytrain.rl.learner import ReplayClient  # learners post their receives ahead

        pad = dict.fromkeys(learners, ReplayClient.reply_size(cfg.batch_size, cfg.sample_batches,
                                                              self.width))
        self.hub = Hub(ctx.links, ctx.recorder, clients, ctx.ranks.lead, cfg.actor_timeout_s, depth, pad)
        if ctx.extra.get("resume"):
            restore_replay(self, load_part(ctx.run_dir, ctx.cfg, ctx.rank))

    # ---- handlers ---------------------------------------------------------------------------
    def add(self, peer: int, msg: Msg) -> Msg | None:
        """fields = (env steps, n rows, n episodes, params version held, want params);
        floats = rows (n·width) | |TD| (n; none with initial_priority "max") | (return, length)
        per finished episode.
        The reply carries the newest parameters when the actor wants them (a fetch rides on
        the ADD round trip instead of costing its own)."""
        steps, n, n_ep = int(msg.field(0)), int(msg.field(1)), int(msg.field(2))
        data = msg.floats if msg.floats is not None else torch.empty(0)
        n_td = n if self.ctx.cfg.initial_priority == "actor" else 0
        rows = data[: n * self.width].view(n, self.width).numpy()
        td = data[n * self.width : n * self.width + n_td].numpy() if n_td else None
        episodes = data[n * self.width + n_td :].view(n_ep, 2).numpy()
        if n:
            self.replay.add(rows, td)  # td None: at the largest priority seen so far
        for ret, _ in episodes:
            self.window.add(float(ret))
        stats = self.per_actor[peer]
        stats["env_steps"] += steps
        stats["episodes"] += n_ep
        stats["messages"] += 1
        self.env_steps += steps
        self.episodes += n_ep
        self.wants[peer] = (int(msg.field(3)), bool(msg.field(4)))
        return self._ack(peer) if self._within_budget() else None

    def _ack(self, peer: int) -> Msg:
        have, want = self.wants.pop(peer)
        if want and self.params is not None and have < self.version:
            return Msg(Kind.OK, [self.version], floats=self.params, op="params_fetch")
        return Msg(Kind.OK, [self.version])

    def _within_budget(self) -> bool:
        """Rate limit: at most ``steps_per_update`` new transitions per learner update (after
        ``learning_starts``, plus one message per actor of slack). An actor beyond it waits for
        its ADD reply, blocked and idle, so on few cores the learner keeps its CPU."""
        ratio = self.ctx.cfg.steps_per_update
        if ratio <= 0:
            return True
        slack = self.ctx.cfg.send_every * len(self.per_actor)
        return self.replay.next_id <= self.learning_starts + slack + ratio * self.batches

    def _release(self) -> None:
        for peer in list(self.hub.deferred):
            if not self._within_budget():
                return
            self.hub.release(peer, self._ack(peer))

    def sample(self, peer: int, msg: Msg) -> Msg:
        """fields = (batch size B, β, batches K); ints/floats = ids and |TD| of the batches
        before. The reply holds K independently drawn batches, one after the other."""
        if msg.ints is not None and msg.floats is not None:
            live = self.replay.update(msg.ints.numpy(), msg.floats.numpy())
            self.priority_updates += live
            self.stale_updates += msg.ints.numel() - live
        train = self.window.mean
        fields = [self.env_steps, self.episodes, math.nan if train is None else train,
                  len(self.replay), self.hub.alive_actors(), self.saved]
        if len(self.replay) < self.learning_starts:
            return Msg(Kind.OK, fields)
        size, beta, k = int(msg.field(0)), msg.field(1), max(1, int(msg.field(2)))
        drawn = self.replay.sample(size, beta, k)  # k batches of `size` rows, one after the other
        self.samples += size * k
        self.batches += k
        floats = np.concatenate([drawn.rows.reshape(-1), drawn.weights])
        return Msg(Kind.OK, fields, torch.from_numpy(drawn.ids), torch.from_numpy(floats))

    def save(self, peer: int, msg: Msg) -> Msg:
        """fields = (checkpoint k, the lead's updates U, its clock): write this process's part of
        checkpoint k — it follows the SAMPLE that carried the priorities of all U updates."""
        k, updates = int(msg.field(0)), int(msg.field(1))
        write_part(self.ctx.run_dir, self.ctx.cfg, self.ctx.rank, k, replay_state(self, updates, k))
        self.saved = k
        return Msg(Kind.OK, [self.env_steps, self.episodes, self.replay.next_id, self.version, k])

    def publish(self, peer: int, msg: Msg) -> Msg | None:
        self.params = msg.floats
        self.version = int(msg.field(0))
        return None  # one-way

    # ---- loop -------------------------------------------------------------------------------
    def _timed(self, handler: Any) -> Any:
        def run(peer: int, msg: Msg) -> Msg:
            start = time.perf_counter()
            try:
                return handler(peer, msg)  # type: ignore[no-any-return]
            finally:
                self.busy_s += time.perf_counter() - start
        return run

    def serve(self) -> dict[str, Any]:
        handlers = {Kind.ADD: self.add, Kind.SAMPLE: self.sample, Kind.PUBLISH: self.publish,
                    Kind.SAVE: self.save}
        self.hub.after = self._release
        self.hub.serve({k: self._timed(h) for k, h in handlers.items()})
        return {
            "replay_size": len(self.replay),
            "replay_capacity": self.replay.capacity,
            "transitions_added": self.replay.next_id,
            "env_steps": self.env_steps,
            "episodes": self.episodes,
            "sampled": self.samples,
            "priority_updates": self.priority_updates,
            "stale_priority_updates": self.stale_updates,
            "params_version": self.version,
            "checkpoints": self.saved,
            "per_actor": {str(k): v for k, v in self.per_actor.items()},
            "lost": {str(k): v for k, v in self.hub.lost.items()},
            "busy_s": self.busy_s,
        }
