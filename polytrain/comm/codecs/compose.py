"""Composition ``a+b``: a sparsifier picks the entries, a value codec compresses their values.

``topk+onebit`` sends top-k indices and one bit per kept value (with two scales), the scheme of
Strom 2015 / 1-bit SGD that the issue's source (004 §4.2, ref. [6]) describes: "send only the
non-zero entries, quantise values to 1 bit". The left side must be a sparsifier with a
``values`` field (topk, randomk, dgc), the right side a value codec (fp16, bf16, onebit,
terngrad, qsgd). Only these two-part chains exist, so there is no associativity to claim.
"""

from __future__ import annotations

from typing import Any

import torch

from polytrain.comm.codecs.base import Codec, Key, count
from polytrain.comm.codecs.payload import Payload, Schema


class Compose(Codec):
    sparse = False
    values = False

    def __init__(self, outer: Codec, inner: Codec) -> None:
        super().__init__(outer.gen)
        self.outer, self.inner = outer, inner
        self.biased = outer.biased or inner.biased  # type: ignore[misc]
        self.flat = outer.flat and inner.flat  # type: ignore[misc]

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"{self.outer.name}+{self.inner.name}"

    @property
    def label(self) -> str:
        return f"{self.outer.label}+{self.inner.label}"

    def schema(self) -> Schema:
        own = tuple(f for f in self.outer.schema() if f[0] != "values")
        return own + tuple((f"v.{n}", dt) for n, dt in self.inner.schema())

    def _kept(self, fields: dict[str, torch.Tensor], numel: int, key: Key) -> int:
        if "indices" in fields:
            return int(fields["indices"].numel())
        return count(numel, float(getattr(self.outer, "ratio", 1.0)))

    def encode(self, x: torch.Tensor, shape: tuple[int, ...], key: Key) -> Payload:
        po = self.outer.encode(x, shape, key)
        vals = po["values"]
        pi = self.inner.encode(vals, (vals.numel(),), key)
        own = {n: t for n, t in po.fields.items() if n != "values"}
        return Payload({**own, **{f"v.{n}": t for n, t in pi.fields.items()}})

    def decode(self, p: Payload, numel: int, shape: tuple[int, ...], key: Key) -> torch.Tensor:
        own = {n: t for n, t in p.fields.items() if not n.startswith("v.")}
        inner = Payload({n[2:]: t for n, t in p.fields.items() if n.startswith("v.")})
        n = self._kept(own, numel, key)
        vals = self.inner.decode(inner, n, (n,), key)
        return self.outer.decode(Payload({**own, "values": vals}), numel, shape, key)

    def pre(self, g: torch.Tensor, key: Key) -> torch.Tensor:
        return self.outer.pre(g, key)

    def post(self, p: Payload, key: Key) -> None:
        self.outer.post(p, key)

    def post_group(self, p: Payload, keys: list[Key], sizes: list[int]) -> None:
        self.outer.post_group(p, keys, sizes)

    def state_dict(self) -> dict[str, Any]:
        return self.outer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.outer.load_state_dict(state)
