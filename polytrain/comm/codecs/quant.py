"""Quantisers: every entry travels, in a few bits.

* ``onebit`` (``scale=tensor|row``): Seide, Fu, Droppo, Li & Yu, "1-Bit Stochastic Gradient
  Descent and its Application to Data-Parallel Distributed Training of Speech DNNs",
  Interspeech 2014. One sign bit per entry; the receiver reconstructs a positive entry as the
  mean of the positive entries and a negative one as the mean of the negative entries — per row
  of a matrix (``scale=row``, Seide's column-wise means in our row-major layout) or per tensor.
  Always with error feedback (the paper's point: the quantisation error is carried over).
* ``terngrad``: Wen et al., "TernGrad: Ternary Gradients to Reduce Communication in Distributed
  Deep Learning", NeurIPS 2017. s = max|x|; entry i becomes s·sign(x_i)·b_i with
  b_i ~ Bernoulli(|x_i|/s): unbiased, 2 bits per entry. Simplified: no gradient clipping at
  2.5σ and no scalar sharing across workers.
* ``qsgd`` (``levels=s``): Alistarh, Grubic, Li, Tomioka & Vojnovic, "QSGD: Communication-Efficient
  SGD via Gradient Quantization and Encoding", NeurIPS 2017. With ‖x‖₂ = n, entry i becomes
  n·sign(x_i)·l_i/s, l_i = ⌊s|x_i|/n + u⌋ with u ~ U(0,1): unbiased. Simplified: one bucket per
  tensor (the paper uses buckets of 512) and fixed-width level codes (1, 2, 4 or 8 bits) plus a
  sign bit instead of Elias coding (``entropy=zstd`` recovers part of the difference).
Random draws come from the codec's rank-local generator (seeded by the job's seed and rank).

Flat encoding: a DDP bucket's parameters are quantised as one vector with one scale (onebit: two
means; terngrad: the max; qsgd: the norm) per parameter, or per row of each matrix with
``scale=row`` — the same scales as encoding each parameter alone (:class:`~.base.Segments`:
group sums are sequential float64 sums over the group alone), one sign/code bit-field for the
bucket instead of one per parameter.
"""

from __future__ import annotations

import torch

from polytrain.comm.codecs.base import Codec, Key, Parts, Segments, Shape, expect
from polytrain.comm.codecs.payload import Payload, Schema, bits_width, pack_bits, unpack_bits


class _Quantiser(Codec):
    """A value codec with one scale per group of entries (see :class:`~.base.Segments`)."""

    values = True
    flat = True
    per_row = False

    def __init__(self, gen: torch.Generator | None = None) -> None:
        super().__init__(gen)
        self._segments: dict[tuple[Shape, Parts | None], Segments] = {}

    def segments(self, shape: Shape, parts: Parts | None) -> Segments:
        key = (shape, parts)
        seg = self._segments.get(key)
        if seg is None:
            if len(self._segments) > 256:  # a sparsifier's kept counts vary: do not grow for ever
                self._segments.clear()
            seg = self._segments[key] = Segments(shape, parts, self.per_row)
        return seg

    def check(self, seg: Segments, numel: int, field: torch.Tensor, per: int, what: str) -> None:
        expect(int(seg.lengths.sum()) == numel, f"parts of {int(seg.lengths.sum())} entries for {numel}")
        expect(field.numel() == per * seg.count,
               f"{field.numel()} {what} for {seg.count} groups ({per} a group)")


class OneBit(_Quantiser):
    name = "onebit"

    def __init__(self, scale: str = "tensor", gen: torch.Generator | None = None) -> None:
        super().__init__(gen)
        self.per_row = scale == "row"

    @property
    def label(self) -> str:
        return f"onebit(scale={'row' if self.per_row else 'tensor'})"

    def schema(self) -> Schema:
        return (("signs", torch.uint8), ("scales", torch.float32))

    def encode(self, x: torch.Tensor, shape: Shape, key: Key, parts: Parts | None = None) -> Payload:
        seg = self.segments(shape, parts)
        neg = x < 0
        neg_n = seg.sum(neg)
        pos_n = seg.lengths.double() - neg_n
        neg_sum = seg.sum(torch.where(neg, x, 0.0))
        pos_sum = seg.sum(torch.where(neg, 0.0, x))
        pos_mean, neg_mean = pos_sum / pos_n.clamp(min=1), neg_sum / neg_n.clamp(min=1)
        return Payload({"signs": pack_bits(neg, 1),
                        "scales": torch.stack([pos_mean, neg_mean], 1).reshape(-1).float()})

    def decode(self, p: Payload, numel: int, shape: Shape, key: Key,
               parts: Parts | None = None) -> torch.Tensor:
        seg = self.segments(shape, parts)
        self.check(seg, numel, p["scales"], 2, "scales")
        expect(p["signs"].numel() == -(-numel // 8), f"{p['signs'].numel()} sign bytes for {numel} entries")
        neg = unpack_bits(p["signs"], 1, numel).bool()
        s = p["scales"].reshape(-1, 2)
        return torch.where(neg, seg.expand(s[:, 1]), seg.expand(s[:, 0]))


class TernGrad(_Quantiser):
    name = "terngrad"
    biased = False

    def schema(self) -> Schema:
        return (("codes", torch.uint8), ("scale", torch.float32))

    def encode(self, x: torch.Tensor, shape: Shape, key: Key, parts: Parts | None = None) -> Payload:
        seg = self.segments(shape, parts)
        s = seg.max(x.abs())
        se = seg.expand(s)
        prob = torch.where(se > 0, x.abs() / torch.where(se > 0, se, 1.0), 0.0)
        b = torch.rand(x.shape, generator=self.gen) < prob
        codes = torch.where(b, torch.where(x < 0, 0, 2), 1)  # 0: -s, 1: 0, 2: +s
        return Payload({"codes": pack_bits(codes, 2), "scale": s.to(torch.float32)})

    def decode(self, p: Payload, numel: int, shape: Shape, key: Key,
               parts: Parts | None = None) -> torch.Tensor:
        seg = self.segments(shape, parts)
        self.check(seg, numel, p["scale"], 1, "scales")
        expect(p["codes"].numel() == -(-numel // 4), f"{p['codes'].numel()} code bytes for {numel} entries")
        codes = unpack_bits(p["codes"], 2, numel)
        expect(bool((codes <= 2).all()), "ternary code 3 is not a value")
        return (codes - 1).to(torch.float32) * seg.expand(p["scale"])


class Qsgd(_Quantiser):
    name = "qsgd"
    biased = False

    def __init__(self, levels: int, gen: torch.Generator | None = None) -> None:
        super().__init__(gen)
        self.levels = levels
        self.width = bits_width(levels)

    @property
    def label(self) -> str:
        return f"qsgd(levels={self.levels})"

    def schema(self) -> Schema:
        return (("levels", torch.uint8), ("signs", torch.uint8), ("norm", torch.float32))

    def encode(self, x: torch.Tensor, shape: Shape, key: Key, parts: Parts | None = None) -> Payload:
        seg = self.segments(shape, parts)
        norm = seg.sum(x.double().square()).sqrt().float()
        ne = seg.expand(norm)
        scaled = torch.where(ne > 0, x.abs() / torch.where(ne > 0, ne, 1.0) * self.levels, 0.0)
        lv = (scaled + torch.rand(x.shape, generator=self.gen)).floor().clamp(max=self.levels)
        return Payload({"levels": pack_bits(lv.to(torch.uint8), self.width),
                        "signs": pack_bits(x < 0, 1), "norm": norm})

    def decode(self, p: Payload, numel: int, shape: Shape, key: Key,
               parts: Parts | None = None) -> torch.Tensor:
        seg = self.segments(shape, parts)
        per = 8 // self.width
        self.check(seg, numel, p["norm"], 1, "norms")
        expect(p["levels"].numel() == -(-numel // per),
               f"{p['levels'].numel()} level bytes for {numel} entries")
        expect(p["signs"].numel() == -(-numel // 8), f"{p['signs'].numel()} sign bytes for {numel} entries")
        lv = unpack_bits(p["levels"], self.width, numel).to(torch.float32)
        expect(bool((lv <= self.levels).all()), f"a level above {self.levels}")
        sign = 1 - 2 * unpack_bits(p["signs"], 1, numel).to(torch.float32)
        return seg.expand(p["norm"]) * sign * lv / self.levels
