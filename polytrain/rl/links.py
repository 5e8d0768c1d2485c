"""One gloo process group per (server, client) pair, so that a client's failure stays on its link.

What gloo (the tcp transport torch 2.13 ships) does when a peer dies or falls silent, read from
its source (``gloo/transport/tcp/{pair,context,unbound_buffer}.cc``) and checked here:

* a dead peer's socket error closes that one *pair* and fails the operations posted on it;
  operations on other pairs go on;
* but a receive from *any* source is matched to a pair as soon as that pair announces a send;
  if the sender dies before its data arrives, the receive fails — with no source rank to tell
  which client it was (the cause of the apex killed-actor failures, issue 7);
* and a receive or send that times out signals an error on *every* pair of its context: one
  silent client would end every other link of a shared group.

So every link between a server (the replay) and a client (a learner or an actor) is its own
two-rank group: the server receives from each client on that client's link (one receiver
thread each, :class:`polytrain.rl.protocol.Hub`), a connection error names its client, and even a
timeout on one link leaves the others untouched. The world group still carries the start-up
barrier and gorila's parameter-server traffic (which only learners take part in).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from polytrain.comm import Comm


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class Link:
    """Point-to-point traffic between two ranks over their own group (global rank numbers),
    every byte booked on this rank's world communicator like any other message."""

    def __init__(self, parent: Comm, ranks: tuple[int, int], group: Any) -> None:
        self.parent = parent
        self.group = group
        # group-local numbers: new_group sorts its members, so (replay 1, learner 0) is (1, 0)
        self.local = {r: dist.get_group_rank(group, r) for r in ranks}

    def _local(self, rank: int) -> int:
        return self.local[rank]

    def send(self, tensor: torch.Tensor, dst: int, op: str = "send") -> None:
        self.parent.record(op, dst, _nbytes(tensor))
        dist.send(tensor, group=self.group, group_dst=self._local(dst))

    def recv(self, tensor: torch.Tensor, src: int, op: str = "send") -> int:
        dist.recv(tensor, group=self.group, group_src=self._local(src))
        self.parent.record(op, src, _nbytes(tensor), received=True)
        return src

    def isend(self, tensor: torch.Tensor, dst: int, op: str = "send") -> Any:
        self.parent.record(op, dst, _nbytes(tensor))
        return dist.isend(tensor, group=self.group, group_dst=self._local(dst))

    def irecv(self, tensor: torch.Tensor, src: int, op: str = "send") -> Any:
        self.parent.record(op, src, _nbytes(tensor), received=True)
        return dist.irecv(tensor, group=self.group, group_src=self._local(src))


def make_links(comm: Comm, server: int, clients: list[int], timeout_s: float) -> dict[int, Link]:
    """This rank's links: peer rank -> Link. Every rank calls this with the same arguments
    (``new_group`` is collective over the world, and groups must be created in one order)."""
    links: dict[int, Link] = {}
    for client in clients:
        group = dist.new_group([server, client], timeout=timedelta(seconds=timeout_s))
        if comm.rank == server:
            links[client] = Link(comm, (server, client), group)
        elif comm.rank == client:
            links[server] = Link(comm, (server, client), group)
    return links
