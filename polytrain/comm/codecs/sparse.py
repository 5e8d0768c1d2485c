"""Sparsifiers: send a few entries, error feedback keeps the rest for later.

* ``topk`` (``ratio=``): the ceil(ratio·N) entries of largest magnitude, as sorted int32 indices +
  float32 values (ties broken by ``torch.topk``, deterministic on CPU). With error feedback this
  is "sparsified SGD with memory" (Stich, Cordonnier & Jaggi, NeurIPS 2018; Aji & Heafield 2017).
  Over a flat vector of several parameters (a DDP bucket) ``select=bucket`` keeps the largest
  entries of the whole vector, ``select=tensor`` the largest ceil(ratio·N) of each parameter (the
  per-layer selection of DGC, Lin et al. 2018): the same entries as encoding each one alone.
* ``randomk`` (``ratio=``): ceil(ratio·N) entries chosen uniformly at random by a generator every
  rank seeds with (seed, parameter, call), so all ranks pick the *same* indices: only the values
  travel (no indices), and ranks can all-reduce them like a dense k-vector. Values are sent
  unscaled (biased; error feedback on by default), as in Stich et al. 2018.
* ``threshold`` (``tau=``): Strom, "Scalable distributed DNN training using commodity GPU cloud
  computing", Interspeech 2015 — every entry with |x| ≥ τ is sent as its index and one sign bit
  and stands for ±τ on the receiver; the residual keeps x ∓ τ. Simplified: a fixed τ (Strom tunes
  it per model), no per-layer τ.
"""

from __future__ import annotations

import torch

from polytrain.comm.codecs.base import Codec, Key, Parts, Shape, count, expect, numel_of
from polytrain.comm.codecs.payload import Payload, Schema, pack_bits, unpack_bits


def check_indices(idx: torch.Tensor, numel: int) -> None:
    expect(bool(idx.numel() == 0 or (int(idx.min()) >= 0 and int(idx.max()) < numel)),
           f"indices outside [0, {numel})")


def scatter(idx: torch.Tensor, values: torch.Tensor, numel: int) -> torch.Tensor:
    expect(idx.numel() == values.numel(), f"{idx.numel()} indices but {values.numel()} values")
    check_indices(idx, numel)
    out = torch.zeros(numel, dtype=torch.float32)
    out[idx.long()] = values.to(torch.float32)
    return out


class _Ratio(Codec):
    """A sparsifier that keeps a fraction ``ratio`` of the entries."""

    sparse = True
    flat = True

    def __init__(self, ratio: float, gen: torch.Generator | None = None, per_tensor: bool = False) -> None:
        super().__init__(gen)
        self.ratio, self.per_tensor = ratio, per_tensor

    @property
    def label(self) -> str:
        return f"{self.name}(ratio={self.ratio:g})"

    def chosen(self, fields: dict[str, torch.Tensor], numel: int, key: Key) -> torch.Tensor:
        """The sorted indices of the entries a payload's ``values`` stand for."""
        raise NotImplementedError


class TopK(_Ratio):
    name = "topk"

    def schema(self) -> Schema:
        return (("indices", torch.int32), ("values", torch.float32))

    def keep(self, x: torch.Tensor, key: Key) -> int:
        return count(x.numel(), self.ratio)

    def chosen(self, fields: dict[str, torch.Tensor], numel: int, key: Key) -> torch.Tensor:
        idx = fields["indices"]
        check_indices(idx, numel)
        expect(bool((idx[1:] > idx[:-1]).all()), "indices not in increasing order")
        return idx

    def top(self, x: torch.Tensor, key: Key) -> torch.Tensor:
        """The sorted indices of ``x``'s largest entries (``keep`` of them)."""
        k = self.keep(x, key)
        return torch.topk(x.abs(), k, sorted=False).indices.sort().values if k else x.new_zeros(0).long()

    def select(self, x: torch.Tensor, key: Key, parts: Parts | None) -> torch.Tensor:
        """The sorted indices to send: over the whole vector, or each part's own (``per_tensor``)."""
        if not self.per_tensor or parts is None or len(parts) < 2:
            return self.top(x, key)
        chosen, at = [], 0
        for p in parts:
            n = numel_of(p)
            chosen.append(self.top(x[at : at + n], key) + at)
            at += n
        return torch.cat(chosen)

    def encode(self, x: torch.Tensor, shape: Shape, key: Key, parts: Parts | None = None) -> Payload:
        idx = self.select(x, key, parts)
        return Payload({"indices": idx.to(torch.int32), "values": x[idx]})

    def decode(self, p: Payload, numel: int, shape: Shape, key: Key,
               parts: Parts | None = None) -> torch.Tensor:
        return scatter(p["indices"], p["values"], numel)


class RandomK(_Ratio):
    name = "randomk"
    reducible = True  # same indices on every rank: the values vectors sum

    def schema(self) -> Schema:
        return (("values", torch.float32),)

    def indices(self, numel: int, key: Key) -> torch.Tensor:
        k = count(numel, self.ratio)
        return torch.randperm(numel, generator=key.generator())[:k].sort().values

    def chosen(self, fields: dict[str, torch.Tensor], numel: int, key: Key) -> torch.Tensor:
        return self.indices(numel, key)

    def encode(self, x: torch.Tensor, shape: Shape, key: Key, parts: Parts | None = None) -> Payload:
        return Payload({"values": x[self.indices(x.numel(), key)]})

    def decode(self, p: Payload, numel: int, shape: Shape, key: Key,
               parts: Parts | None = None) -> torch.Tensor:
        return scatter(self.indices(numel, key), p["values"], numel)


class Threshold(Codec):
    flat = True
    name = "threshold"

    def __init__(self, tau: float, gen: torch.Generator | None = None) -> None:
        super().__init__(gen)
        self.tau = tau

    @property
    def label(self) -> str:
        return f"threshold(tau={self.tau:g})"

    def schema(self) -> Schema:
        return (("indices", torch.int32), ("signs", torch.uint8))

    def encode(self, x: torch.Tensor, shape: Shape, key: Key, parts: Parts | None = None) -> Payload:
        idx = (x.abs() >= self.tau).nonzero().reshape(-1) if self.tau > 0 else x.new_zeros(0).long()
        return Payload({"indices": idx.to(torch.int32), "signs": pack_bits(x[idx] < 0, 1)})

    def decode(self, p: Payload, numel: int, shape: Shape, key: Key,
               parts: Parts | None = None) -> torch.Tensor:
        idx = p["indices"]
        neg = unpack_bits(p["signs"], 1, idx.numel())
        expect(p["signs"].numel() == -(-idx.numel() // 8), "sign bits do not match the indices")
        return scatter(idx, self.tau * (1 - 2 * neg).to(torch.float32), numel)
