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
"""

from __future__ import annotations

import torch

from polytrain.comm.codecs.base import Codec, Key, expect, rows_of
from polytrain.comm.codecs.payload import Payload, Schema, bits_width, pack_bits, unpack_bits


class OneBit(Codec):
    name = "onebit"
    values = True

    def __init__(self, scale: str = "tensor", gen: torch.Generator | None = None) -> None:
        super().__init__(gen)
        self.per_row = scale == "row"

    @property
    def label(self) -> str:
        return f"onebit(scale={'row' if self.per_row else 'tensor'})"

    def schema(self) -> Schema:
        return (("signs", torch.uint8), ("scales", torch.float32))

    def _rows(self, shape: tuple[int, ...], numel: int) -> int:
        return rows_of(shape, numel) if self.per_row else 1

    def encode(self, x: torch.Tensor, shape: tuple[int, ...], key: Key) -> Payload:
        rows = self._rows(shape, x.numel())
        m = x.reshape(rows, -1)
        neg = m < 0
        pos_n, neg_n = (~neg).sum(1).clamp(min=1), neg.sum(1).clamp(min=1)
        pos_mean = torch.where(neg, 0.0, m).sum(1) / pos_n
        neg_mean = torch.where(neg, m, 0.0).sum(1) / neg_n
        return Payload({"signs": pack_bits(neg.reshape(-1), 1),
                        "scales": torch.stack([pos_mean, neg_mean], 1).reshape(-1)})

    def decode(self, p: Payload, numel: int, shape: tuple[int, ...], key: Key) -> torch.Tensor:
        rows = self._rows(shape, numel)
        scales = p["scales"]
        expect(scales.numel() == 2 * rows, f"{scales.numel()} scales for {rows} rows (2 a row)")
        expect(p["signs"].numel() == -(-numel // 8), f"{p['signs'].numel()} sign bytes for {numel} entries")
        neg = unpack_bits(p["signs"], 1, numel).reshape(rows, -1).bool()
        s = scales.reshape(rows, 2)
        return torch.where(neg, s[:, 1:], s[:, :1]).reshape(-1)


class TernGrad(Codec):
    name = "terngrad"
    biased = False
    values = True

    def schema(self) -> Schema:
        return (("codes", torch.uint8), ("scale", torch.float32))

    def encode(self, x: torch.Tensor, shape: tuple[int, ...], key: Key) -> Payload:
        s = x.abs().max() if x.numel() else x.new_zeros(())
        prob = x.abs() / s if float(s) > 0 else torch.zeros_like(x)
        b = torch.rand(x.shape, generator=self.gen) < prob
        codes = torch.where(b, torch.where(x < 0, 0, 2), 1)  # 0: -s, 1: 0, 2: +s
        return Payload({"codes": pack_bits(codes, 2), "scale": s.reshape(1).to(torch.float32)})

    def decode(self, p: Payload, numel: int, shape: tuple[int, ...], key: Key) -> torch.Tensor:
        expect(p["scale"].numel() == 1, f"{p['scale'].numel()} scales, expected 1")
        expect(p["codes"].numel() == -(-numel // 4), f"{p['codes'].numel()} code bytes for {numel} entries")
        codes = unpack_bits(p["codes"], 2, numel)
        expect(bool((codes <= 2).all()), "ternary code 3 is not a value")
        return (codes - 1).to(torch.float32) * p["scale"]


class Qsgd(Codec):
    name = "qsgd"
    biased = False
    values = True

    def __init__(self, levels: int, gen: torch.Generator | None = None) -> None:
        super().__init__(gen)
        self.levels = levels
        self.width = bits_width(levels)

    @property
    def label(self) -> str:
        return f"qsgd(levels={self.levels})"

    def schema(self) -> Schema:
        return (("levels", torch.uint8), ("signs", torch.uint8), ("norm", torch.float32))

    def encode(self, x: torch.Tensor, shape: tuple[int, ...], key: Key) -> Payload:
        norm = x.norm() if x.numel() else x.new_zeros(())
        scaled = x.abs() / norm * self.levels if float(norm) > 0 else torch.zeros_like(x)
        lv = (scaled + torch.rand(x.shape, generator=self.gen)).floor().clamp(max=self.levels)
        return Payload({"levels": pack_bits(lv.to(torch.uint8), self.width),
                        "signs": pack_bits(x < 0, 1), "norm": norm.reshape(1).to(torch.float32)})

    def decode(self, p: Payload, numel: int, shape: tuple[int, ...], key: Key) -> torch.Tensor:
        per = 8 // self.width
        expect(p["norm"].numel() == 1, f"{p['norm'].numel()} norms, expected 1")
        expect(p["levels"].numel() == -(-numel // per),
               f"{p['levels'].numel()} level bytes for {numel} entries")
        expect(p["signs"].numel() == -(-numel // 8), f"{p['signs'].numel()} sign bytes for {numel} entries")
        lv = unpack_bits(p["levels"], self.width, numel).to(torch.float32)
        expect(bool((lv <= self.levels).all()), f"a level above {self.levels}")
        sign = 1 - 2 * unpack_bits(p["signs"], 1, numel).to(torch.float32)
        return p["norm"] * sign * lv / self.levels
