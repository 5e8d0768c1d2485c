"""The pipeline's wire without extra processes: message packing (any dtype, header and trailer),
frames, the receive inbox's buffer reuse, the send outbox's bounded pending sends and buffer
recycling (also when, as on gloo, polling never completes a send), and the glibc heap setting."""

from __future__ import annotations

import pytest
import torch

from polytrain.metrics.recorder import Recorder
from polytrain.models.boundaries import TensorMeta
from polytrain.strategies.pipeline.activations_wire import HEADER, Frame, Inbox, Outbox, pack, unpack
from polytrain.strategies.pipeline.heap import keep_heap


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_messages_carry_any_dtype_exactly_with_their_header(dtype: torch.dtype) -> None:
    t = torch.randn(3, 5).to(dtype)
    buf = pack(t, tag=2.3125, mb=7)
    assert buf.dtype == torch.uint8 and buf.numel() == HEADER + t.numel() * t.element_size()
    got, tag, mb = unpack(buf, TensorMeta((3, 5), dtype))
    assert torch.equal(got, t) and tag == 2.3125 and mb == 7
    got.requires_grad_()  # a received activation becomes a leaf the stage differentiates
    (got.float() * 2).sum().backward()
    assert got.grad is not None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_a_frame_writes_and_reads_what_pack_and_unpack_do(dtype: torch.dtype) -> None:
    t = torch.randn(3, 5).to(dtype)
    frame = Frame((3, 5), dtype, torch.device("cpu"))
    buf = frame.fill(t, tag=-1.5, mb=11)
    assert torch.equal(buf, pack(t, tag=-1.5, mb=11))  # the same bytes on the wire
    got, tag, mb = frame.read()
    assert torch.equal(got, t) and tag == -1.5 and mb == 11 and got.data_ptr() == buf.data_ptr()
    got.requires_grad_()  # a fresh leaf each read: the frame's own view stays untouched
    assert not frame.payload.requires_grad and not frame.read()[0].requires_grad
    received = Frame((3, 5), dtype, torch.device("cpu"))
    received.buf.copy_(pack(t, tag=2.0, mb=3))  # what irecv does
    got, tag, mb = received.read()
    assert torch.equal(got, t) and (tag, mb) == (2.0, 3)


class _Done:
    def wait(self) -> None: ...
    def is_completed(self) -> bool:
        return True


class _LoopComm:
    """irecv fills the buffer at once with the next queued message (no processes)."""

    def __init__(self, messages: list[torch.Tensor]) -> None:
        self.messages = messages
        self.sent: list[torch.Tensor] = []

    def irecv(self, buf: torch.Tensor, src: int, op: str = "send") -> _Done:
        buf.copy_(self.messages.pop(0))
        return _Done()

    def isend(self, buf: torch.Tensor, dst: int, op: str = "send") -> _Done:
        self.sent.append(buf.clone())
        return _Done()


def test_inbox_reuses_a_buffer_only_once_the_stage_dropped_it() -> None:
    meta = TensorMeta((2, 3), torch.float32)
    values = [torch.full((2, 3), float(i)) for i in range(4)]
    comm = _LoopComm([pack(v, 0.0, i) for i, v in enumerate(values)])
    inbox = Inbox(comm, Recorder(0), 0, meta, "activation", 1, torch.device("cpu"), ahead=1)  # type: ignore[arg-type]
    inbox.expect(4)
    a0, _ = inbox.take(0, 1)
    a0.requires_grad_()
    kept = (a0 * 2).sum()  # autograd keeps a0 alive: its buffer must not be refilled
    a1, _ = inbox.take(1, 1)  # a new buffer: micro-batch 0's is still in use
    assert a1.data_ptr() != a0.data_ptr()
    ptr1 = a1.data_ptr()
    del a1  # nothing references micro-batch 1's buffer any more
    a2, _ = inbox.take(2, 1)  # posts micro-batch 3's receive into micro-batch 1's buffer
    a3, _ = inbox.take(3, 1)
    assert a3.data_ptr() == ptr1 and a2.data_ptr() not in (ptr1, a0.data_ptr())
    assert torch.equal(a0.detach(), values[0]) and torch.equal(a2, values[2]) and torch.equal(a3, values[3])
    kept.backward()


def test_outbox_reuses_buffers_of_completed_sends() -> None:
    comm = _LoopComm([])
    out = Outbox(comm, Recorder(0), 0)  # type: ignore[arg-type]
    out.send(torch.ones(4), 1, "activation", 1.0, 0, 1)
    first = out._pending[0][1].buf.data_ptr()
    out.poll()
    out.send(torch.full((4,), 2.0), 1, "activation", 1.0, 1, 1)
    assert out._pending[0][1].buf.data_ptr() == first  # the completed send's buffer, refilled
    out.drain()
    got = [unpack(b, TensorMeta((4,), torch.float32)) for b in comm.sent]
    assert [(t.tolist(), mb) for t, _, mb in got] == [([1.0] * 4, 0), ([2.0] * 4, 1)]


class _GlooLikeWork:
    """A send that, as on gloo, reports itself incomplete until waited on."""

    def __init__(self) -> None:
        self.waited = False

    def is_completed(self) -> bool:
        return self.waited

    def wait(self) -> None:
        self.waited = True


class _GlooLikeComm(_LoopComm):
    def isend(self, buf: torch.Tensor, dst: int, op: str = "send") -> _GlooLikeWork:  # type: ignore[override]
        self.sent.append(buf.clone())
        return _GlooLikeWork()


def test_outbox_keeps_only_unacknowledged_sends_when_polling_never_completes() -> None:
    comm = _GlooLikeComm([])
    out = Outbox(comm, Recorder(0), 0)  # type: ignore[arg-type]
    for mb in range(1000):  # a long stream: the peer acknowledges all but the last 3 messages
        out.send(torch.full((4,), float(mb)), 1, "activation", 0.0, mb, mb, ack=mb)
        out.poll()  # gloo: never completes anything
        out.acknowledged(1, max(0, mb - 2))
    assert out.outstanding == 3 and out.peak_outstanding == 4
    assert sum(len(v) for v in out._free.values()) <= 4  # buffers recycled, not one per message
    out.acknowledged(2, 10_000)  # another peer's ack frees nothing of this channel
    assert out.outstanding == 3
    out.drain()
    assert out.outstanding == 0 and len(comm.sent) == 1000
    acks = [int(b[-HEADER:].view(torch.float64)[2]) for b in comm.sent[:3]]
    assert acks == [0, 1, 2]  # the ack travels in the trailer


def test_keep_heap_sets_glibc_thresholds() -> None:
    import platform

    assert keep_heap() == (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")
