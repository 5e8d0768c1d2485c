"""Explicit ring all-reduce, reduce-scatter and all-gather over point-to-point sends.

The classic bandwidth-optimal ring (Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms
for clusters of workstations", JPDC 2009; popularised for deep learning by Baidu's ring
all-reduce, 2017, and Horovod, Sergeev & Del Balso 2018):

* the flat tensor is cut into W chunks (chunk ``i`` holds elements ``[i·n//W, (i+1)·n//W)``, so
  chunks may be empty when the tensor has fewer than W elements);
* **reduce-scatter**, W−1 phases: in phase ``s`` rank ``r`` sends chunk ``(r−s) mod W`` to its
  successor and adds chunk ``(r−s−1) mod W`` received from its predecessor; afterwards rank ``r``
  holds the full sum of chunk ``(r+1) mod W``;
* **all-gather**, W−1 phases: in phase ``s`` rank ``r`` sends chunk ``(r+1−s) mod W`` and
  overwrites chunk ``(r−s) mod W`` with what it receives.

Each chunk travels in segments of at most ``segment_elems`` elements, and the phases are
pipelined segment by segment, not run one after the other: every receive of every phase is posted
at the start (in the order the predecessor sends), and segment k of phase s+1 is sent as soon as
segment k of phase s has arrived (and, in the reduce-scatter, been added), because what a rank
sends in phase s+1 is exactly the chunk it received in phase s. So no link waits for a whole
phase to finish on its neighbour: with one barrier per phase, the 2(W−1) small stalls added up to
5–9 % of the link at 8 emulated hosts (benchmarks/ring_testbed.py). The default segment is
2^18 elements (1 MiB of float32): at 8 hosts × 1 Gbit/s, 2^14-element segments made the ring
CPU-bound (0.77 of the link, the cores 95 % busy with per-message work), 2^16 gave 0.89 and 2^18
0.93, equal to gloo's own within 1 % (exploratory runs, 2 repeats). Sums happen in the tensor's
own dtype (exact for integer tensors). Bytes are counted by :class:`~polytrain.comm.Comm` at each
``isend``, i.e. exactly what went on the wire: 2·(W−1)/W of the tensor per rank, up to rounding of
the chunk sizes. Simplified against NCCL/Gloo: one ring, one direction, no topology awareness.

The two halves also run on their own (:func:`ring_reduce_scatter`, :func:`ring_all_gather`), each
sending (W−1) chunks per rank, with the schedule shifted by one chunk so that rank ``r`` ends up
with (reduce-scatter) or starts from (all-gather) chunk ``r``, the layout of torch's
``reduce_scatter_tensor`` / ``all_gather_into_tensor``. The accounted :class:`Comm` uses them for
CPU tensors because gloo's own reduce-scatter is an all-reduce followed by a slice
(``ProcessGroupGloo::reduce_scatter_tensor_coalesced``), twice the ring's bytes on the wire
(measured: docs/results/collective_wire_1gbit.md). :class:`RingRunner` runs them on one
background thread per communicator, in the order they were submitted, so that an asynchronous
call overlaps with the caller's work the way a gloo ``async_op`` does.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from polytrain.comm.accounted import Comm
    from polytrain.metrics.recorder import Recorder

DEFAULT_SEGMENT_ELEMS = 1 << 18  # 1 MiB of float32: see the module docstring


@dataclass(frozen=True)
class Phase:
    """One step of the ring schedule for one rank (plain data)."""

    kind: str  # "reduce-scatter" or "all-gather"
    step: int
    send_chunk: int
    recv_chunk: int


@dataclass
class PhaseTiming:
    phase: Phase
    bytes_sent: int
    start: float
    end: float


@dataclass
class RingStats:
    """What one ring all-reduce did on this rank: per-phase timings and bytes sent."""

    phases: list[PhaseTiming] = field(default_factory=list)

    @property
    def bytes_sent(self) -> int:
        return sum(p.bytes_sent for p in self.phases)


def chunk_bounds(numel: int, world: int) -> list[tuple[int, int]]:
    """The [start, end) element range of each of the W chunks (some may be empty)."""
    return [(i * numel // world, (i + 1) * numel // world) for i in range(world)]


def half_schedule(kind: str, rank: int, world: int, shift: int = -1) -> list[Phase]:
    """The W−1 phases of one half of the ring (``kind`` "reduce-scatter" or "all-gather") for
    rank ``rank``. ``shift`` -1 (the default) moves the chunk a rank ends (reduce-scatter) or starts
    (all-gather) with from ``rank + 1`` to ``rank``."""
    if world < 2:
        raise ValueError(f"a ring needs world size >= 2, got {world}")
    first = rank + shift if kind == "reduce-scatter" else rank + 1 + shift
    return [Phase(kind, s, (first - s) % world, (first - s - 1) % world) for s in range(world - 1)]


def ring_schedule(rank: int, world: int) -> list[Phase]:
    """The 2·(W−1) phases rank ``rank`` runs: reduce-scatter, then all-gather."""
    return half_schedule("reduce-scatter", rank, world, 0) + half_schedule("all-gather", rank, world, 0)


def _segments(start: int, end: int, seg: int) -> list[tuple[int, int]]:
    return [(a, min(a + seg, end)) for a in range(start, end, seg)]


def _peer(comm: Comm, group_rank: int) -> int:
    """The rank ``comm``'s p2p calls take for ``group_rank``: the global rank for a plain Comm over
    a group (torch's p2p takes global ranks), the group rank itself for a ``GroupComm``
    (``p2p_group_ranks``: its p2p speaks group ranks; with a global id, a dp group of ranks 1 and
    3 failed)."""
    if comm.group is None or comm.p2p_group_ranks:
        return group_rank
    return int(dist.get_global_rank(comm.group, group_rank))


def _bufs(flat: torch.Tensor, phase: Phase, segs: list[tuple[int, int]]) -> list[torch.Tensor]:
    """Where phase's segments land: fresh buffers to add (reduce-scatter), or in place."""
    if phase.kind == "reduce-scatter":
        return [torch.empty(b - a, dtype=flat.dtype) for a, b in segs]
    return [flat[a:b] for a, b in segs]


def _stream(comm: Comm, flat: torch.Tensor, phases: list[Phase], bounds: list[tuple[int, int]],
            seg: int, op: str) -> list[PhaseTiming]:
    nxt, prv = _peer(comm, (comm.rank + 1) % comm.world), _peer(comm, (comm.rank - 1) % comm.world)
    segs = [_segments(*bounds[p.recv_chunk], seg) for p in phases]
    bufs = [_bufs(flat, p, s) for p, s in zip(phases, segs, strict=True)]
    recvs: list[list[Any]] = [[comm.irecv(b, prv, op=op) for b in bs] for bs in bufs]
    sends: list[Any] = []
    timings = []
    for i, phase in enumerate(phases):
        start = time.perf_counter()
        # phase i sends the chunk phase i-1 received (phase 0: this rank's own chunk)
        send_segs = segs[i - 1] if i else _segments(*bounds[phase.send_chunk], seg)
        for k, (a, b) in enumerate(send_segs):
            if i:
                recvs[i - 1][k].wait()
                if phases[i - 1].kind == "reduce-scatter":
                    flat[a:b].add_(bufs[i - 1][k])
            sends.append(comm.isend(flat[a:b], nxt, op=op))
        sent = sum((b - a) * flat.element_size() for a, b in send_segs)
        timings.append(PhaseTiming(phase, sent, start, time.perf_counter()))
    for k, req in enumerate(recvs[-1]):
        req.wait()
        if phases[-1].kind == "reduce-scatter":  # a lone reduce-scatter: add its last phase
            a, b = segs[-1][k]
            flat[a:b].add_(bufs[-1][k])
    for req in sends:
        req.wait()
    return timings


def ring_all_reduce(tensor: torch.Tensor, comm: Comm, *, op: str = "ring",
                    segment_elems: int = DEFAULT_SEGMENT_ELEMS) -> RingStats:
    """Sum ``tensor`` in place over all ranks of ``comm`` with an explicit ring.

    Every rank must call it with a tensor of the same shape and dtype. Returns this rank's
    per-phase timings and bytes sent (also counted in ``comm`` under ``op``).
    """
    if segment_elems < 1:
        raise ValueError(f"segment_elems must be >= 1, got {segment_elems}")
    comm.verify(op, tensor)
    work = tensor if tensor.is_contiguous() else tensor.contiguous()
    flat = work.view(-1)
    bounds = chunk_bounds(flat.numel(), comm.world)
    stats = RingStats(_stream(comm, flat, ring_schedule(comm.rank, comm.world), bounds,
                              segment_elems, op))
    if work is not tensor:
        tensor.copy_(work)
    return stats


def ring_reduce_scatter(out: torch.Tensor, tensor: torch.Tensor, comm: Comm, *,
                        op: str = "reducescatter", segment_elems: int = DEFAULT_SEGMENT_ELEMS,
                        overwrite: bool = False) -> RingStats:
    """Sum the flat ``tensor`` (W·S elements) over the ranks of ``comm``; rank r gets the sum of
    elements [r·S, (r+1)·S) in ``out`` (S elements), like torch's ``reduce_scatter_tensor``.

    Sends (W−1)·S elements per rank. ``tensor`` is left as it was unless ``overwrite`` (then it
    is the ring's scratch space and its contents are undefined afterwards).
    """
    if tensor.numel() != comm.world * out.numel():
        raise ValueError(f"reduce-scatter of {tensor.numel()} elements into {out.numel()} per rank "
                         f"over {comm.world} ranks: the input must hold world x output elements")
    flat = tensor.reshape(-1) if overwrite and tensor.is_contiguous() else tensor.reshape(-1).clone()
    bounds = chunk_bounds(flat.numel(), comm.world)
    stats = RingStats(_stream(comm, flat, half_schedule("reduce-scatter", comm.rank, comm.world),
                              bounds, segment_elems, op))
    a, b = bounds[comm.rank]
    out.view(-1).copy_(flat[a:b])
    return stats


def ring_all_gather(out: torch.Tensor, tensor: torch.Tensor | None, comm: Comm, *,
                    op: str = "allgather", segment_elems: int = DEFAULT_SEGMENT_ELEMS) -> RingStats:
    """Gather every rank's ``tensor`` (S elements) into the contiguous ``out`` (W·S), rank r's
    at [r·S, (r+1)·S), like torch's ``all_gather_into_tensor``; sends (W−1)·S elements per rank.
    ``tensor`` None: this rank's part is already in place in ``out``."""
    if not out.is_contiguous():
        raise ValueError("ring all-gather needs a contiguous output tensor")
    flat = out.view(-1)
    bounds = chunk_bounds(flat.numel(), comm.world)
    a, b = bounds[comm.rank]
    if tensor is not None:
        if tensor.numel() * comm.world != flat.numel():
            raise ValueError(f"all-gather of {tensor.numel()} elements per rank into {flat.numel()} "
                             f"over {comm.world} ranks: the output must hold world x input elements")
        flat[a:b].copy_(tensor.reshape(-1))
    return RingStats(_stream(comm, flat, half_schedule("all-gather", comm.rank, comm.world), bounds,
                             segment_elems, op))


class RingWork:
    """The handle of a ring submitted to a :class:`RingRunner` (``wait`` like a torch Work)."""

    def __init__(self, future: Future[Any]) -> None:
        self._future = future

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the ring has finished; re-raise what it raised."""
        self._future.result(timeout)
        return True

    def is_completed(self) -> bool:
        return self._future.done()


class RingRunner:
    """Runs rings on one daemon thread, in submission order.

    Every rank submits its rings in the same order, so the point-to-point messages of successive
    rings pair up across ranks even when several are in flight; the caller's thread meanwhile
    computes (the backward pass, while reduce-scatters run) or posts other calls.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, fn: Callable[[], Any]) -> RingWork:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="polytrain-ring", daemon=True)
                self._thread.start()
        future: Future[Any] = Future()
        self._jobs.put((fn, future))
        return RingWork(future)

    def _loop(self) -> None:
        while True:
            fn, future = self._jobs.get()
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to whoever waits on the work
                future.set_exception(exc)


def done_work() -> RingWork:
    """A work that has already finished (a one-rank group's collective)."""
    future: Future[Any] = Future()
    future.set_result(None)
    return RingWork(future)


def record_ring(rec: Recorder, stats: RingStats, **fields: Any) -> None:
    """One ``comm`` span per ring phase: ``ring reduce-scatter 0`` … ``ring all-gather W-2``."""
    for p in stats.phases:
        rec.add_span(f"ring {p.phase.kind} {p.phase.step}", "comm", p.start - rec.t0, p.end - rec.t0,
                     bytes=p.bytes_sent, **fields)
