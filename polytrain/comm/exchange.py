"""Compressed exchange: every rank's tensors encoded, exchanged, decoded and averaged.

:func:`compressed_mean` is what ``allreduce`` (per DDP bucket), ``local-sgd`` (per average) and
any other strategy that averages over ranks call with a :class:`~polytrain.comm.codecs.engine.Engine`:

* **reducible** codecs (fp16, bf16: the values; randomk: the values at indices every rank draws
  alike) are summed in their compressed form — one all-reduce (``builtin`` or ``ring``) of the
  concatenated payloads, then decoded once;
* every other codec (and any codec with ``entropy=zstd``) sends variable-size byte messages:
  each rank frames its payloads into one message and :func:`all_gather_bytes` passes
  every message around the ring (W−1 point-to-point hops, each counted at its send), then every
  rank decodes all W messages and sums.

A ``flat`` codec (casts, sparsifiers: :attr:`~polytrain.comm.codecs.base.Codec.flat`) encodes
all the tensors of one call (a DDP bucket) as one flat vector: one encode, one pack and one
decode per rank instead of one per parameter, each parameter keeping its own residual and state.
Results equal the per-parameter ones for elementwise codecs (fp16, bf16, threshold), for the
quantisers (onebit, terngrad, qsgd: one scale per parameter or row, as alone) and for
``topk``/``dgc`` at ``ratio=1`` or with ``select=tensor`` (each parameter's own largest entries);
with ``select=bucket`` (the default) ``topk``/``dgc`` keep the largest entries of the whole bucket
(not ratio of each parameter), ``randomk`` draws over the bucket, and a chain ``topk+onebit``
keeps one pair of onebit means per parameter over that parameter's kept entries.

A message that does not decode fails this rank with the parameter's name and the source rank,
before anything is applied. Simplified against DDP's own hooks: blocking (no overlap with the
rest of backward).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from polytrain.comm.accounted import Comm
from polytrain.comm.codecs.base import Parts
from polytrain.comm.codecs.engine import DecodeError, Engine, parts_of
from polytrain.comm.codecs.payload import Payload, PayloadError, frame, unframe
from polytrain.comm.ring import _peer, record_ring, ring_all_reduce
from polytrain.metrics.recorder import Recorder


@dataclass(frozen=True)
class Item:
    """One tensor to average: its model-wide index and name, and its value on this rank."""

    index: int
    name: str
    tensor: torch.Tensor

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.tensor.shape)


def all_gather_bytes(comm: Comm, msg: torch.Tensor, op: str) -> list[torch.Tensor]:
    """Every rank's uint8 message (sizes may differ), in rank order, over the ring."""
    world, rank = comm.world, comm.rank
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    comm.all_gather(sizes, torch.tensor([msg.numel()], dtype=torch.int64), op=f"{op}_sizes")
    out: list[torch.Tensor | None] = [None] * world
    out[rank] = msg
    nxt, prv = _peer(comm, (rank + 1) % world), _peer(comm, (rank - 1) % world)
    for s in range(world - 1):
        send_from, recv_from = (rank - s) % world, (rank - s - 1) % world
        buf = torch.empty(int(sizes[recv_from].item()), dtype=torch.uint8)
        recv = comm.irecv(buf, prv, op=op)
        send = comm.isend(out[send_from], nxt, op=op)  # type: ignore[arg-type]
        recv.wait()
        send.wait()
        out[recv_from] = buf
    return [m for m in out if m is not None]


def _reduce(comm: Comm, flat: torch.Tensor, collective: str, op: str, rec: Recorder) -> None:
    if collective == "ring" and comm.world > 1:
        record_ring(rec, ring_all_reduce(flat, comm, op=op))
    else:
        comm.all_reduce(flat, op=op)


@dataclass(frozen=True)
class Unit:
    """What is encoded as one payload: one item (its shape kept), or several items back to back
    as one flat vector when the codec is ``flat``."""

    items: list[Item]

    @property
    def first(self) -> Item:
        return self.items[0]

    @property
    def name(self) -> str:
        return self.first.name if len(self.items) == 1 else f"{self.first.name}..{self.items[-1].name}"

    @property
    def numel(self) -> int:
        return sum(it.tensor.numel() for it in self.items)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.first.shape if len(self.items) == 1 else (self.numel,)

    @property
    def parts(self) -> Parts | None:
        return parts_of([it.tensor for it in self.items])

    def encode_payload(self, engine: Engine) -> Payload:
        return engine.encode_group_payload([(it.index, it.name, it.tensor) for it in self.items], self.shape)

    def encode(self, engine: Engine) -> torch.Tensor:
        return engine.encode_group([(it.index, it.name, it.tensor) for it in self.items], self.shape)

    def split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        return list(flat.split([it.tensor.numel() for it in self.items]))


def units(engine: Engine, items: list[Item]) -> list[Unit]:
    """One unit for all ``items`` when the codec is ``flat`` (one encode and one decode per rank
    instead of one per parameter), else one unit per item. The flat vector holds the items in
    model order, whatever order they come in (DDP reorders a bucket's parameters after its first
    step; a resumed run starts with the first order), so the same tensors give the same payload."""
    if engine.codec.flat and len(items) > 1:
        return [Unit(sorted(items, key=lambda it: it.index))]
    return [Unit([it]) for it in items]


def _reducible_mean(engine: Engine, comm: Comm, items: list[Item], groups: list[Unit], collective: str,
                    op: str, rec: Recorder) -> list[torch.Tensor]:
    with rec.span("encode", "codec"):
        payloads = [u.encode_payload(engine) for u in groups]
        engine.encoded_bytes += sum(p.nbytes for p in payloads)
    flat = payloads[0]["values"] if len(payloads) == 1 else torch.cat([p["values"] for p in payloads])
    with rec.span(op, "comm"):
        _reduce(comm, flat, collective, op, rec)
    out: list[tuple[Item, torch.Tensor]] = []
    pos = 0
    with rec.span("decode", "codec"):
        for u, p in zip(groups, payloads, strict=True):
            n = p["values"].numel()
            mean = engine.decode_payload(u.first.index, u.name, Payload({"values": flat[pos : pos + n]}),
                                         u.shape, parts=u.parts).div_(comm.world)
            out.extend(zip(u.items, u.split(mean), strict=True))
            pos += n
    for it in items:
        engine.done(it.index)
    return _in_order(items, out)


def _in_order(items: list[Item], means: list[tuple[Item, torch.Tensor]]) -> list[torch.Tensor]:
    by_index = {it.index: m for it, m in means}
    return [by_index[it.index] for it in items]


def compressed_mean(engine: Engine, comm: Comm, items: list[Item], *, collective: str = "builtin",
                    op: str = "codec", rec: Recorder) -> list[torch.Tensor]:
    """The mean over ranks of each item (flat float32), through ``engine``'s codec."""
    groups = units(engine, items)
    if engine.codec.reducible and not engine.zstd:
        return _reducible_mean(engine, comm, items, groups, collective, op, rec)
    with rec.span("encode", "codec"):
        msg = frame([u.encode(engine) for u in groups])
    with rec.span(op, "comm"):
        messages = all_gather_bytes(comm, msg, op) if comm.world > 1 else [msg]
    sums = [torch.zeros(u.numel) for u in groups]
    with rec.span("decode", "codec"):
        for src, m in enumerate(messages):
            try:
                parts = unframe(m, len(groups))
            except PayloadError as err:
                raise DecodeError(f"the message from rank {src} for parameters "
                                  f"{items[0].name}..{items[-1].name} does not decode: {err}; "
                                  "nothing was applied") from None
            for u, part, acc in zip(groups, parts, sums, strict=True):
                acc.add_(engine.decode(u.first.index, u.name, part, u.shape, source=f" from rank {src}",
                                       parts=u.parts))
    for it in items:
        engine.done(it.index)
    return _in_order(items, [(it, m) for u, s in zip(groups, sums, strict=True)
                             for it, m in zip(u.items, u.split(s.div_(comm.world)), strict=True)])


def codec_report(engine: Engine, comm: Comm, steps: int, op: str = "codec") -> dict[str, object]:
    """Per-step figures for summary.json: bytes this rank put on the wire for the codec's
    exchange (counted at each send, sizes included), payload vs float32 size, codec time."""
    wire = sum(n for o, n in comm.by_op().items() if o == op or o == f"{op}_sizes")
    per = max(steps, 1)
    return {**engine.report(), "wire_bytes_per_step": round(wire / per, 1),
            "codec_s_per_step": round((engine.encode_s + engine.decode_s) / per, 6)}
