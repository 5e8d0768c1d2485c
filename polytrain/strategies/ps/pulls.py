"""Compressed pulls for ``ps``: the server sends each worker the change of its shard since what
that worker holds, through the job's codec (``--set compression=CODEC``, ``compress_pulls=true``,
the default).

Design — server-side error feedback per worker, by construction: for every worker the server
keeps ``known[w]``, its copy of the shard as that worker holds it. A reply encodes
δ = shard − known[w] and both sides add the same decoded δ̂ (the server decodes the very bytes it
sends, so ``known[w]`` and the worker's copy stay equal bit for bit). What δ̂ left out is still in
shard − known[w] and goes with the next reply: the residual is that difference, one per worker,
never dropped. The first reply to a worker, and the first after every checkpoint, is the dense
float32 shard (code 0 in the reply header): it sets ``known[w]``, so a worker starts (or resumes)
from the server's exact parameters, and an interrupted run that resumes from a checkpoint replays
the uninterrupted one (the per-(server, worker) codec counters restart there as well, on both
sides).

Which codecs: every codec the pushes take, except ``dgc`` (its momentum correction and masking
are a method for gradients, not for parameter deltas; with ``dgc`` pulls stay dense float32).
Bytes are counted at the sends (op ``ps_pull``), as for every message.
"""

from __future__ import annotations

from typing import Any

import torch

from polytrain.comm.codecs import build
from polytrain.comm.codecs.engine import Engine


def pulls_compressible(opts: Any) -> bool:
    """Whether this job's pulls go through its codec."""
    return bool(opts.compressing and getattr(opts, "compress_pulls", True)
                and "dgc" not in opts.compression.split("+"))


def _engine(opts: Any, world: int, rank: int, seed: int) -> Engine:
    gen = torch.Generator().manual_seed(seed * 7919 + 104_729 + rank)  # stochastic rounding, rank-local
    return Engine(build(opts, world, gen), error_feedback=False, entropy=opts.entropy, seed=seed)


def _name(server: int) -> str:
    return f"pull of server {server}'s shard"


class PullEncoder:
    """A server's side: per worker, the copy of what it holds and a codec engine."""

    def __init__(self, opts: Any, world: int, rank: int, seed: int) -> None:
        self.opts, self.world, self.rank, self.seed = opts, world, rank, seed
        self.known: dict[int, torch.Tensor] = {}
        self.engines: dict[int, Engine] = {}
        self.dense = self.payload_bytes = self.fp32_bytes = 0

    def reply(self, worker: int, shard: torch.Tensor) -> tuple[int, torch.Tensor]:
        """(header code, what to send): 0 and the dense shard, or −2 − n and n payload bytes."""
        n = shard.numel()
        self.fp32_bytes += 4 * n
        if worker not in self.known:
            self.known[worker] = shard.clone()
            self.engines[worker] = _engine(self.opts, self.world, self.rank, self.seed)
            self.dense += 1
            self.payload_bytes += 4 * n
            return 0, shard
        e, known = self.engines[worker], self.known[worker]
        buf = e.encode(self.rank, _name(self.rank), shard - known, (n,))
        known.add_(e.decode(self.rank, _name(self.rank), buf, (n,)))
        e.done(self.rank)
        self.payload_bytes += buf.numel()
        return -2 - buf.numel(), buf

    def reset(self) -> None:
        """After a checkpoint: the next reply to every worker is dense, the counters restart."""
        self.known, self.engines = {}, {}

    def stats(self) -> dict[str, Any]:
        label = self.engines[min(self.engines)].codec.label if self.engines else self.opts.compression
        return {"codec": label,
                "dense_replies": self.dense, "payload_bytes": self.payload_bytes,
                "fp32_bytes": self.fp32_bytes}


class PullDecoder:
    """A worker's side: one engine per server, in step with that server's engine for it."""

    def __init__(self, opts: Any, world: int, seed: int) -> None:
        self.opts, self.world, self.seed = opts, world, seed
        self.engines: dict[int, Engine] = {}

    @staticmethod
    def receive_buffer(code: int, n: int) -> torch.Tensor:
        """Where a reply with header ``code`` for a shard of ``n`` entries lands."""
        return torch.empty(n) if code == 0 else torch.empty(-2 - code, dtype=torch.uint8)

    def apply(self, server: int, rank: int, code: int, data: torch.Tensor,
              view: torch.Tensor) -> torch.Tensor:
        """The worker's new copy of server ``server``'s shard (``rank``: that server's rank)."""
        if code == 0:
            self.engines[server] = _engine(self.opts, self.world, rank, self.seed)
            return data
        e = self.engines[server]
        out = view + e.decode(rank, _name(rank), data, (view.numel(),), source=f" from server rank {rank}")
        e.done(rank)
        return out

    def reset(self) -> None:
        self.engines = {}
