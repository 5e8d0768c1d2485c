"""Two-stage 1-bit compressed mean with error feedback on both sides (1-bit Adam's exchange).

Tang, Gan, Awan, Rajbhandari, Li, Lian, Liu, Zhang & He, "1-bit Adam: Communication Efficient
Large-Scale Training with Adam's Convergence Speed", ICML 2021, Algorithm 1 (the compressed
all-reduce its authors run on top of MPI/NCCL). A flat vector x (N,) on each of W ranks is cut
into W chunks (chunk j: entries ``bounds[j]:bounds[j+1]``); rank j is the "server" of chunk j:

1. **worker stage** — each rank adds its worker residual to x, compresses every chunk to 1 bit
   (:class:`~polytrain.comm.codecs.quant.OneBit`: a sign per entry, the mean of the positive and
   of the negative entries per parameter piece), keeps what was lost as its new residual, and
   sends chunk j to rank j (all-to-all, W−1 messages);
2. **server stage** — rank j decodes the W payloads of its chunk, averages them, adds its server
   residual, compresses the average to 1 bit again (new server residual) and passes it to every
   rank (ring all-gather of the W server payloads);
3. every rank decodes the W server payloads: the same vector on every rank.

Per rank and step that is about 2·(W−1)/W · N/8 bytes (sign bits) plus 8 bytes per parameter
piece, against 2·(W−1)/W · 4N for a float32 ring all-reduce: at most 32× less (before zstd).
Both stages go through :class:`~polytrain.comm.codecs.engine.Engine`, so the error-feedback
identity decode(encode(x + r_old)) + r_new == x + r_old holds bit for bit as for every codec
(float64 residuals), ``entropy=zstd`` packs the payloads, and every message is counted by the
accounted comm at its send (op ``onebit``; the size exchange as ``onebit_sizes``).

Scales per parameter piece (not one per chunk as in the paper's implementation): a chunk spans
layers whose momenta differ by orders of magnitude, and 8 bytes per piece are negligible.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from polytrain.comm.accounted import Comm
from polytrain.comm.codecs.engine import Engine
from polytrain.comm.codecs.quant import OneBit
from polytrain.comm.exchange import all_gather_bytes
from polytrain.comm.ring import _peer
from polytrain.metrics.recorder import Recorder

OP = "onebit"


@dataclass(frozen=True)
class Piece:
    """The part of one parameter that falls into one chunk (offsets within the chunk)."""

    index: int  # the parameter's position in the model
    label: str  # its name and entry range: each piece keeps its own residual
    lo: int
    hi: int


def chunk_pieces(sizes: list[tuple[str, int]], bounds: list[int]) -> list[list[Piece]]:
    """For each chunk ``bounds[j]:bounds[j+1]`` of the flat vector of ``sizes`` (name, numel,
    in model order), the parameter pieces it holds."""
    out: list[list[Piece]] = [[] for _ in range(len(bounds) - 1)]
    start = 0
    for index, (name, n) in enumerate(sizes):
        for j in range(len(bounds) - 1):
            lo, hi = max(start, bounds[j]), min(start + n, bounds[j + 1])
            if hi > lo:
                out[j].append(Piece(index, f"{name}[{lo - start}:{hi - start}]", lo - bounds[j],
                                    hi - bounds[j]))
        start += n
    return out


class TwoStage:
    """One rank's side of the two-stage exchange of a flat vector of ``sizes`` entries."""

    def __init__(self, sizes: list[tuple[str, int]], world: int, rank: int, *, entropy: str = "none",
                 seed: int = 0) -> None:
        total = sum(n for _, n in sizes)
        if total < world:
            raise ValueError(f"onebit-adam cuts the {total} parameters into {world} chunks, one per "
                             "rank: it needs at least one entry per rank")
        self.world, self.rank, self.total = world, rank, total
        self.bounds = [total * j // world for j in range(world + 1)]
        self.pieces = chunk_pieces(sizes, self.bounds)
        self.worker = Engine(OneBit("tensor"), error_feedback=True, entropy=entropy, seed=seed)
        self.server = Engine(OneBit("tensor"), error_feedback=True, entropy=entropy, seed=seed)

    def numel(self, j: int) -> int:
        return self.bounds[j + 1] - self.bounds[j]

    def _members(self, j: int, x: torch.Tensor) -> list[tuple[int, str, torch.Tensor]]:
        """Chunk ``j``'s pieces of ``x`` (chunk-local, float32 (numel(j),))."""
        return [(p.index, p.label, x[p.lo : p.hi]) for p in self.pieces[j]]

    def _parts(self, j: int) -> tuple[tuple[int, ...], ...] | None:
        pieces = self.pieces[j]
        return tuple((p.hi - p.lo,) for p in pieces) if len(pieces) > 1 else None

    def _decode(self, engine: Engine, j: int, buf: torch.Tensor, source: str) -> torch.Tensor:
        first = self.pieces[j][0]
        return engine.decode(first.index, first.label, buf, (self.numel(j),), source=source,
                             parts=self._parts(j))

    # ---- the three stages, each local (the exchange between them is :meth:`mean`'s) ----------
    def encode_chunks(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Worker stage: x (N,) plus the worker residuals, 1 bit per entry; one packed payload
        per chunk (chunk j is for rank j)."""
        return [self.worker.encode_group(self._members(j, x[self.bounds[j] : self.bounds[j + 1]]),
                                         (self.numel(j),)) for j in range(self.world)]

    def average(self, received: list[torch.Tensor]) -> torch.Tensor:
        """The mean of every rank's payload of this rank's chunk (``received`` in rank order)."""
        j = self.rank
        acc = torch.zeros(self.numel(j))
        for src, buf in enumerate(received):
            acc.add_(self._decode(self.worker, j, buf, f" from rank {src} (worker stage)"))
        return acc.div_(self.world)

    def serve(self, received: list[torch.Tensor]) -> torch.Tensor:
        """Server stage: :meth:`average` plus the server residual, compressed again (packed)."""
        return self.server.encode_group(self._members(self.rank, self.average(received)),
                                        (self.numel(self.rank),))

    def assemble(self, served: list[torch.Tensor]) -> torch.Tensor:
        """The mean (N,) every rank agrees on: each server's payload decoded, in chunk order."""
        return torch.cat([self._decode(self.server, j, buf, f" from rank {j} (server stage)")
                          for j, buf in enumerate(served)])

    def mean(self, comm: Comm, x: torch.Tensor, rec: Recorder) -> torch.Tensor:
        """The compressed mean over ranks of each rank's flat float32 ``x`` (N,)."""
        with rec.span("encode", "codec"):
            chunks = self.encode_chunks(x)
        with rec.span(f"{OP} all-to-all", "comm"):
            received = all_to_all_bytes(comm, chunks, OP)
        with rec.span("serve", "codec"):
            mine = self.serve(received)
        with rec.span(f"{OP} all-gather", "comm"):
            served = all_gather_bytes(comm, mine, OP) if comm.world > 1 else [mine]
        with rec.span("decode", "codec"):
            return self.assemble(served)

    # ---- bookkeeping ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"worker": self.worker.state_dict(), "server": self.server.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.worker.load_state_dict(state["worker"])
        self.server.load_state_dict(state["server"])

    def report(self) -> dict[str, Any]:
        w, s = self.worker.report(), self.server.report()
        payload, fp32 = w["payload_bytes"] + s["payload_bytes"], w["fp32_bytes"] + s["fp32_bytes"]
        return {"payload_bytes": payload, "fp32_bytes": fp32,
                "ratio_vs_fp32": round(fp32 / payload, 3) if payload else None,
                "encode_s": round(w["encode_s"] + s["encode_s"], 6),
                "decode_s": round(w["decode_s"] + s["decode_s"], 6), "entropy": w["entropy"]}


def all_to_all_bytes(comm: Comm, msgs: list[torch.Tensor], op: str) -> list[torch.Tensor]:
    """Send ``msgs[j]`` (uint8, any size) to rank j; return what each rank sent to this one, in
    rank order (this rank's own message kept in place). Sizes first (one all-gather of W int64
    per rank, op ``{op}_sizes``), then W−1 rounds of shifted point-to-point pairs."""
    world, rank = comm.world, comm.rank
    if world == 1:
        return [msgs[0]]
    sizes = [torch.zeros(world, dtype=torch.int64) for _ in range(world)]
    comm.all_gather(sizes, torch.tensor([m.numel() for m in msgs], dtype=torch.int64), op=f"{op}_sizes")
    out: list[torch.Tensor] = [msgs[rank]] * world
    for s in range(1, world):
        dst, src = (rank + s) % world, (rank - s) % world
        buf = torch.empty(int(sizes[src][rank]), dtype=torch.uint8)
        recv = comm.irecv(buf, _peer(comm, src), op=op)
        send = comm.isend(msgs[dst], _peer(comm, dst), op=op)
        recv.wait()
        send.wait()
        out[src] = buf
    return out
