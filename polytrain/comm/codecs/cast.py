"""Half-precision casts: ``fp16`` and ``bf16``.

Each value is rounded to 16 bits (round to nearest even): 2× fewer bytes than float32. Values
beyond fp16's range (±65504) saturate to the largest finite value instead of becoming inf (the
residual of error feedback, when on, carries the difference). These payloads are *reducible*:
ranks all-reduce them in 16 bits, as PyTorch's ``fp16_compress_hook`` / ``bf16_compress_hook``
do (sums in half precision; error feedback is off by default: the rounding is unbiased enough).
"""

from __future__ import annotations

from typing import ClassVar

import torch

from polytrain.comm.codecs.base import Codec, Key, Parts, Shape, expect
from polytrain.comm.codecs.payload import Payload, Schema


class _Cast(Codec):
    dtype: ClassVar[torch.dtype] = torch.float16
    biased = False
    values = True
    reducible = True
    flat = True

    def schema(self) -> Schema:
        return (("values", self.dtype),)

    def encode(self, x: torch.Tensor, shape: Shape, key: Key, parts: Parts | None = None) -> Payload:
        big = torch.finfo(self.dtype).max
        return Payload({"values": x.clamp(-big, big).to(self.dtype)})

    def decode(self, p: Payload, numel: int, shape: Shape, key: Key,
               parts: Parts | None = None) -> torch.Tensor:
        v = p["values"]
        expect(v.numel() == numel, f"{v.numel()} {self.name} values for a tensor of {numel}")
        return v.to(torch.float32)


class Fp16(_Cast):
    name = "fp16"
    dtype = torch.float16


class Bf16(_Cast):
    name = "bf16"
    dtype = torch.bfloat16
