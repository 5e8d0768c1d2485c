"""A worker's side of the parameter-server protocol (:mod:`polytrain.strategies.ps.server` has the
messages and the server): :class:`PSClient` pushes to and pulls from every server at once, and
:func:`gather_shards` collects the servers' final shards on one rank.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from polytrain.comm import Comm
from polytrain.comm.codecs.engine import Engine
from polytrain.runtime.sharding import ShardPlan
from polytrain.strategies.ps.pulls import PullDecoder
from polytrain.strategies.ps.server import DONE, HEADER, PULL, PUSH, SAVE


def shard_name(s: int) -> str:
    """How codec errors (and residuals) name server ``s``'s shard of the flat parameters."""
    return f"shard of server {s}"


class PSClient:
    """One worker's side: push to and pull from every server at once."""

    def __init__(self, comm: Comm, plan: ShardPlan, servers: list[int], sparse: bool = True,
                 engine: Engine | None = None, pulls: PullDecoder | None = None) -> None:
        self.comm, self.plan, self.servers, self.sparse = comm, plan, servers, sparse
        self.engine = engine  # a codec for pushes (``compression=``): one residual per server shard
        self.pulls = pulls  # compressed replies: the payload's size comes in the header
        self.sparse_pushes = 0
        self.sends: list[tuple[Any, torch.Tensor]] = []
        self.recvs: list[tuple[Any, int, torch.Tensor, torch.Tensor]] = []
        self.flat = torch.zeros(plan.total)
        self.wait_s = 0.0

    def _request(self, s: int, kind: int, clock: int, need: int, reply: bool, nnz: int = -1) -> None:
        rank = self.servers[s]
        if reply:  # post the receives first: the answer may come at once
            head = torch.zeros(HEADER, dtype=torch.int64)
            data = torch.empty(self.plan.sizes()[s])
            self.recvs.append((self.comm.irecv(head, rank, op="ps_header"), s, head, data))
            if self.pulls is None:
                self.recvs.append((self.comm.irecv(data, rank, op="ps_pull"), s, head, data))
        head = torch.tensor([kind, clock, need, int(reply), nnz], dtype=torch.int64)
        self.sends.append((self.comm.isend(head, rank, op="ps_header"), head))

    def _settle_sends(self) -> None:
        self.sends = [(w, t) for w, t in self.sends if not w.is_completed()]

    def push(self, flat_grad: torch.Tensor, clock: int, need: int | None = None) -> None:
        """Send each server its shard of ``flat_grad`` (N,); with ``need``, also ask for the
        parameters once the server's step reaches ``need`` (collect them with :meth:`wait`)."""
        self._settle_sends()
        for s, rank in enumerate(self.servers):
            part = self.plan.gather(flat_grad, s).contiguous()
            if self.engine is not None:
                self._push_encoded(s, rank, part, clock, need)
                continue
            idx = part.nonzero().squeeze(1) if self.sparse else None
            dense = idx is None or 2 * idx.numel() >= part.numel()
            self._request(s, PUSH, clock, need if need is not None else 0, need is not None,
                          -1 if dense or idx is None else idx.numel())
            if dense or idx is None:
                self.sends.append((self.comm.isend(part, rank, op="ps_push"), part))
                continue
            self.sparse_pushes += 1
            if idx.numel():
                pairs = (idx.to(torch.int32), part[idx].contiguous())
                self.sends += [(self.comm.isend(t, rank, op="ps_push"), t) for t in pairs]

    def _push_encoded(self, s: int, rank: int, part: torch.Tensor, clock: int, need: int | None) -> None:
        assert self.engine is not None
        buf = self.engine.encode(s, shard_name(s), part, (part.numel(),))
        self.engine.done(s)
        self._request(s, PUSH, clock, need if need is not None else 0, need is not None, -2 - buf.numel())
        self.sends.append((self.comm.isend(buf, rank, op="ps_push"), buf))

    def pull(self, clock: int, need: int) -> None:
        """Ask every server for its shard once its step reaches ``need``."""
        self._settle_sends()
        for s in range(len(self.servers)):
            self._request(s, PULL, clock, need, True)

    def wait(self) -> tuple[torch.Tensor, list[int], list[int]]:
        """Wait for the requested shards: (flat parameters (N,), steps, versions per server)."""
        t0 = time.perf_counter()
        steps, versions = [0] * len(self.servers), [0] * len(self.servers)
        if self.pulls is not None:
            self._wait_compressed(steps, versions)
        for i, (work, s, head, data) in enumerate(self.recvs):
            work.wait()
            if i % 2:  # the data message of this server has arrived
                versions[s], steps[s] = int(head[0]), int(head[1])
                self.plan.scatter(self.flat, s, data)
        for w, _ in self.sends:
            w.wait()
        self.recvs, self.sends = [], []
        self.wait_s += time.perf_counter() - t0
        return self.flat, steps, versions

    def _wait_compressed(self, steps: list[int], versions: list[int]) -> None:
        """Compressed replies: each header gives its payload's size; then apply each payload."""
        assert self.pulls is not None
        posted = []
        for work, s, head, _ in self.recvs:
            work.wait()
            data = self.pulls.receive_buffer(int(head[2]), self.plan.sizes()[s])
            posted.append((self.comm.irecv(data, self.servers[s], op="ps_pull"), s, head, data))
        for work, s, head, data in posted:
            work.wait()
            versions[s], steps[s] = int(head[0]), int(head[1])
            view = self.plan.gather(self.flat, s).contiguous()
            self.plan.scatter(self.flat, s, self.pulls.apply(s, self.servers[s], int(head[2]), data, view))
        self.recvs = []

    def save(self, clock: int) -> None:
        """Ask every server to checkpoint at ``clock`` (after this worker's push of it) and wait
        until each has written its state (its ack)."""
        acks = []
        for s, rank in enumerate(self.servers):
            head = torch.zeros(HEADER, dtype=torch.int64)
            acks.append((self.comm.irecv(head, rank, op="ps_ack"), head))
            self._request(s, SAVE, clock, 0, False)
        t0 = time.perf_counter()
        for work, _ in [*acks, *self.sends]:
            work.wait()
        self.sends = []
        self.wait_s += time.perf_counter() - t0
        if self.pulls is not None:
            self.pulls.reset()  # as the servers did: their next replies are dense

    def done(self) -> None:
        """Tell every server this worker has finished (after its last push)."""
        for s in range(len(self.servers)):
            self._request(s, DONE, 0, 0, False)
        for w, _ in self.sends:
            w.wait()
        self.sends = []


def gather_shards(comm: Comm, plan: ShardPlan, servers: list[int], shard: torch.Tensor | None,
                  dst: int) -> torch.Tensor | None:
    """Servers send their final shards to ``dst`` (op ``ps_collect``), which may be a server
    itself (then ``shard`` is its own) or another rank: (N,) at ``dst``, None elsewhere."""
    if comm.rank != dst:
        if shard is None:
            raise ValueError("a sending server must pass its shard")
        comm.send(shard.contiguous(), dst, op="ps_collect")
        return None
    flat = torch.zeros(plan.total)
    for s, rank in enumerate(servers):
        if rank == dst and shard is not None:
            plan.scatter(flat, s, shard)
            continue
        part = torch.empty(plan.sizes()[s])
        comm.recv(part, rank, op="ps_collect")
        plan.scatter(flat, s, part)
    return flat
