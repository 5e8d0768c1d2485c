"""Messages between RL processes, and the request loop every server (replay, parameter shard) runs.

A message is a header plus up to two payloads, each sent with :class:`polytrain.comm.Comm` so its
bytes are counted under the message's operation::

    header  float64[8] = [kind, n_ints, n_floats, f0, f1, f2, f3, f4]
    ints    int64[n_ints]      (ids)            — only when n_ints > 0
    floats  float32[n_floats]  (rows, params)   — only when n_floats > 0

Every exchange is a client's request and the server's reply (PUBLISH, STOP and BYE are
one-way), so each (client, server) stream holds whole messages in order; a server takes the
next header from *any* client (gloo's receive-from-any-source), then that client's payloads.

Why a dead actor cannot stall the run: a server never waits on one particular client. gloo's
any-source receive simply stops hearing from a process whose sockets closed (a SIGKILLed actor),
so the server keeps serving the others; it declares an actor *lost* once it has been silent for
``actor_timeout_s``. A receive with a timeout would have been the obvious detector, but a timed-out
gloo receive tears down the connections it waited on — so instead the lead learner, which talks
to every server constantly and is alive by construction (the launcher ends the run if it dies),
keeps every server awake; while shutting down it pings them until they have heard from or given
up on every client.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import torch

from polytrain.comm import Comm
from polytrain.runtime.recorder import Recorder


class Kind(IntEnum):
    # requests
    ADD = 1  # actor -> replay: transitions, priorities, episodes (reply: parameters if asked)
    SAMPLE = 2  # learner -> replay: priority updates of the last batch, and "send me a batch"
    PUBLISH = 3  # learner -> replay: new parameters for the actors (one-way: no reply)
    STOP = 7  # lead learner -> server: the run is over, tell every client
    PING = 8  # lead learner -> server while stopping: how many clients are still out there?
    BYE = 9  # client -> server: I am leaving; my last message to you (no reply)
    # replies
    OK = 10
    HALT = 11  # the run is over: leave now


ONE_WAY = {Kind.PUBLISH, Kind.STOP, Kind.BYE}
OPS = {Kind.ADD: "experience", Kind.SAMPLE: "sample", Kind.PUBLISH: "params_publish"}
HEADER = 8


@dataclass
class Msg:
    kind: Kind
    fields: Sequence[float] = field(default_factory=list)  # at most 5 scalars
    ints: torch.Tensor | None = None
    floats: torch.Tensor | None = None
    op: str | None = None  # how its bytes are counted, when not by its request's kind

    def field(self, i: int) -> float:
        return self.fields[i] if i < len(self.fields) else 0.0


def _tensors(msg: Msg) -> list[torch.Tensor]:
    n_int = 0 if msg.ints is None else msg.ints.numel()
    n_float = 0 if msg.floats is None else msg.floats.numel()
    fields = [float(x) for x in msg.fields] + [0.0] * (5 - len(msg.fields))
    out = [torch.tensor([float(msg.kind), n_int, n_float, *fields], dtype=torch.float64)]
    if msg.ints is not None and n_int:
        out.append(msg.ints.to(torch.int64).contiguous())
    if msg.floats is not None and n_float:
        out.append(msg.floats.to(torch.float32).contiguous())
    return out


def send_msg(comm: Comm, dst: int, msg: Msg, op: str) -> None:
    """Blocking send: gloo completes a send only once the receiver has posted its receive."""
    for t in _tensors(msg):
        comm.send(t, dst, op=op)


def isend_msg(comm: Comm, dst: int, msg: Msg, op: str) -> list[tuple[Any, torch.Tensor]]:
    """Non-blocking send: (work, tensor) pairs; keep them, and wait once the peer has read them.

    A client with requests in flight must not block in a send: the server may itself be
    blocked sending it a reply, and each would wait for the other's receive.
    """
    return [(comm.isend(t, dst, op=op), t) for t in _tensors(msg)]


class PeerGone(RuntimeError):
    """A peer's connection closed in the middle of an exchange (the process died)."""

    def __init__(self, peer: int, cause: Exception) -> None:
        super().__init__(f"rank {peer} is gone: {cause}")
        self.peer = peer


def recv_msg(comm: Comm, src: int | None) -> tuple[int, Msg]:
    """The next message from ``src`` (None: from whichever client sends first)."""
    header = torch.empty(HEADER, dtype=torch.float64)
    peer = comm.recv(header, src, op="header")
    kind = Kind(int(header[0]))
    op = OPS.get(kind, "control")
    n_int, n_float = int(header[1]), int(header[2])
    ints = floats = None
    try:
        if n_int:
            ints = torch.empty(n_int, dtype=torch.int64)
            comm.recv(ints, peer, op=op)
        if n_float:
            floats = torch.empty(n_float, dtype=torch.float32)
            comm.recv(floats, peer, op=op)
    except RuntimeError as exc:  # died between its header and its payload
        raise PeerGone(peer, exc) from exc
    return peer, Msg(kind, header[3:].tolist(), ints, floats)


def request(comm: Comm, server: int, msg: Msg) -> Msg:
    """Send a request and wait for the server's reply."""
    send_msg(comm, server, msg, OPS.get(msg.kind, "control"))
    _, reply = recv_msg(comm, server)
    return reply


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
    receive, and a learner with D requests in flight posts it only after its next update — a
    blocking reply would stall the server (and every actor) meanwhile. ``depth[client]`` (D,
    default 1) bounds what may be outstanding: a client sends request n only after taking reply
    n − D, so that send is complete when the server answers request n.
    """

    def __init__(self, comm: Comm, recorder: Recorder, clients: dict[int, str], lead: int,
                 actor_timeout_s: float, depth: dict[int, int] | None = None) -> None:
        self.comm = comm
        self.depth = depth or {}
        self.sending: dict[int, deque[list[tuple[Any, torch.Tensor]]]] = {}
        self.recorder = recorder
        self.clients = clients
        self.lead = lead
        self.timeout = actor_timeout_s
        self.last_seen = dict.fromkeys(clients, recorder.now())
        self.done: set[int] = set()
        self.lost: dict[int, float] = {}
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
        pending = self.sending.setdefault(peer, deque())
        try:
            while len(pending) >= self.depth.get(peer, 1):
                for work, _ in pending.popleft():
                    work.wait()
            pending.append(isend_msg(self.comm, peer, reply, op))
        except RuntimeError as exc:
            self._gone(PeerGone(peer, exc))

    def _flush(self) -> None:
        """Before leaving: every reply still in the pipe has been (or is being) taken."""
        for peer, pending in self.sending.items():
            if peer not in self.lost:
                for sends in pending:
                    for work, _ in sends:
                        work.wait()

    def _gone(self, err: PeerGone) -> None:
        if self.clients.get(err.peer) != "actor":
            raise err
        self.deferred.pop(err.peer, None)
        self.sending.pop(err.peer, None)
        self._lose(err.peer, "connection closed")

    def _lose(self, rank: int, why: str) -> None:
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
        if peer in self.lost:  # it was only slow: count it again
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

    def serve(self, handlers: dict[Kind, Handler]) -> None:
        """Serve until STOP was received and every client has left, halted or been lost."""
        while True:
            try:
                peer, msg = recv_msg(self.comm, None)
            except PeerGone as err:
                self._gone(err)
                continue
            self._seen(peer)
            self._check_lost()
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


def wind_down(comm: Comm, servers: tuple[int, ...], poll_s: float = 0.05) -> None:
    """The lead learner ends the run: STOP every server, then PING each until it has no clients.

    The pings are also what keeps a server awake (and checking for silent actors) once the
    learners have stopped talking to it; see the module docstring.
    """
    for server in servers:
        send_msg(comm, server, Msg(Kind.STOP), "control")
    pending = list(servers)
    while pending:
        for server in list(pending):
            if request(comm, server, Msg(Kind.PING)).field(0) == 0:
                pending.remove(server)
        if pending:
            time.sleep(poll_s)
