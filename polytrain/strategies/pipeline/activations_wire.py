"""Point-to-point messages between pipeline stages, all through the accounted ``ctx.comm``.

Message format. Every activation (stage s -> s+1) and gradient (s+1 -> s) travels as one uint8
buffer: the tensor's raw bytes followed by a 24-byte trailer of three float64 — ``tag``, the
micro-batch index and ``ack``. The trailer carries what the receiver needs besides the tensor: on
activations the input stage's weight version (PipeDream's vertical sync), on gradients the
micro-batch's loss (so every stage learns each loss without a separate message or a collective).
The micro-batch index lets the receiver check the FIFO order (a mismatch is a bug, reported
loudly, never trained on). ``ack`` is how many messages the sender has taken from the receiver so
far (the reverse channel): see Bounded sends below. Raw bytes keep any dtype exact. The cost is
one copy of the tensor at the sender and 24 bytes per message; the receiver views the buffer
without a copy, and since the tensor starts the buffer it is as aligned as any fresh tensor (64 bytes).

Buffers are reused. A fresh 256 KiB buffer per message costs more than its copy: the allocator
hands large blocks back to the OS and the next one page-faults in again, on the same cores the
stages compute on (measured with `benchmarks/pipeline_profile.py`: about a thousand extra minor
faults per step on the mlp of `benchmarks/pipeline_torch.py`). An `Outbox` keeps the buffers of
completed sends; an `Inbox` reuses a receive buffer once nothing but the inbox references its
storage any more (the stage dropped the activation after its backward, or the gradient after use),
so the stage's own lifetimes decide and nothing is overwritten while in use.

Each buffer is a `Frame`: the uint8 buffer with its payload view (the tensor's dtype and shape) and,
on CPU, its trailer as a numpy float64 view, all made once. Filling or reading a message is then
one tensor copy (send) or one ``detach`` (receive), and the trailer is written and read without
the dispatcher. Between two actions' compute this matters: the ~10 small tensor operations per
message that building the views and trailer took each time ran on caches the compute had just
flushed, 100–180 µs per pack or unpack inside a pipeline (2 ranks on 2 cores, measured), on the
critical path of every action.

Shapes are never exchanged: every rank derives them from one dry forward on a sample
(`polytrain.models.boundaries.boundary_metas`), so both ends of a channel agree by construction.

Overlap. An `Inbox` keeps several ``irecv`` posted ahead on its channel, so the next message lands
while the stage computes; an `Outbox` sends with ``isend`` and only waits at the end of a segment.
gloo gives no completion callback for point-to-point work, so a ``send`` span ends when the
outbox first sees the work completed (polled between actions, or acknowledged): an upper bound.

Bounded sends. On gloo a send's ``is_completed()`` stays False until ``wait()``, so polling alone
never frees anything, and a stream schedule (pipedream, spectrain: one segment spans many steps)
would keep every send buffer of the segment. Waiting on an arbitrary old send could deadlock
(the peer may not have posted its receive yet). So every message carries ``ack``: the number of
messages its sender has taken from the receiver. A send whose index is below the peer's latest
ack has been received, so its ``wait()`` returns at once: the outbox waits on those, recycles
their buffers, and keeps only the sends the peer has not yet taken — bounded by the schedule's
messages in flight, not by the length of the run (``peak_outstanding_sends`` in the metrics).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from polytrain.comm import Comm
from polytrain.metrics.recorder import Recorder
from polytrain.models.boundaries import TensorMeta

HEADER = 24  # bytes of the trailer: float64 tag, micro-batch index, ack
POOL = 16  # buffers an outbox keeps per size, and an inbox tracks for reuse
AHEAD = 4  # receives an inbox keeps posted
STOP = -1  # micro-batch index of the message that stops a stream early (its tag: the first mb left out)
PAD = -2  # micro-batch index of a message that only matches a receive posted for a mb left out


class StreamStop(Exception):
    """The previous stage stopped the stream: micro-batches ``first`` and later are left out."""

    def __init__(self, first: int) -> None:
        super().__init__(f"the stream stops before micro-batch {first}")
        self.first = first


class Frame:
    """A message buffer and its views, made once: ``payload`` (the tensor's dtype and shape over the
    first bytes) and ``trailer`` (the last HEADER bytes as two float64, a numpy view on CPU)."""

    __slots__ = ("buf", "payload", "trailer")

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
        n = _numel(shape) * _itemsize(dtype)
        self.buf = torch.empty(n + HEADER, dtype=torch.uint8, device=device)
        self.payload = self.buf[:n].view(dtype).view(shape)
        # numpy accepts an unaligned view; on other devices the trailer goes through torch
        self.trailer = self.buf[n:].numpy().view(np.float64) if self.buf.device.type == "cpu" else None

    def key(self) -> tuple[tuple[int, ...], torch.dtype, torch.device]:
        return tuple(self.payload.shape), self.payload.dtype, self.buf.device

    def fill(self, t: torch.Tensor, tag: float, mb: int, ack: int = 0) -> torch.Tensor:
        """Write ``t`` and the trailer; returns the buffer to send."""
        self.payload.copy_(t.detach())
        if self.trailer is not None:
            self.trailer[0], self.trailer[1], self.trailer[2] = tag, float(mb), float(ack)
        else:
            trailer = torch.tensor([tag, float(mb), float(ack)], dtype=torch.float64)
            self.buf[-HEADER:].copy_(trailer.view(torch.uint8))
        return self.buf

    def ack(self) -> int:
        """The trailer's ack: messages the sender had taken from this frame's receiver."""
        if self.trailer is not None:
            return int(self.trailer[2])
        return int(self.buf[-HEADER:].clone().view(torch.float64)[2])

    def read(self) -> tuple[torch.Tensor, float, int]:
        """(a fresh leaf tensor viewing the payload, tag, micro-batch index)."""
        if self.trailer is not None:
            tag, mb = float(self.trailer[0]), float(self.trailer[1])
        else:
            tag, mb, _ = self.buf[-HEADER:].clone().view(torch.float64).tolist()  # clone: aligned
        # detach: a leaf of its own (the stage may set requires_grad on it), same storage, no copy
        return self.payload.detach(), tag, int(mb)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def pack(t: torch.Tensor, tag: float, mb: int, into: torch.Tensor | None = None,
         ack: int = 0) -> torch.Tensor:
    """``t`` as (t.nbytes + HEADER,) uint8: the tensor's bytes, then [tag, mb, ack] as float64.
    ``into``: a buffer of that size to fill (reuse) instead of a new one."""
    n = t.numel() * t.element_size()
    buf = torch.empty(n + HEADER, dtype=torch.uint8, device=t.device) if into is None else into
    buf[:n].view(t.dtype).view(t.shape).copy_(t.detach())
    buf[n:].copy_(torch.tensor([tag, float(mb), float(ack)], dtype=torch.float64).view(torch.uint8))
    return buf


def unpack(buf: torch.Tensor, meta: TensorMeta) -> tuple[torch.Tensor, float, int]:
    """(tensor of ``meta``'s shape viewing ``buf``, tag, micro-batch index)."""
    tag, mb, _ = buf[-HEADER:].clone().view(torch.float64).tolist()  # clone: 8-byte aligned
    # detach: a leaf of its own (the stage may set requires_grad on it), same storage, no copy
    tensor = buf[:-HEADER].view(meta.dtype).view(meta.shape).detach()
    return tensor, tag, int(mb)


def _users(buf: torch.Tensor) -> int:
    """How many tensors reference ``buf``'s storage (views, autograd's saved tensors, ...)."""
    return int(torch._C._storage_Use_Count(buf.untyped_storage()._cdata))


class Inbox:
    """The FIFO channel of one kind of message from one peer, with receives posted ahead.

    Up to ``ahead`` receives stay posted, so a burst of sends (GPipe's M forwards) lands while the
    stage computes instead of one message per ``take``.
    """

    def __init__(
        self,
        comm: Comm,
        rec: Recorder,
        peer: int,
        meta: TensorMeta,
        op: str,
        stage: int,
        device: torch.device,
        ahead: int = AHEAD,
    ) -> None:
        self.comm, self.rec, self.peer, self.meta, self.op, self.stage = comm, rec, peer, meta, op, stage
        self.device, self.ahead = device, max(1, ahead)
        self.left = 0  # messages expected on this channel and not yet posted
        self.taken = 0  # messages taken so far (the ack this rank sends back to ``peer``)
        self.acked = 0  # the peer's latest ack: messages it has taken from this rank
        self._posted: deque[tuple[Any, Frame]] = deque()
        self._lent: deque[tuple[Frame, int]] = deque()  # taken frames, their buffer's users then

    def expect(self, count: int) -> None:
        """Announce ``count`` more messages (a segment's worth) and post the first receives."""
        self.left += count
        self._post()

    def _frame(self) -> Frame:
        """A receive frame: a taken one the stage no longer uses, else a new one."""
        for i, (frame, users) in enumerate(self._lent):
            if _users(frame.buf) <= users:  # only the inbox holds it again
                del self._lent[i]
                return frame
        while len(self._lent) > POOL:  # never reused (the stage keeps them): stop tracking
            self._lent.popleft()
        return Frame(tuple(self.meta.shape), self.meta.dtype, self.device)

    def _post(self) -> None:
        while self.left > 0 and len(self._posted) < self.ahead:
            frame = self._frame()
            self._posted.append((self.comm.irecv(frame.buf, self.peer, op=self.op), frame))
            self.left -= 1

    def take(self, mb: int, step: int) -> tuple[torch.Tensor, float]:
        """Wait for the next message (a ``recv`` comm span), check it is ``mb``'s, post the next."""
        if not self._posted:
            raise RuntimeError(f"stage {self.stage}: no {self.op} expected from rank {self.peer}")
        work, frame = self._posted.popleft()
        with self.rec.span("recv", "comm", stage=self.stage, mb=mb, step=step, peer=self.peer, kind=self.op):
            work.wait()
        self._lent.append((frame, _users(frame.buf)))
        tensor, tag, got = frame.read()
        self.taken += 1
        self.acked = max(self.acked, frame.ack())
        self._post()
        if got == STOP:
            raise StreamStop(int(tag))
        if got != mb:
            raise RuntimeError(
                f"stage {self.stage} expected the {self.op} of micro-batch {mb} from rank "
                f"{self.peer} but received micro-batch {got}: the stages' schedules disagree."
            )
        return tensor, tag


    def close(self) -> None:
        """After a stream stopped early: take the padding the peer sends for every receive still
        posted (:meth:`Outbox.pad`), so none is left to match a later message."""
        for work, _ in self._posted:
            work.wait()
        self._posted.clear()
        self.left = 0


class Outbox:
    """Asynchronous sends; a buffer stays referenced until its send completes or is acknowledged
    (see Bounded sends in the module docstring)."""

    def __init__(self, comm: Comm, rec: Recorder, stage: int) -> None:
        self.comm, self.rec, self.stage = comm, rec, stage
        # (work, frame, start, span fields, peer, index of the send on its channel)
        self._pending: list[tuple[Any, Frame, float, dict[str, Any], int, int]] = []
        self._free: dict[tuple[Any, ...], list[Frame]] = {}  # frames of completed sends
        self._sent: dict[int, int] = {}  # peer -> sends so far
        self.peak_outstanding = 0

    @property
    def outstanding(self) -> int:
        return len(self._pending)

    def send(self, t: torch.Tensor, peer: int, op: str, tag: float, mb: int, step: int,
             ack: int = 0) -> None:
        """Send ``t`` to ``peer``; ``ack``: the messages this rank has taken from ``peer``."""
        spare = self._free.get((tuple(t.shape), t.dtype, t.device))
        frame = spare.pop() if spare else Frame(tuple(t.shape), t.dtype, t.device)
        buf = frame.fill(t, tag, mb, ack)
        start = self.rec.now()
        fields = {"stage": self.stage, "mb": mb, "step": step, "peer": peer, "kind": op}
        index = self._sent.get(peer, 0)
        self._sent[peer] = index + 1
        self._pending.append((self.comm.isend(buf, peer, op=op), frame, start, fields, peer, index))
        self.peak_outstanding = max(self.peak_outstanding, len(self._pending))

    def pad(self, peer: int, meta: TensorMeta, device: torch.device, count: int, op: str,
            mb: int = PAD, tag: float = 0.0) -> None:
        """``count`` messages of ``meta``'s shape that carry nothing (``mb`` PAD), or the STOP
        message (``mb`` STOP, ``tag`` the first micro-batch left out)."""
        zeros = torch.zeros(tuple(meta.shape), dtype=meta.dtype, device=device)
        for _ in range(count):
            self.send(zeros, peer, op, tag, mb, -1)

    def acknowledged(self, peer: int, taken: int) -> None:
        """``peer`` has taken ``taken`` of this rank's messages: wait on those (at once) and recycle."""
        self._finish(lambda work, p, i: p == peer and i < taken, wait=True)

    def poll(self) -> None:
        """Close the spans of sends that have completed and drop their buffers."""
        self._finish(lambda work, p, i: bool(work.is_completed()), wait=False)

    def drain(self) -> None:
        self._finish(lambda work, p, i: True, wait=True)

    def _finish(self, done: Any, wait: bool) -> None:
        still = []
        for work, frame, start, fields, peer, index in self._pending:
            if done(work, peer, index):
                if wait:
                    work.wait()
                self.rec.add_span("send", "comm", start, self.rec.now(), **fields)
                self._recycle(frame)
            else:
                still.append((work, frame, start, fields, peer, index))
        self._pending = still

    def _recycle(self, frame: Frame) -> None:
        free = self._free.setdefault(frame.key(), [])
        if len(free) < POOL:
            free.append(frame)


# --- the final model: every stage's slice gathered at rank 0 ---------------------------------------


def send_state(comm: Comm, state: Mapping[str, torch.Tensor], dst: int) -> None:
    """Send a stage's state tensors to ``dst`` in key order (op ``model_gather``)."""
    for key in sorted(state):
        comm.send(state[key].detach().contiguous(), dst, op="model_gather")


def recv_state(comm: Comm, into: Mapping[str, torch.Tensor], keys: list[str], src: int) -> None:
    """Receive ``keys`` from ``src`` straight into the tensors of ``into`` (same shapes, dtypes).

    The receiver holds the full model, so it already knows every shape: nothing else is sent.
    """
    for key in sorted(keys):
        target = into[key]
        buf = target if target.is_contiguous() else torch.empty_like(target)
        comm.recv(buf, src, op="model_gather")
        if buf is not target:
            target.copy_(buf)


def gather_stages(comm: Comm, index: int, state: Mapping[str, torch.Tensor],
                  keys_by_stage: Sequence[Sequence[str]], shapes: Mapping[str, torch.Size],
                  dtypes: Mapping[str, torch.dtype]) -> dict[str, torch.Tensor] | None:
    """Every stage's parameters at stage 0 of ``comm`` (group rank = stage; p2p, ``gather_model``
    bytes); None elsewhere."""
    if index != 0:
        for key in keys_by_stage[index]:
            comm.send(state[key].detach().contiguous(), 0, op="gather_model")
        return None
    full = {k: state[k].detach().clone() for k in keys_by_stage[0]}
    for s in range(1, len(keys_by_stage)):
        for key in keys_by_stage[s]:
            buf = torch.empty(shapes[key], dtype=dtypes[key])
            comm.recv(buf, s, op="gather_model")
            full[key] = buf
    return full
