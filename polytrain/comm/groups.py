"""Communicators over process sub-groups (stage replicas, tensor groups, data-parallel rows).

A :class:`GroupComm` speaks group-local ranks and books every byte on the rank's world
communicator with global peer ids, so ``bytes_sent`` in summary.json includes sub-group traffic.
Create groups with :func:`new_groups`: every rank of the job calls it with the same lists, in the
same order (``torch.distributed.new_group`` is collective).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from polytrain.comm.accounted import Comm


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class GroupComm(Comm):
    """A Comm over a process sub-group; ranks are group-local, bytes are booked on ``parent``.

    ``ranks[i]`` is the global rank of group member i.
    """

    p2p_group_ranks = True

    def __init__(self, parent: Comm, ranks: Sequence[int], group: Any) -> None:
        super().__init__(list(ranks).index(parent.rank), len(ranks), group=group, check=parent.check)
        self.parent = parent
        self.ranks = list(ranks)

    def record(self, op: str, peer: int, nbytes: int, *, received: bool = False) -> None:
        self.parent.record(op, self.ranks[peer], nbytes, received=received)

    def send(self, tensor: torch.Tensor, dst: int, op: str = "send") -> None:
        self.record(op, dst, _nbytes(tensor))
        dist.send(tensor, group=self.group, group_dst=dst)

    def recv(self, tensor: torch.Tensor, src: int | None = None, op: str = "send") -> int:
        if src is None:
            raise ValueError("GroupComm.recv needs an explicit source rank")
        dist.recv(tensor, group=self.group, group_src=src)
        self.record(op, src, _nbytes(tensor), received=True)
        return src

    def isend(self, tensor: torch.Tensor, dst: int, op: str = "send") -> Any:
        self.record(op, dst, _nbytes(tensor))
        return dist.isend(tensor, group=self.group, group_dst=dst)

    def irecv(self, tensor: torch.Tensor, src: int, op: str = "send") -> Any:
        self.record(op, src, _nbytes(tensor), received=True)
        return dist.irecv(tensor, group=self.group, group_src=src)

    # A one-rank group has no process group (``group`` None would mean the WORLD): no traffic.
    def all_reduce(self, tensor: torch.Tensor, op: str = "allreduce", async_op: bool = False) -> Any:
        if self.world == 1:
            return None
        return super().all_reduce(tensor, op=op, async_op=async_op)

    def all_gather(self, out: list[torch.Tensor], tensor: torch.Tensor, op: str = "allgather") -> None:
        if self.world == 1:
            out[0].copy_(tensor)
            return
        super().all_gather(out, tensor, op=op)

    def broadcast(self, tensor: torch.Tensor, src: int, op: str = "broadcast") -> None:
        if self.world == 1:
            return
        self.verify(op, tensor)
        if self.rank == src:
            for peer in range(self.world):
                if peer != src:
                    self.record(op, peer, _nbytes(tensor))
        else:
            self.record(op, src, _nbytes(tensor), received=True)
        dist.broadcast(tensor, group=self.group, group_src=src)


def new_groups(comm: Comm, partition: Sequence[Sequence[int]]) -> GroupComm:
    """Create one process group per rank list in ``partition`` (every rank calls this with the
    same lists) and return the communicator of the group holding this rank. A one-rank group
    creates no process group (its communicator is never used for traffic)."""
    mine: GroupComm | None = None
    for ranks in partition:
        group = dist.new_group(list(ranks)) if len(ranks) > 1 else None
        if comm.rank in ranks:
            mine = GroupComm(comm, ranks, group)
    if mine is None:
        raise ValueError(f"rank {comm.rank} is in none of the groups {list(partition)}")
    return mine
