"""An actor process (`apex` and `gorila`): play, compute initial priorities, send, fetch.

Actor i of N explores with ε_i = 0.4^(1 + 7·i/(N−1)) (the Ape-X ladder: a few very greedy
actors and some exploring ones). Every ``send_every`` transitions it computes their n-step TD
errors with its own copy of the network (as both online and target net: an actor holds no
target net), and sends rows + |TD| + finished episodes in ONE message, so the replay needs no
forward pass and new data enters at a meaningful priority. Every ``fetch_every`` env steps its
next ADD also asks for newer parameters, which the replay relays from the lead learner (in
`apex` and `gorila` alike), so a fetch costs no round trip of its own.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import numpy as np
import torch

from polytrain.rl.acting import EpisodeRunner
from polytrain.rl.core import build_qnet, double_dqn_td, epsilon_ladder
from polytrain.rl.protocol import OPS, Kind, Msg, isend_msg, recv_msg, send_msg
from polytrain.rl.roles import RoleContext
from polytrain.runtime.flat import load_flat


class Halted(Exception):
    """A server answered HALT: the run is over."""

    def __init__(self, server: int) -> None:
        super().__init__(f"halted by rank {server}")
        self.server = server


def priorities(net: torch.nn.Module, ctx: RoleContext, rows: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        _, td = double_dqn_td(net, net, ctx.row, torch.from_numpy(rows))
    return td.abs().numpy()


class Actor:
    def __init__(self, ctx: RoleContext) -> None:
        cfg = ctx.cfg
        self.ctx = ctx
        self.index = ctx.ranks.actor_ranks.index(ctx.rank)
        self.epsilon = epsilon_ladder(cfg.actors, cfg.eps_base, cfg.eps_alpha)[self.index]
        torch.manual_seed(cfg.seed)  # the learner's initial network, until the first fetch
        self.net = build_qnet(cfg.model, cfg.info, cfg.hidden, cfg.depth)
        # a resumed run's actors play new episodes (they are not in the checkpoint): seeds per checkpoint
        resumed_from = int(ctx.extra.get("save", 0))  # type: ignore[call-overload]
        self.runner = EpisodeRunner(ctx, cfg.seed + 1000 * (self.index + 1) + 100_003 * resumed_from)
        assert ctx.ranks.replay_rank is not None
        self.replay = ctx.ranks.replay_rank
        self.link = ctx.link(self.replay)
        self.fetch_due = True
        self.version = 0
        self.fetches = 0
        self.sent_steps = 0
        self.wait_s = 0.0
        self.in_flight: list[tuple[Any, torch.Tensor]] | None = None  # the last ADD's sends

    def _send(self, rows: list[np.ndarray], episodes: list[tuple[float, int]]) -> None:
        """ADD without waiting: the reply is taken before the next request (see _collect)."""
        block = np.stack(rows) if rows else np.zeros((0, self.ctx.row.width), np.float32)
        own = bool(rows) and self.ctx.cfg.initial_priority == "actor"  # else the replay uses its max
        td = priorities(self.net, self.ctx, block) if own else np.zeros(0, np.float32)
        ep = np.asarray(episodes, dtype=np.float32).reshape(-1)
        floats = torch.from_numpy(np.concatenate([block.reshape(-1), td.astype(np.float32), ep]))
        steps = self.runner.steps - self.sent_steps
        self._collect()
        fields = [steps, len(rows), len(episodes), self.version, self.fetch_due]
        msg = Msg(Kind.ADD, fields, floats=floats)
        self.in_flight = isend_msg(self.link, self.replay, msg, OPS[Kind.ADD])
        self.sent_steps = self.runner.steps
        self.fetch_due = False

    def _collect(self) -> None:
        """Take the reply to the ADD in flight, if any. The actor plays on while the replay
        stores its batch; it waits here only when the replay is slow, or holds the reply back
        to rate-limit actors (then this is where the actor sleeps)."""
        if self.in_flight is None:
            return
        start = time.perf_counter()
        reply = recv_msg(self.link, self.replay)
        for work, _ in self.in_flight:
            work.wait()
        self.in_flight = None
        self.wait_s += time.perf_counter() - start
        if reply.kind == Kind.HALT:
            raise Halted(self.replay)
        if reply.floats is not None:  # the parameters we asked for
            load_flat(self.net, reply.floats)
            self.version = int(reply.field(0))
            self.fetches += 1

    def run(self) -> dict[str, Any]:
        cfg = self.ctx.cfg
        rows: list[np.ndarray] = []
        episodes: list[tuple[float, int]] = []
        start = time.perf_counter()
        try:
            while True:
                if self.runner.steps % cfg.fetch_every == 0:
                    self.fetch_due = True  # asked for with the next ADD
                new, ended = self.runner.step(self.net, self.epsilon)
                rows += new
                if ended is not None:
                    episodes.append(ended)
                    self.ctx.recorder.emit("episode", actor=self.index, epsilon=self.epsilon, ret=ended[0],
                                           length=ended[1], actor_steps=self.runner.steps)
                if len(rows) >= cfg.send_every:
                    self._send(rows, episodes)
                    rows, episodes = [], []
        except Halted:
            pass
        self._goodbye()
        wall = time.perf_counter() - start
        return {"actor": self.index, "epsilon": self.epsilon, "env_steps": self.runner.steps,
                "actor_steps_per_s": self.runner.steps / wall, "param_fetches": self.fetches,
                "param_version": self.version, "wait_s": self.wait_s, "wall_s": wall}

    def _goodbye(self) -> None:
        """Tell the replay we are leaving (after its HALT too), so it does not wait for us."""
        # RuntimeError: it had already given up on us (declared us lost) and left
        with contextlib.suppress(RuntimeError):
            self._collect()
        with contextlib.suppress(RuntimeError):
            send_msg(self.link, self.replay, Msg(Kind.BYE), "control")


def run_actor(ctx: RoleContext) -> dict[str, Any]:
    return Actor(ctx).run()
