"""The learner's side of replay (shared by `apex` and `gorila`), with batches in flight.

Each SAMPLE request asks for K = ``sample_batches`` batches and carries the new priorities of
the K before; ``prefetch`` (D) requests are kept in flight, so the replay samples while the
learner learns (as in Ape-X)::

    learner:  recv b_t..t+K-1 | send req(prio of those) | K updates ....... | recv ... |
    replay:                   |  apply prio, sample K batches, reply ----> (queued)

The learner only waits when the replay is D requests behind — on a busy machine a process
round trip costs milliseconds of scheduling latency, more than the update itself, and every
gloo message costs its I/O threads kernel time, hence K batches a message. A priority lands up
to (D + 1)·K updates late; ids guard against slots overwritten meanwhile.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from polytrain.rl.actor import Halted
from polytrain.rl.monitor import Counters, Monitor
from polytrain.rl.protocol import OPS, Kind, Msg, Posted, isend_msg, nan_to_none, post_recv
from polytrain.rl.replay import Batch, beta_at
from polytrain.rl.roles import RoleContext
from polytrain.rl.snapshot import Saver
from polytrain.runtime.flat import flat_params


class ReplayClient:
    """SAMPLE requests with up to ``depth`` in flight (replies come back in order).

    The receives of each reply are posted with its request (:func:`~polytrain.rl.protocol.post_recv`;
    the replay pads every reply to the learner to one batch), so gloo moves batch t+D while the
    learner is still updating on batch t, and taking it later costs no round trip.
    """

    def __init__(self, ctx: RoleContext) -> None:
        assert ctx.ranks.replay_rank is not None
        self.comm = ctx.link(ctx.ranks.replay_rank)
        self.replay = ctx.ranks.replay_rank
        self.width = ctx.row.width
        self.batch_size = ctx.cfg.batch_size
        self.batches = ctx.cfg.sample_batches
        self.depth = ctx.cfg.prefetch
        self.pending: list[tuple[np.ndarray, np.ndarray]] = []  # (ids, |TD|) learnt since the last request
        # per request: its sends, the receives posted for its reply, and its checkpoint (SAVE) or 0
        self.in_flight: deque[tuple[list[tuple[Any, torch.Tensor]], Posted, int]] = deque()
        self.wait_s = 0.0
        self.on_ack: Callable[[int, Sequence[float]], None] = lambda k, fields: None  # SAVE answered

    @staticmethod
    def reply_size(batch_size: int, batches: int, width: int) -> int:
        """Float32s of a SAMPLE reply's payload: ids (K·B) | rows (K·B·width) | IS weights (K·B)."""
        return batches * batch_size * (width + 2)

    @property
    def outstanding(self) -> int:
        return len(self.in_flight)

    def request(self, beta: float, before: Msg | None = None, save: int = 0, at: float = 0.0,
                updates: int = 0) -> None:
        """Ask for K batches (non-blocking), after the one-way message ``before`` if given; with
        ``save`` = k, then ask the replay to write its part of checkpoint k (after this request's
        priorities: see :mod:`polytrain.rl.snapshot`); its answer goes to ``on_ack``."""
        ids = td = None
        if self.pending:
            ids = torch.from_numpy(np.concatenate([i for i, _ in self.pending]))
            td = torch.from_numpy(np.concatenate([t for _, t in self.pending]).astype(np.float32))
            self.pending = []
        posted = post_recv(self.comm, self.replay,
                           self.reply_size(self.batch_size, self.batches, self.width), OPS[Kind.SAMPLE])
        sends = [] if before is None else isend_msg(self.comm, self.replay, before, OPS[before.kind])
        msg = Msg(Kind.SAMPLE, [self.batch_size, beta, self.batches], ids, td)
        self.in_flight.append((sends + isend_msg(self.comm, self.replay, msg, OPS[Kind.SAMPLE]), posted, 0))
        if save:
            size = self.reply_size(self.batch_size, self.batches, self.width)
            posted = post_recv(self.comm, self.replay, size, "control")
            sends = isend_msg(self.comm, self.replay, Msg(Kind.SAVE, [save, updates, at]), "control")
            self.in_flight.append((sends, posted, save))

    def receive(self) -> tuple[Sequence[float], list[Batch]]:
        """(replay figures, K batches or none while the replay is still filling); raises Halted.
        A checkpoint's answer on the way is handed to ``on_ack`` (nothing after it: no batch)."""
        while True:
            start = time.perf_counter()
            sends, posted, save = self.in_flight.popleft()
            reply = posted.wait()
            self.wait_s += time.perf_counter() - start
            for work, _ in sends:  # the replay read them before it replied
                work.wait()
            if reply.kind == Kind.HALT:
                raise Halted(self.replay)
            if not save:
                break
            self.on_ack(save, reply.fields)
            if not self.in_flight:
                return (), []
        if reply.ints is None or reply.floats is None:
            return reply.fields, []
        n, b, w = reply.ints.numel(), self.batch_size, self.width
        ids = reply.ints.numpy()
        rows = reply.floats[: n * w].view(n, w).numpy()
        weights = reply.floats[n * w :].numpy()
        return reply.fields, [Batch(ids[i : i + b], rows[i : i + b], weights[i : i + b])
                              for i in range(0, n, b)]

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
        self.pending.append((ids, td_abs))


def read_counters(c: Counters, fields: Sequence[float]) -> None:
    """The figures the replay sends with every SAMPLE reply (see ReplayServer.sample)."""
    c.env_steps, c.episodes = int(fields[0]), int(fields[1])
    c.train_return = nan_to_none(fields[2])
    c.replay_size, c.alive_actors = int(fields[3]), int(fields[4])


Learn = Callable[[Batch], np.ndarray]  # one update on a batch -> |TD| (B,)


def learn_loop(ctx: RoleContext, client: ReplayClient, learn: Learn, c: Counters, monitor: Monitor | None,
               net: torch.nn.Module, between: Callable[[], Msg | None],
               saver: Saver | None = None) -> dict[str, Any]:
    """Sample, learn, give priorities back, until the lead's monitor stops or a server halts us.

    ``between`` may return a one-way message to send ahead of the next request: apex publishes
    its parameters that way. ``saver``: checkpoints (:mod:`polytrain.rl.snapshot`), taken right
    after a reply, before its batches are learnt, and (the lead) once more at the end of the run.
    Returns timing figures.
    """
    cfg = ctx.cfg
    start = time.perf_counter()
    updates0 = c.updates  # a resumed learner's rate: this launch's updates
    learn_s = 0.0
    halted_by: list[int] = []
    if saver is not None and saver.lead:
        client.on_ack = saver.acked

    def request(save: int = 0, before: Msg | None = None) -> None:
        lead_save = save if saver is not None and saver.lead else 0
        client.request(beta_at(c.updates, cfg.beta0, cfg.beta_steps), before, lead_save,
                       ctx.recorder.now(), c.updates)
        if save and saver is not None:
            saver.take(save, c.env_steps, c.updates)

    for _ in range(client.depth):
        request()
    try:
        while True:
            fields, batches = client.receive()
            read_counters(c, fields)
            request((saver.due(c.env_steps, fields) or 0) if saver is not None else 0, between())
            if not batches:
                # the replay is still filling up to learning_starts: poll gently, or the polling
                # itself takes the CPU the actors need to fill it
                time.sleep(0.05)
                if monitor is not None and monitor.tick(net, c):
                    break
                continue
            stop = False
            for batch in batches:
                t = time.perf_counter()
                client.give_back(batch.ids, learn(batch))
                learn_s += time.perf_counter() - t
                if monitor is not None and monitor.tick(net, c):
                    stop = True
                    break
            if stop:
                break
        if saver is not None and saver.lead and saver.every:  # the end of the run: resume from here
            request(saver.k + 1)
    except Halted as h:
        halted_by.append(h.server)
    if client.drain() and client.replay not in halted_by:  # replies still in flight
        halted_by.append(client.replay)
    wall = time.perf_counter() - start
    return {"learner_updates": c.updates, "learner_updates_per_s": (c.updates - updates0) / wall,
            "learn_s": learn_s,
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
