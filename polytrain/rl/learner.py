"""The learner's side of replay (shared by `apex` and `gorila`), with batches in flight.

Each SAMPLE request carries the new priorities of the batch before, and ``prefetch`` (D)
requests are kept in flight, so the replay samples while the learner learns (as in Ape-X)::

    learner:  recv b_t | send req(t+D, prio t−1) | update on b_t ......... | recv b_t+1 | ...
    replay:            |  apply prio t−1, sample b_t+D, reply ----------> (queued)

The learner only waits when the replay is D batches behind — on a busy machine a process
round trip costs milliseconds of scheduling latency, more than the update itself. A priority
lands D batches late; ids guard against slots overwritten meanwhile.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from polytrain.rl.actor import Halted
from polytrain.rl.core import flat_params
from polytrain.rl.monitor import Counters, Monitor
from polytrain.rl.replay import Batch, beta_at
from polytrain.rl.roles import RoleContext
from polytrain.rl.wire import OPS, Kind, Msg, isend_msg, nan_to_none, recv_msg


class ReplayClient:
    """SAMPLE requests with up to ``depth`` in flight (replies come back in order)."""

    def __init__(self, ctx: RoleContext) -> None:
        assert ctx.ranks.replay is not None
        self.comm = ctx.net_comm
        self.replay = ctx.ranks.replay
        self.width = ctx.layout.width
        self.batch_size = ctx.cfg.batch_size
        self.depth = ctx.cfg.prefetch
        self.pending: tuple[np.ndarray, np.ndarray] | None = None
        self.in_flight: deque[list[tuple[Any, torch.Tensor]]] = deque()  # sends of each request
        self.wait_s = 0.0

    @property
    def outstanding(self) -> int:
        return len(self.in_flight)

    def request(self, beta: float, before: Msg | None = None) -> None:
        """Ask for a batch (non-blocking), after the one-way message ``before`` if given."""
        ids = td = None
        if self.pending is not None:
            ids = torch.from_numpy(self.pending[0])
            td = torch.from_numpy(self.pending[1].astype(np.float32))
            self.pending = None
        sends = [] if before is None else isend_msg(self.comm, self.replay, before, OPS[before.kind])
        msg = Msg(Kind.SAMPLE, [self.batch_size, beta], ids, td)
        self.in_flight.append(sends + isend_msg(self.comm, self.replay, msg, OPS[Kind.SAMPLE]))

    def receive(self) -> tuple[Sequence[float], Batch | None]:
        """(replay figures, the batch or None while the replay is still filling); raises Halted."""
        start = time.perf_counter()
        _, reply = recv_msg(self.comm, self.replay)
        self.wait_s += time.perf_counter() - start
        for work, _ in self.in_flight.popleft():  # the replay read them before it replied
            work.wait()
        if reply.kind == Kind.HALT:
            raise Halted(self.replay)
        if reply.ints is None or reply.floats is None:
            return reply.fields, None
        b = reply.ints.numel()
        rows = reply.floats[: b * self.width].view(b, self.width).numpy()
        return reply.fields, Batch(reply.ints.numpy(), rows, reply.floats[b * self.width :].numpy())

    def drain(self) -> bool:
        """Take every reply still in flight; True if the replay halted us meanwhile."""
        halted = False
        while self.outstanding:
            try:
                self.receive()
            except Halted:
                halted = True
        return halted

    def give_back(self, ids: np.ndarray, td_abs: np.ndarray) -> None:
        self.pending = (ids, td_abs)


def read_counters(c: Counters, fields: Sequence[float]) -> None:
    """The figures the replay sends with every SAMPLE reply (see ReplayServer.sample)."""
    c.env_steps, c.episodes = int(fields[0]), int(fields[1])
    c.train_return = nan_to_none(fields[2])
    c.replay_size, c.alive_actors = int(fields[3]), int(fields[4])


Learn = Callable[[Batch], np.ndarray]  # one update on a batch -> |TD| (B,)


def learn_loop(ctx: RoleContext, client: ReplayClient, learn: Learn, c: Counters, monitor: Monitor | None,
               net: torch.nn.Module, between: Callable[[], Msg | None]) -> dict[str, Any]:
    """Sample, learn, give priorities back, until the lead's monitor stops or a server halts us.

    ``between`` may return a one-way message to send ahead of the next request: apex publishes
    its parameters that way. Returns timing figures.
    """
    cfg = ctx.cfg
    start = time.perf_counter()
    learn_s = 0.0
    halted_by: list[int] = []
    for _ in range(client.depth):
        client.request(beta_at(c.updates, cfg.beta0, cfg.beta_steps))
    try:
        while True:
            fields, batch = client.receive()
            read_counters(c, fields)
            client.request(beta_at(c.updates, cfg.beta0, cfg.beta_steps), between())
            if batch is None:
                # the replay is still filling up to learning_starts: poll gently, or the polling
                # itself takes the CPU the actors need to fill it
                time.sleep(0.05)
            else:
                t = time.perf_counter()
                client.give_back(batch.ids, learn(batch))
                learn_s += time.perf_counter() - t
            if monitor is not None and monitor.tick(net, c):
                break
    except Halted as h:
        halted_by.append(h.server)
    if client.drain() and client.replay not in halted_by:  # replies still in flight
        halted_by.append(client.replay)
    wall = time.perf_counter() - start
    return {"learner_updates": c.updates, "learner_updates_per_s": c.updates / wall, "learn_s": learn_s,
            "replay_wait_s": client.wait_s, "wall_s": wall, "halted_by": halted_by}


class Publisher:
    """Every K updates, the parameters as a one-way PUBLISH for the replay's relay (actors fetch)."""

    def __init__(self, net: torch.nn.Module, every: int) -> None:
        self.net = net
        self.every = every
        self.version = 0
        self.at = 0

    def due(self, updates: int) -> Msg | None:
        if updates - self.at < self.every:
            return None
        self.version += 1
        self.at = updates
        return Msg(Kind.PUBLISH, [self.version], floats=flat_params(self.net))


def batch_tensors(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(batch.rows), torch.from_numpy(batch.weights)
