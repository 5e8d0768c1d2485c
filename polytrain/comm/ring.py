"""Explicit ring all-reduce over point-to-point sends.

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

Each chunk travels in segments of at most ``segment_elems`` elements: all receives of a phase are
posted first, then all sends, and each received segment is summed as soon as it arrives, so the
link carries later segments while earlier ones are being added. Sums happen in the tensor's own
dtype (exact for integer tensors). Bytes are counted by :class:`~polytrain.comm.Comm` at each
``isend``, i.e. exactly what went on the wire: 2·(W−1)/W of the tensor per rank, up to rounding of
the chunk sizes. Simplified against NCCL/Gloo: one ring, one direction, no topology awareness.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from polytrain.comm.accounted import Comm

DEFAULT_SEGMENT_ELEMS = 1 << 16


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


def ring_schedule(rank: int, world: int) -> list[Phase]:
    """The 2·(W−1) phases rank ``rank`` runs: reduce-scatter, then all-gather."""
    if world < 2:
        raise ValueError(f"ring all-reduce needs world size >= 2, got {world}")
    rs = [Phase("reduce-scatter", s, (rank - s) % world, (rank - s - 1) % world)
          for s in range(world - 1)]
    ag = [Phase("all-gather", s, (rank + 1 - s) % world, (rank - s) % world)
          for s in range(world - 1)]
    return rs + ag


def _segments(start: int, end: int, seg: int) -> list[tuple[int, int]]:
    return [(a, min(a + seg, end)) for a in range(start, end, seg)]


def _peer(comm: Comm, group_rank: int) -> int:
    """Global rank of ``group_rank`` in the communicator's group (p2p takes global ranks)."""
    if comm.group is None:
        return group_rank
    return int(dist.get_global_rank(comm.group, group_rank))


def _run_phase(comm: Comm, flat: torch.Tensor, phase: Phase, bounds: list[tuple[int, int]],
               seg: int, op: str) -> int:
    nxt, prv = _peer(comm, (comm.rank + 1) % comm.world), _peer(comm, (comm.rank - 1) % comm.world)
    recv_segs = _segments(*bounds[phase.recv_chunk], seg)
    send_segs = _segments(*bounds[phase.send_chunk], seg)
    reduce = phase.kind == "reduce-scatter"
    bufs = [torch.empty(b - a, dtype=flat.dtype) if reduce else flat[a:b] for a, b in recv_segs]
    recvs: list[Any] = [comm.irecv(buf, prv, op=op) for buf in bufs]
    sends: list[Any] = [comm.isend(flat[a:b], nxt, op=op) for a, b in send_segs]
    for (a, b), buf, req in zip(recv_segs, bufs, recvs, strict=True):
        req.wait()
        if reduce:
            flat[a:b].add_(buf)
    for req in sends:
        req.wait()
    return sum((b - a) * flat.element_size() for a, b in send_segs)


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
    stats = RingStats()
    for phase in ring_schedule(comm.rank, comm.world):
        start = time.perf_counter()
        sent = _run_phase(comm, flat, phase, bounds, segment_elems, op)
        stats.phases.append(PhaseTiming(phase, sent, start, time.perf_counter()))
    if work is not tensor:
        tensor.copy_(work)
    return stats
