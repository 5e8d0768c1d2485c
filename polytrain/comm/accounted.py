"""Accounted communication: every message a strategy sends goes through :class:`Comm`.

Bytes are counted per (peer, operation) on the sending side, from the tensors actually passed:

* point-to-point (``send``/``isend``): the payload, exactly;
* ``all_reduce``: what a ring all-reduce sends — each rank passes 2·(W−1)/W of the tensor to its
  successor (reduce-scatter, then all-gather);
* ``all_gather`` / ``all_gather_into``: ring all-gather — (W−1) chunks of the local tensor to the
  successor;
* ``reduce_scatter``: ring reduce-scatter — (W−1) chunks of the output's size to the successor;
* on CPU tensors ``reduce_scatter`` and ``all_gather_into`` *are* that ring, polytrain's own over
  point-to-point (:mod:`polytrain.comm.ring`), each message counted as it is sent: gloo's own
  reduce-scatter is an all-reduce and a slice, twice those bytes on the wire
  (docs/results/collective_wire_1gbit.md). CUDA tensors keep the backend's (NCCL's) collectives;
* ``broadcast``: a flat tree — the source sends the tensor once to every other rank.

With ``check=True`` (``--debug``, and always in the test suite) every collective first compares
its operation, dtype and shape across ranks and raises :class:`CollectiveMismatch` naming each
rank's call — gloo itself would silently combine mismatched calls. (PyTorch's own
TORCH_DISTRIBUTED_DEBUG=DETAIL does the same, but on torch 2.13/CPU it crashes DDP's constructor
with SIGSEGV, so polytrain checks at its own layer, which every strategy's traffic goes through.)

Traffic that only serves bookkeeping (barriers, gathering results for the summary) is counted
apart as ``control`` and left out of ``bytes_sent``. The testbed cross-checks these counts
against the network interfaces' own counters.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from polytrain.comm.ring import RingRunner, done_work, ring_all_gather, ring_reduce_scatter

SpanHook = Callable[[str, float, float], None]


class CollectiveMismatch(RuntimeError):
    """Ranks called different collectives (or with different shapes) at the same point."""


_DTYPES = {dt: i for i, dt in enumerate([torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                          torch.int64, torch.int32, torch.uint8, torch.int8, torch.bool])}
_SIG_LEN = 8


def _signature(op: str, t: torch.Tensor) -> torch.Tensor:
    """(op id, dtype, numel, ndim, first 4 dims) as int64 — compared across ranks."""
    op_id = int.from_bytes(op.encode()[:7].ljust(7, b"\0"), "little")
    shape = list(t.shape)[:4] + [-1] * (4 - min(4, t.dim()))
    return torch.tensor([op_id, _DTYPES.get(t.dtype, 99), t.numel(), t.dim(), *shape], dtype=torch.int64)


def _describe(sig: list[int]) -> str:
    op = sig[0].to_bytes(7, "little").rstrip(b"\0").decode(errors="replace")
    shape = [d for d in sig[4:] if d >= 0]
    return f"{op}(shape={shape}, numel={sig[2]})"


# torch 2.13 names the flat collectives *_single and deprecates *_tensor (a FutureWarning per call)
_all_gather_single = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class Comm:
    """A thin, counting layer over ``torch.distributed`` for one rank."""

    p2p_group_ranks: ClassVar[bool] = False  # p2p peers are global ranks (GroupComm: group ranks)

    def __init__(self, rank: int, world: int, group: Any = None, check: bool = False) -> None:
        self.rank = rank
        self.check = check
        self.world = world
        self.group = group
        self._lock = threading.Lock()
        self.sent: dict[tuple[int, str], int] = defaultdict(int)
        self.received: dict[tuple[int, str], int] = defaultdict(int)
        self.control_bytes = 0
        self._rings = RingRunner()  # CPU reduce-scatter / all-gather, in call order

    # ---- accounting -------------------------------------------------------------------------
    def record(self, op: str, peer: int, nbytes: int, *, received: bool = False) -> None:
        """Count ``nbytes`` sent to (or received from) ``peer`` by operation ``op``."""
        with self._lock:
            (self.received if received else self.sent)[(peer, op)] += int(nbytes)

    @property
    def bytes_sent(self) -> int:
        return sum(self.sent.values())

    @property
    def bytes_received(self) -> int:
        return sum(self.received.values())

    def by_op(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for (_, op), n in self.sent.items():
            out[op] += n
        return dict(out)

    def by_peer(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for (peer, _), n in self.sent.items():
            out[str(peer)] += n
        return dict(out)

    def verify(self, op: str, tensor: torch.Tensor) -> None:
        """Raise CollectiveMismatch unless every rank is making this same call (check mode)."""
        if not self.check or self.world == 1:
            return
        mine = _signature(op, tensor)
        sigs = [torch.zeros(_SIG_LEN, dtype=torch.int64) for _ in range(self.world)]
        dist.all_gather(sigs, mine, group=self.group)
        if any(not torch.equal(s, mine) for s in sigs):
            calls = "; ".join(f"rank {r}: {_describe(s.tolist())}" for r, s in enumerate(sigs))
            raise CollectiveMismatch(
                f"Ranks disagree on a collective ({calls}). Every rank must make the same "
                "collective calls, in the same order, with the same shapes."
            )

    def _ring_next(self) -> int:
        return (self.rank + 1) % self.world

    # ---- point to point ---------------------------------------------------------------------
    def send(self, tensor: torch.Tensor, dst: int, op: str = "send") -> None:
        self.record(op, dst, _nbytes(tensor))
        dist.send(tensor, dst, group=self.group)

    def recv(self, tensor: torch.Tensor, src: int | None = None, op: str = "send") -> int:
        peer = dist.recv(tensor, src, group=self.group)
        self.record(op, peer, _nbytes(tensor), received=True)
        return peer

    def isend(self, tensor: torch.Tensor, dst: int, op: str = "send") -> Any:
        self.record(op, dst, _nbytes(tensor))
        return dist.isend(tensor, dst, group=self.group)

    def irecv(self, tensor: torch.Tensor, src: int, op: str = "send") -> Any:
        self.record(op, src, _nbytes(tensor), received=True)
        return dist.irecv(tensor, src, group=self.group)

    # ---- collectives ------------------------------------------------------------------------
    def _count_ring_allreduce(self, tensor: torch.Tensor, op: str) -> None:
        if self.world > 1:
            share = 2 * (self.world - 1) * _nbytes(tensor) // self.world
            self.record(op, self._ring_next(), share)
            self.record(op, (self.rank - 1) % self.world, share, received=True)

    def all_reduce(self, tensor: torch.Tensor, op: str = "allreduce", async_op: bool = False) -> Any:
        """Sum ``tensor`` in place over all ranks of the group."""
        self.verify(op, tensor)
        self._count_ring_allreduce(tensor, op)
        return dist.all_reduce(tensor, group=self.group, async_op=async_op)

    def all_reduce_future(self, tensor: torch.Tensor, op: str = "allreduce",
                          on_done: Callable[[], None] | None = None) -> torch.futures.Future:
        """Asynchronous sum returning a Future of the reduced tensor (for DDP comm hooks).

        ``on_done`` runs when the reduction has finished, in the same callback that unwraps the
        result: one Python callback per call, so gloo's thread takes the GIL once.
        """
        work = self.all_reduce(tensor, op=op, async_op=True)

        def done(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            if on_done is not None:
                on_done()
            return fut.value()[0]

        return work.get_future().then(done)

    def all_gather(self, out: list[torch.Tensor], tensor: torch.Tensor, op: str = "allgather") -> None:
        self.verify(op, tensor)
        if self.world > 1:
            self.record(op, self._ring_next(), (self.world - 1) * _nbytes(tensor))
        dist.all_gather(out, tensor, group=self.group)

    def all_gather_into(self, out: torch.Tensor, tensor: torch.Tensor, op: str = "allgather",
                        async_op: bool = False) -> Any:
        """Ring all-gather of ``tensor`` (S,) into the flat ``out`` (W·S,), rank r's at [rS, (r+1)S)."""
        self.verify(op, tensor)
        if self.world == 1:
            out.copy_(tensor.reshape(out.shape))
            return done_work() if async_op else None
        if out.device.type == "cpu":  # this rank's part goes in now: the caller may reuse tensor
            chunk = out.numel() // self.world
            out.view(-1)[self.rank * chunk : (self.rank + 1) * chunk].copy_(tensor.reshape(-1))
            return self._ring(lambda: ring_all_gather(out, None, self, op=op), async_op)
        self.record(op, self._ring_next(), (self.world - 1) * _nbytes(tensor))
        return _all_gather_single(out, tensor, group=self.group, async_op=async_op)

    def reduce_scatter(self, out: torch.Tensor, tensor: torch.Tensor, op: str = "reducescatter",
                       async_op: bool = False) -> Any:
        """Sum the flat ``tensor`` (W·S,) over ranks; rank r receives chunk r in ``out`` (S,).
        Counted as a ring reduce-scatter: (W−1) chunks of S elements to the successor."""
        self.verify(op, tensor)
        if self.world == 1:
            out.copy_(tensor.reshape(out.shape))
            return done_work() if async_op else None
        if tensor.device.type == "cpu":  # scratch copied now: the caller may reuse tensor
            scratch = tensor.reshape(-1).clone()
            return self._ring(lambda: ring_reduce_scatter(out, scratch, self, op=op, overwrite=True),
                              async_op)
        self.record(op, self._ring_next(), (self.world - 1) * _nbytes(out))
        return _reduce_scatter_single(out, tensor, group=self.group, async_op=async_op)

    def _ring(self, fn: Callable[[], Any], async_op: bool) -> Any:
        """Run a ring on this Comm's ring thread (after the rings submitted before it): its work
        handle, or None once it has finished (``async_op`` False)."""
        work = self._rings.submit(fn)
        if async_op:
            return work
        work.wait()
        return None

    def broadcast(self, tensor: torch.Tensor, src: int, op: str = "broadcast") -> None:
        self.verify(op, tensor)
        if self.rank == src:
            for peer in range(self.world):
                if peer != src:
                    self.record(op, peer, _nbytes(tensor))
        else:
            self.record(op, src, _nbytes(tensor), received=True)
        dist.broadcast(tensor, src, group=self.group)

    # ---- control (bookkeeping, not counted in bytes_sent) -------------------------------------
    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier(group=self.group)

    def gather_json(self, obj: Any, dst: int = 0) -> list[Any] | None:
        """Gather a JSON-able object from every rank at ``dst`` (JSON, never pickle, on the wire)."""
        if self.world == 1:
            return [obj]
        data = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8)
        size = torch.tensor([data.numel()], dtype=torch.int64)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
        dist.all_gather(sizes, size, group=self.group)
        longest = int(max(s.item() for s in sizes))
        padded = torch.zeros(longest, dtype=torch.uint8)
        padded[: data.numel()] = data
        bufs = [torch.zeros(longest, dtype=torch.uint8) for _ in range(self.world)]
        dist.all_gather(bufs, padded, group=self.group)
        with self._lock:
            self.control_bytes += (self.world - 1) * (longest + 8)
        if self.rank != dst:
            return None
        return [json.loads(b[: int(s.item())].numpy().tobytes()) for b, s in zip(bufs, sizes, strict=True)]

    def broadcast_json(self, obj: Any, src: int = 0) -> Any:
        """Send a JSON-able object from ``src`` to every rank."""
        if self.world == 1:
            return obj
        payload = json.dumps(obj).encode() if self.rank == src else b""
        size = torch.tensor([len(payload)], dtype=torch.int64)
        dist.broadcast(size, src, group=self.group)
        buf = torch.zeros(int(size.item()), dtype=torch.uint8)
        if self.rank == src:
            buf[:] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        dist.broadcast(buf, src, group=self.group)
        with self._lock:
            self.control_bytes += len(payload) + 8
        return json.loads(buf.numpy().tobytes())

    def summary(self) -> dict[str, Any]:
        return {
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "bytes_by_op": self.by_op(),
            "bytes_by_peer": self.by_peer(),
            "control_bytes": self.control_bytes,
        }
