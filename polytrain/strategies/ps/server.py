"""A parameter server rank and its worker-side client, talking point-to-point over ``ctx.comm``.

Message protocol (gloo point-to-point, tag 0; all int64 headers have 5 fields)::

    worker -> server  header [kind, clock, need, reply, nnz]                   op ps_header
                      PUSH, nnz = -1: the gradient shard (n,) f32                 op ps_push
                      PUSH, nnz > 0: indices (nnz,) i32, then values (nnz,) f32   op ps_push
                      PUSH, nnz = 0: nothing more (an all-zero gradient)
                      PUSH, nnz <= -2: a codec payload of -2-nnz bytes (uint8)   op ps_push
                      (``--set compression=CODEC``: decoded by the server's ``decoder``)
                      PULL: nothing more;  DONE: nothing more (the worker has finished)
                      SAVE: nothing more (checkpoint at clock; the worker waits for the ack)
    server -> worker  header [version, step, code, 0, 0]                       op ps_header
                      code = 0: then the parameter shard (n,) f32                op ps_pull
                      code <= -2: a codec payload of -2-code bytes (uint8): the
                      change since the worker's copy (:mod:`.pulls`)              op ps_pull
                      (for a PULL, or a PUSH with reply = 1, once step >= need)
                      SAVE ack: header [version, step, 0, 0, 0] alone            op ps_ack
                      (once every worker has sent SAVE for that clock and the server's
                      ``on_save`` has written its state)

Checkpoints are a consistent cut: a worker sends SAVE after its push of clock c and waits for the
acks, so when the last worker's SAVE arrives the server holds every worker's pushes up to c and
none after — each push is in the checkpoint or not, never half, and a resumed worker pushes
from c + 1 on (each push applied at most once across a restart).

The server receives from all its workers at once, like a real parameter server: one receiver
thread per worker reads that worker's messages in order (header, then its payload), each with a
blocking receive from that worker alone, and hands each finished message to the serving thread,
which handles them one at a time in the order they complete. Why threads: gloo sends a payload
only once the receiver has posted a matching receive (a rendezvous), a receive from any source
must not be left posted where a payload could match it, and gloo's ``Work.is_completed()`` stays
False until ``wait()`` (torch 2.13, checked), so one thread cannot watch several receives.
Draining one push at a time (the earlier design: an any-source header receive, then a blocking
receive of that worker's gradient) made every server take the same worker's push at the same
moment — that worker's uplink shared, each server's downlink half idle (measured: 0.55 s per
3.9 MB push at 100 Mbit/s instead of 0.32 s). Per (source, destination) pair gloo matches
messages in posting order, so a worker's header and payload never cross.
Replies are sent with ``isend`` from a snapshot of the shard, so a slow reader never blocks the
server. A worker posts its reply ``irecv`` s *before* it sends the request and talks to all
servers at once (every request is an ``isend``), then waits for all. The server keeps at most one
reply in flight per worker: gloo's ``is_completed()`` stays False until ``wait()``, so instead of
polling, the reply to a worker is waited on when that worker's next message arrives — a client
takes each reply before it sends again, so that wait returns at once, and the snapshot it pinned
is freed (earlier, every reply and its shard copy stayed listed for the whole run and the list
was rescanned per message: quadratic CPU, e.g. 12 ms a push after 4,700 pushes, and memory
growing by a shard per reply).

A worker sends a shard sparsely when fewer than half its entries are non-zero (8 bytes per
non-zero instead of 4 per entry; lossless): on sparse data (``sparse-bow``) a batch touches
few input features, so few columns of the first layer's weight. Pulls are dense, or with a codec
the compressed change since the worker's copy (:mod:`.pulls`; the worker then posts the payload
receive once the header has told it the size).

A PUSH with reply = 1 is a push and a pull in one message: the server registers the pull while
it handles the push, so under SSP/BSP all pulls that wait for step t are answered the moment the
last push of step t is applied, before any other message is handled — with staleness 0 the replies
hold exactly the updates of steps ≤ t (this makes ssp with staleness=0 equal bsp).

Reuse: ``ParameterServer(comm, workers, shard, optimizer, policy)`` serves any list of client
ranks with any :class:`~polytrain.strategies.ps.consistency.Consistency`; ``PSClient`` (:mod:`.client`) speaks
for one client rank. Strategies that share servers between model replicas (distbelief) or
between learners (gorila) build the same two objects with their own plan and rank lists.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from polytrain.comm import Comm
from polytrain.metrics.recorder import Recorder
from polytrain.strategies.ps.busy import BusyClock
from polytrain.strategies.ps.consistency import Consistency, ProtocolError
from polytrain.strategies.ps.pulls import PullEncoder

PUSH, PULL, DONE, SAVE = 1, 2, 3, 4
HEADER = 5
SERVER_OPTIMIZERS = ("sgd", "momentum", "adagrad", "adam", "adamw")


def make_server_optimizer(name: str, param: nn.Parameter, lr: float, momentum: float = 0.9,
                          weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """The optimizer a server applies to its shard: the same torch optimizers single-process
    training uses (all are element-wise, so applying them shard by shard changes nothing)."""
    if name == "sgd":
        return torch.optim.SGD([param], lr=lr, weight_decay=weight_decay)
    if name == "momentum":
        return torch.optim.SGD([param], lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adagrad":
        return torch.optim.Adagrad([param], lr=lr, weight_decay=weight_decay)
    if name == "adam":
        return torch.optim.Adam([param], lr=lr, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW([param], lr=lr, weight_decay=weight_decay)
    raise ValueError(f"unknown server optimizer '{name}'; valid: {', '.join(SERVER_OPTIMIZERS)}")


class ParameterServer:
    """Owns one shard (n,) and serves pushes and pulls from ``workers`` until all send DONE."""

    def __init__(self, comm: Comm, workers: list[int], shard: torch.Tensor, optimizer: str,
                 policy: Consistency, *, lr: float, momentum: float = 0.9, weight_decay: float = 0.0,
                 recorder: Recorder | None = None, straggle: Callable[[float], None] | None = None,
                 on_save: Callable[[int], None] | None = None,
                 decoder: Callable[[int, torch.Tensor], torch.Tensor] | None = None,
                 pulls: PullEncoder | None = None) -> None:
        self.comm, self.policy, self.recorder = comm, policy, recorder
        self.pulls = pulls  # compressed replies (None: the dense shard)
        self.decoder = decoder  # (worker rank, payload bytes) -> gradient shard, for codec pushes
        self.on_save = on_save  # called with the clock once every worker has sent SAVE
        self.saves: dict[int, int] = {}  # worker rank -> clock of its SAVE, until all have sent one
        self.index = {rank: i for i, rank in enumerate(workers)}
        self.param = nn.Parameter(shard.detach().clone().contiguous())
        self.optimizer = make_server_optimizer(optimizer, self.param, lr, momentum, weight_decay)
        self.straggle = straggle or (lambda _s: None)
        self.version = 0  # optimizer applications so far
        self.read_step = [0] * len(workers)  # policy.step at the last reply to each worker
        self.read_version = [0] * len(workers)
        self.pending: list[tuple[int, int]] = []  # (worker rank, need) pulls not yet answered
        self.replies: dict[int, list[tuple[Any, torch.Tensor]]] = {}  # per worker: sends in flight
        self.replies_max = 0  # the most reply sends ever in flight at once
        self.done: set[int] = set()
        self.staleness: Counter[int] = Counter()  # histograms: bounded however long the run
        self.update_lag: Counter[int] = Counter()
        self.wall_s = 0.0
        self.intervals = BusyClock()  # receiving a push or handling a message
        self.messages = 0

    @property
    def shard(self) -> torch.Tensor:
        return self.param.detach()

    def serve(self) -> None:
        """Handle messages in completion order until every worker has sent DONE."""
        inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        readers = [threading.Thread(target=self._read, args=(rank, inbox), name=f"ps-recv-{rank}",
                                    daemon=True) for rank in self.index]
        start = time.perf_counter()
        for t in readers:
            t.start()
        while len(self.done) < len(self.index):
            msg = inbox.get()
            if isinstance(msg, BaseException):
                raise msg
            t0 = time.perf_counter()
            src, (kind, clock, need, reply, nnz), grad = msg
            self._settle(src)
            self._handle(src, kind, clock, need, reply, nnz, grad=grad)
            self.intervals.add(t0, time.perf_counter())
            if self.recorder is not None:
                self.recorder.sample_resources(messages=self.messages, replies_in_flight=self.in_flight())
        for t in readers:
            t.join()
        for src in list(self.replies):
            self._settle(src)
        self.wall_s = time.perf_counter() - start
        if self.pending:
            raise ProtocolError(f"workers finished with pulls still waiting: {self.pending}")

    def _settle(self, src: int) -> None:
        """Wait for the reply sends to ``src`` (it has taken them: it sends only after)."""
        for work, _ in self.replies.pop(src, []):
            work.wait()

    def in_flight(self) -> int:
        """Reply sends not yet waited on (at most two per worker and server)."""
        return sum(len(v) for v in self.replies.values())

    def _read(self, src: int, inbox: queue.SimpleQueue[Any]) -> None:
        """Receiver thread for worker ``src``: its messages in order, each whole, until DONE."""
        try:
            while True:
                header = torch.zeros(HEADER, dtype=torch.int64)
                self.comm.recv(header, src, op="ps_header")
                fields = header.tolist()
                grad = None
                if fields[0] == PUSH:
                    t0, start = time.perf_counter(), self.recorder.now() if self.recorder else 0.0
                    grad = self._receive_grad(src, fields[4])
                    self.intervals.add(t0, time.perf_counter())
                    if self.recorder is not None:
                        self.recorder.add_span("push_recv", "comm", start, self.recorder.now(),
                                               src=src, clock=fields[1])
                inbox.put((src, fields, grad))
                if fields[0] == DONE:
                    return
        except BaseException as e:  # the serving thread raises it
            inbox.put(e)

    def _handle(self, src: int, kind: int, clock: int, need: int, reply: int, nnz: int = -1,
                grad: torch.Tensor | None = None) -> None:
        """One message from ``src``; a PUSH's gradient is ``grad`` (read from ``src`` if None)."""
        if src not in self.index:
            raise ProtocolError(f"rank {src} is not a client of this server")
        self.messages += 1
        if kind == PUSH:
            self._push(src, clock, self._receive_grad(src, nnz) if grad is None else grad)
        elif kind == DONE:
            self.done.add(src)
            return
        elif kind == SAVE:
            self._save(src, clock)
            return
        elif kind != PULL:
            raise ProtocolError(f"unknown message kind {kind} from rank {src}")
        if kind == PULL or reply:
            self.pending.append((src, need))
        self._answer()

    def _receive_grad(self, src: int, nnz: int) -> torch.Tensor:
        """The pushed gradient (n,): dense (nnz = -1), a codec payload (nnz <= -2) or from nnz
        (index, value) pairs."""
        if nnz <= -2:
            if self.decoder is None:
                raise ProtocolError(f"rank {src} pushed a codec payload to a server without a codec")
            buf = torch.empty(-2 - nnz, dtype=torch.uint8)
            self.comm.recv(buf, src, op="ps_push")
            return self.decoder(src, buf)
        if nnz < 0:
            grad = torch.empty(self.param.shape, dtype=self.param.dtype)
            self.comm.recv(grad, src, op="ps_push")
            return grad
        grad = torch.zeros(self.param.shape, dtype=self.param.dtype)
        if nnz:
            idx, vals = torch.empty(nnz, dtype=torch.int32), torch.empty(nnz, dtype=self.param.dtype)
            self.comm.recv(idx, src, op="ps_push")
            self.comm.recv(vals, src, op="ps_push")
            grad[idx.long()] = vals
        return grad

    def _push(self, src: int, clock: int, grad: torch.Tensor) -> None:
        w = self.index[src]
        dropped = self.policy.dropped
        update = self.policy.on_push(w, clock, grad)
        if self.policy.dropped == dropped:  # accepted: measure how stale it was
            self.staleness[clock - 1 - self.read_step[w]] += 1
            self.update_lag[self.version - self.read_version[w]] += 1
        if update is not None:
            self._apply(update)

    def _apply(self, grad: torch.Tensor) -> None:
        t0 = time.perf_counter()
        start = self.recorder.now() if self.recorder else 0.0
        self.param.grad = grad
        self.optimizer.step()
        self.param.grad = None
        self.version += 1
        self.straggle(time.perf_counter() - t0)
        if self.recorder is not None:
            self.recorder.add_span("apply", "compute", start, self.recorder.now(), version=self.version)

    def _answer(self) -> None:
        step = self.policy.step
        ready = [(r, n) for r, n in self.pending if step >= n]
        if not ready:
            return
        self.pending = [(r, n) for r, n in self.pending if step < n]
        snapshot = self.param.detach().clone()  # one copy serves every reply of this moment
        for rank, _ in ready:
            w = self.index[rank]
            self.read_step[w], self.read_version[w] = step, self.version
            code, data = (0, snapshot) if self.pulls is None else self.pulls.reply(rank, snapshot)
            head = torch.tensor([self.version, step, code, 0, 0], dtype=torch.int64)
            sends = self.replies.setdefault(rank, [])
            sends.append((self.comm.isend(head, rank, op="ps_header"), head))
            sends.append((self.comm.isend(data, rank, op="ps_pull"), data))
        self.replies_max = max(self.replies_max, self.in_flight())

    def _save(self, src: int, clock: int) -> None:
        """Record ``src``'s SAVE; the last one of a clock writes the state and acks them all."""
        self.saves[src] = clock
        if len(self.saves) < len(self.index):
            return
        clocks = set(self.saves.values())
        if len(clocks) != 1:
            raise ProtocolError(f"workers asked for checkpoints at different clocks: {self.saves}")
        if self.on_save is None:
            raise ProtocolError("a worker asked for a checkpoint, but this server cannot write one")
        self.on_save(clocks.pop())
        if self.pulls is not None:
            self.pulls.reset()  # the next replies are dense: a resume replays this run
        head = torch.tensor([self.version, self.policy.step, 0, 0, 0], dtype=torch.int64)
        for rank in self.saves:
            self.replies.setdefault(rank, []).append((self.comm.isend(head, rank, op="ps_ack"), head))
        self.saves = {}

    def busy_s(self) -> float:
        """Wall time during which this server was receiving at least one push or handling a
        message (the union of those intervals): its load, as opposed to waiting for work."""
        return self.intervals.seconds()

    def stats(self) -> dict[str, Any]:
        return {
            "bytes": self.comm.bytes_sent + self.comm.bytes_received,
            "busy_s": self.busy_s(),
            "params": self.param.numel(),
            "version": self.version,
            "step": self.policy.step,
            "messages": self.messages,
            "replies_in_flight_max": self.replies_max,
            "dropped": self.policy.dropped,
            "accepted": list(self.policy.accepted),
            "staleness": {str(k): n for k, n in sorted(self.staleness.items())},
            "update_lag": {str(k): n for k, n in sorted(self.update_lag.items())},
            **({"pulls": self.pulls.stats()} if self.pulls is not None else {}),
        }
