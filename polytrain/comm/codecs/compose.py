"""Composition ``a+b``: a sparsifier picks the entries, a value codec compresses their values.

``topk+onebit`` sends top-k indices and one bit per kept value (with two scales), the scheme of
Strom 2015 / 1-bit SGD that the issue's source (004 §4.2, ref. [6]) describes: "send only the
non-zero entries, quantise values to 1 bit". The left side must be a sparsifier with a
``values`` field (topk, randomk, dgc), the right side a value codec (fp16, bf16, onebit,
terngrad, qsgd). Only these two-part chains exist, so there is no associativity to claim.

Flat encoding (several parameters, ``parts``): the sparsifier picks entries over the whole vector
and the value codec gets, as its parts, the number of kept entries of each parameter (counted
from the sorted indices on both sides), so ``topk+onebit`` keeps one pair of means per parameter.
"""

from __future__ import annotations

from typing import Any

import torch

from polytrain.comm.codecs.base import Codec, Key, Parts, Shape, count, numel_of
from polytrain.comm.codecs.payload import Payload, Schema
from polytrain.comm.codecs.sparse import _Ratio


def kept_parts(idx: torch.Tensor, parts: Parts) -> Parts:
    """How many of the sorted indices ``idx`` fall in each part, as 1-D shapes."""
    ends = torch.tensor([numel_of(p) for p in parts], dtype=torch.int64).cumsum(0)
    upto = torch.searchsorted(idx.to(torch.int64), ends)
    return tuple((int(n),) for n in torch.diff(upto, prepend=upto.new_zeros(1)).tolist())


class Compose(Codec):
    sparse = False
    values = False

    def __init__(self, outer: _Ratio, inner: Codec) -> None:
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

    def _inner_parts(self, fields: dict[str, torch.Tensor], numel: int, key: Key,
                     parts: Parts | None) -> tuple[int, Parts | None]:
        """(kept entries, the value codec's parts: kept entries per parameter, or None)."""
        if parts is None or len(parts) == 1:
            n = fields["indices"].numel() if "indices" in fields else count(numel, self.outer.ratio)
            return n, None
        idx = self.outer.chosen(fields, numel, key)
        return idx.numel(), kept_parts(idx, parts)

    def encode(self, x: torch.Tensor, shape: Shape, key: Key, parts: Parts | None = None) -> Payload:
        po = self.outer.encode(x, shape, key, parts)
        n, inner_parts = self._inner_parts(po.fields, x.numel(), key, parts)
        pi = self.inner.encode(po["values"], (n,), key, inner_parts)
        own = {name: t for name, t in po.fields.items() if name != "values"}
        return Payload({**own, **{f"v.{name}": t for name, t in pi.fields.items()}})

    def decode(self, p: Payload, numel: int, shape: Shape, key: Key,
               parts: Parts | None = None) -> torch.Tensor:
        own = {name: t for name, t in p.fields.items() if not name.startswith("v.")}
        inner = Payload({name[2:]: t for name, t in p.fields.items() if name.startswith("v.")})
        n, inner_parts = self._inner_parts(own, numel, key, parts)
        vals = self.inner.decode(inner, n, (n,), key, inner_parts)
        return self.outer.decode(Payload({**own, "values": vals}), numel, shape, key, parts)

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
