"""Messages between RL processes, and the request loop every server (replay, parameter shard) runs.

A message is a header plus at most one payload, each sent over the (client, server) pair's
:class:`~polytrain.rl.links.Link`, which counts its bytes under the message's operation::

    header   float64[10] = [kind, n_ints, n_floats, n_total, f0, f1, f2, f3, f4, f5]
    payload  float32[n_total] = ints (int32 bits) | floats (rows, params) | zero padding
                                — only when n_total > 0

One payload, not one per part: every gloo receive is a rendezvous with the sender's I/O thread,
and on two busy cores each costs a scheduling round trip. A client that knows the size of its
replies (the learner: a SAMPLE reply is one batch) *posts* their receives when it sends the
request (:func:`post_recv`), so a batch lands while the learner is still busy with the one
before; the server pads every reply to such a client to that size (``Hub(pad=...)``).

Every exchange is a client's request and the server's reply (PUBLISH, STOP and BYE are
one-way; SAVE is answered once the replay's part of a checkpoint is written, see
:mod:`polytrain.rl.snapshot`), so each (client, server) stream holds whole messages in order.
Each stream is its own two-rank gloo group (:mod:`polytrain.rl.links`), and a server reads each
client's stream in a receiver thread of its own (as polytrain's `ps` server reads its workers),
handing finished messages to the serving thread, which handles them one at a time in the order they complete.

Why a dead actor cannot stall or end the run: a server never waits on one particular client,
and a connection error is always *one* client's: its receiver thread reports that client gone
and the server declares it lost. (The earlier design took the next header from any source; when
an actor died between announcing a message and sending it, that any-source receive failed
without naming a source, and the replay died with it — issue 7.) A silent actor is declared
lost after ``actor_timeout_s`` (and counted again if it speaks); its receive stays posted —
gloo would tear down the link of a receive that times out, so none is given a deadline shorter
than the run's. The lead learner ends the run: STOP, then PING until every server has heard
from or given up on every client (:func:`wind_down`).
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import torch

from polytrain.metrics.recorder import Recorder
from polytrain.rl.links import Link


class Kind(IntEnum):
    # requests
    ADD = 1  # actor -> replay: transitions, priorities, episodes (reply: parameters if asked)
    SAMPLE = 2  # learner -> replay: priority updates of the last batch, and "send me a batch"
    PUBLISH = 3  # learner -> replay: new parameters for the actors (one-way: no reply)
    SAVE = 4  # lead learner -> replay: write your part of checkpoint k (reply: once written)
    STOP = 7  # lead learner -> server: the run is over, tell every client
    PING = 8  # lead learner -> server while stopping: how many clients are still out there?
    BYE = 9  # client -> server: I am leaving; my last message to you (no reply)
    # replies
    OK = 10
    HALT = 11  # the run is over: leave now


ONE_WAY = {Kind.PUBLISH, Kind.STOP, Kind.BYE}
OPS = {Kind.ADD: "experience", Kind.SAMPLE: "sample", Kind.PUBLISH: "params_publish"}
FIELDS = 6
HEADER = 4 + FIELDS
MAX_INT = 2**31 - 1  # ints travel as int32 (replay ids: transitions added in one run)


@dataclass
class Msg:
    kind: Kind
    fields: Sequence[float] = field(default_factory=list)  # at most FIELDS scalars
    ints: torch.Tensor | None = None
    floats: torch.Tensor | None = None
    op: str | None = None  # how its bytes are counted, when not by its request's kind

    def field(self, i: int) -> float:
        return self.fields[i] if i < len(self.fields) else 0.0


def _tensors(msg: Msg, pad: int = 0) -> list[torch.Tensor]:
    """[header] or [header, payload]; ``pad``: the payload's exact size (float32s), zero-filled."""
    n_int = 0 if msg.ints is None else msg.ints.numel()
    n_float = 0 if msg.floats is None else msg.floats.numel()
    total = max(n_int + n_float, pad)
    if pad and n_int + n_float > pad:
        raise ValueError(f"a {msg.kind.name} message of {n_int + n_float} values exceeds the {pad} its "
                         "receiver posted")
    fields = [float(x) for x in msg.fields] + [0.0] * (FIELDS - len(msg.fields))
    out = [torch.tensor([float(msg.kind), n_int, n_float, total, *fields], dtype=torch.float64)]
    if total:
        payload = torch.zeros(total, dtype=torch.float32)
        if msg.ints is not None and n_int:
            if int(msg.ints.max()) > MAX_INT or int(msg.ints.min()) < 0:
                raise ValueError("message ints must lie in [0, 2^31)")
            payload[:n_int] = msg.ints.to(torch.int32).view(torch.float32)  # the bits, not values
        if msg.floats is not None and n_float:
            payload[n_int : n_int + n_float] = msg.floats
        out.append(payload)
    return out


def _unpack(header: torch.Tensor, payload: torch.Tensor | None) -> Msg:
    kind = Kind(int(header[0]))
    n_int, n_float = int(header[1]), int(header[2])
    ints = floats = None
    if payload is not None and n_int:
        ints = payload[:n_int].view(torch.int32).long()
    if payload is not None and n_float:
        floats = payload[n_int : n_int + n_float]
    return Msg(kind, header[4:].tolist(), ints, floats)


def send_msg(comm: Link, dst: int, msg: Msg, op: str) -> None:
    """Blocking send: gloo completes a send only once the receiver has posted its receive."""
    for t in _tensors(msg):
        comm.send(t, dst, op=op)


def isend_msg(comm: Link, dst: int, msg: Msg, op: str, pad: int = 0) -> list[tuple[Any, torch.Tensor]]:
    """Non-blocking send: (work, tensor) pairs; keep them, and wait once the peer has read them.

    A client with requests in flight must not block in a send: the server may itself be
    blocked sending it a reply, and each would wait for the other's receive.
    """
    return [(comm.isend(t, dst, op=op), t) for t in _tensors(msg, pad)]


class PeerGone(RuntimeError):
    """A peer's connection closed in the middle of an exchange (the process died)."""

    def __init__(self, peer: int, cause: Exception) -> None:
        super().__init__(f"rank {peer} is gone: {cause}")
        self.peer = peer


def recv_msg(comm: Link, src: int) -> Msg:
    """The next message from ``src``; raises PeerGone if its connection fails meanwhile."""
    header = torch.empty(HEADER, dtype=torch.float64)
    try:
        comm.recv(header, src, op="header")
        total = int(header[3])
        payload = None
        if total:
            payload = torch.empty(total, dtype=torch.float32)
            comm.recv(payload, src, op=OPS.get(Kind(int(header[0])), "control"))
    except RuntimeError as exc:
        raise PeerGone(src, exc) from exc
    return _unpack(header, payload)


class Posted:
    """Receives posted ahead for one reply of known payload size (see :func:`post_recv`)."""

    def __init__(self, comm: Link, src: int, total: int, op: str) -> None:
        self.header = torch.empty(HEADER, dtype=torch.float64)
        self.payload = torch.empty(total, dtype=torch.float32)
        self.works = [comm.irecv(self.header, src, op="header"), comm.irecv(self.payload, src, op=op)]

    def wait(self) -> Msg:
        for work in self.works:
            work.wait()
        if int(self.header[3]) != self.payload.numel():
            raise RuntimeError(f"reply of {int(self.header[3])} values, {self.payload.numel()} posted")
        return _unpack(self.header, self.payload)


def post_recv(comm: Link, src: int, total: int, op: str) -> Posted:
    """Post the receives of a reply whose payload is exactly ``total`` float32s (its sender
    pads to it): gloo then moves it as soon as it is sent, while this process does other work."""
    return Posted(comm, src, total, op)


def request(comm: Link, server: int, msg: Msg) -> Msg:
    """Send a request and wait for the server's reply."""
    send_msg(comm, server, msg, OPS.get(msg.kind, "control"))
    return recv_msg(comm, server)


def nan_to_none(x: float) -> float | None:
    return None if math.isnan(x) else x


Handler = Callable[[int, Msg], "Msg | None"]  # None: the reply is deferred (see Hub.release)


class Hub:
    """A server's request loop: dispatches requests, tracks clients, winds down on STOP.

    ``clients`` maps every client rank to its role ("actor" or "learner"); ``lead`` is the
    learner that ends the run. Only actors may be lost: a learner or server that dies ends the
    whole run (the launcher sees to that), because without it nothing is being learned.

    A handler may defer its reply (return None) and send it later with :meth:`release`: the
    client then waits in a blocking receive, using no CPU — how the replay rate-limits actors.
    A client waiting for a deferred reply is never declared lost.

    Replies leave with non-blocking sends: a gloo send completes only when the client posts its
    receive, which an actor does only when it next needs the reply — a blocking reply would
    stall the server (and every other client) meanwhile. ``depth[client]`` (D, default 1)
    bounds what may be outstanding: a client sends request n only after taking reply n − D, so
    that send is complete when the server answers request n. ``pad[client]``: that client posts
    its receives ahead (:func:`post_recv`), so every reply to it, HALT included, is padded to
    that payload size.
    """

    def __init__(self, links: dict[int, Link], recorder: Recorder, clients: dict[int, str], lead: int,
                 actor_timeout_s: float, depth: dict[int, int] | None = None,
                 pad: dict[int, int] | None = None) -> None:
        self.links = links  # client -> its link
        self.depth = depth or {}
        self.pad = pad or {}  # client -> payload size of every reply (it posts its receives ahead)
        self.sending: dict[int, deque[list[tuple[Any, torch.Tensor]]]] = {}
        self.recorder = recorder
        self.clients = clients
        self.lead = lead
        self.timeout = actor_timeout_s
        self.last_seen = dict.fromkeys(clients, recorder.now())
        self.done: set[int] = set()
        self.lost: dict[int, float] = {}
        self.gone: set[int] = set()  # lost for good: its connection failed
        self.deferred: dict[int, Kind] = {}  # client -> the request kind it waits on
        self.stopping = False
        self.after: Callable[[], None] = lambda: None  # runs after every request

    def remaining(self) -> list[int]:
        return [r for r in self.clients if r != self.lead and r not in self.done and r not in self.lost]

    def alive_actors(self) -> int:
        return sum(1 for r, role in self.clients.items() if role == "actor" and r not in self.lost)

    def release(self, peer: int, reply: Msg) -> None:
        kind = self.deferred.pop(peer)
        self.last_seen[peer] = self.recorder.now()
        self._reply(peer, reply, reply.op or OPS.get(kind, "control"))

    def _reply(self, peer: int, reply: Msg, op: str) -> None:
        """Send to a client; an actor whose connection closed is lost, anyone else is fatal."""
        if peer in self.gone:
            return
        pending = self.sending.setdefault(peer, deque())
        try:
            while len(pending) >= self.depth.get(peer, 1):
                for work, _ in pending.popleft():
                    work.wait()
            pending.append(isend_msg(self.links[peer], peer, reply, op, self.pad.get(peer, 0)))
        except RuntimeError as exc:
            self._gone(PeerGone(peer, exc))

    def _flush(self) -> None:
        """Before leaving: every reply still in the pipe has been (or is being) taken."""
        for peer, pending in self.sending.items():
            if peer not in self.gone:
                for sends in pending:
                    for work, _ in sends:
                        work.wait()

    def _gone(self, err: PeerGone) -> None:
        if self.clients.get(err.peer) != "actor":
            raise err
        self.gone.add(err.peer)
        self.deferred.pop(err.peer, None)
        self.sending.pop(err.peer, None)
        self._lose(err.peer, "connection closed")

    def _lose(self, rank: int, why: str) -> None:
        if rank in self.lost:  # silent first, and now its connection failed too
            return
        now = self.recorder.now()
        self.lost[rank] = now
        self.recorder.emit("actor_lost", peer=rank, why=why, silent_s=round(now - self.last_seen[rank], 3))

    def _check_lost(self) -> None:
        now = self.recorder.now()
        for rank in self.remaining():
            silent = now - self.last_seen[rank]
            if self.clients[rank] == "actor" and rank not in self.deferred and silent > self.timeout:
                self._lose(rank, f"silent for more than {self.timeout:g} s")

    def _seen(self, peer: int) -> None:
        self.last_seen[peer] = self.recorder.now()
        if peer in self.lost and peer not in self.gone:  # it was only slow: count it again
            del self.lost[peer]
            self.recorder.emit("actor_back", peer=peer)

    def _halt(self, peer: int) -> None:
        # Not "done" yet: the client may have more requests in flight, and each gets its
        # (HALT) reply; its BYE, last in its ordered stream, says it expects nothing more.
        self._reply(peer, Msg(Kind.HALT), "control")

    def _request(self, peer: int, msg: Msg, handlers: dict[Kind, Handler]) -> None:
        if msg.kind in ONE_WAY:
            if not self.stopping:
                handlers[msg.kind](peer, msg)
            return
        if self.stopping:
            self._halt(peer)
            return
        reply = handlers[msg.kind](peer, msg)
        if reply is None:
            self.deferred[peer] = msg.kind
        else:
            self._reply(peer, reply, reply.op or OPS.get(msg.kind, "control"))

    def _read(self, peer: int, inbox: queue.SimpleQueue[Any]) -> None:
        """Receiver thread: ``peer``'s messages in order, until its BYE or its link fails."""
        while True:
            try:
                msg = recv_msg(self.links[peer], peer)
            except PeerGone as err:
                inbox.put(err)
                return
            inbox.put((peer, msg))
            if msg.kind == Kind.BYE:
                return

    def _next(self, inbox: queue.SimpleQueue[Any]) -> tuple[int, Msg] | None:
        """The next finished message (None: a client's link failed, or nothing for a while)."""
        try:
            item = inbox.get(timeout=min(1.0, self.timeout / 4))
        except queue.Empty:
            return None
        if isinstance(item, PeerGone):
            self._gone(item)
            return None
        return item  # type: ignore[no-any-return]

    def serve(self, handlers: dict[Kind, Handler]) -> None:
        """Serve until STOP was received and every client has left, halted or been lost."""
        inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for rank in self.clients:
            threading.Thread(target=self._read, args=(rank, inbox), daemon=True).start()
        while True:
            got = self._next(inbox)
            self._check_lost()
            if got is None:
                continue
            peer, msg = got
            self._seen(peer)
            if msg.kind == Kind.BYE:
                self.done.add(peer)
            elif msg.kind == Kind.STOP:
                self.stopping = True
                for waiting in list(self.deferred):
                    del self.deferred[waiting]
                    self._halt(waiting)
            elif msg.kind == Kind.PING:
                left = len(self.remaining())
                self._reply(peer, Msg(Kind.OK, [left]), "control")
                if self.stopping and left == 0:
                    self._flush()
                    return
            else:
                self._request(peer, msg, handlers)
            if not self.stopping:
                self.after()


def wind_down(links: dict[int, Link], servers: tuple[int, ...], poll_s: float = 0.05) -> None:
    """The lead learner ends the run: STOP every server, then PING each until it has no clients.

    A receiver thread that is left waiting on the lead's link when the server returns is a
    daemon: it ends with the process.
    """
    for server in servers:
        send_msg(links[server], server, Msg(Kind.STOP), "control")
    pending = list(servers)
    while pending:
        for server in list(pending):
            if request(links[server], server, Msg(Kind.PING)).field(0) == 0:
                pending.remove(server)
        if pending:
            time.sleep(poll_s)
