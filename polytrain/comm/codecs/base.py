"""The codec protocol: encode a flat float32 gradient into a typed payload, decode it back.

A codec is stateless about the training step except through :class:`Key` (which parameter, how
many times it has been encoded, the job's seed: what ranks agree on without talking) and its own
random generator (rank-local, for stochastic rounding). Error feedback and momentum live outside
the codec (:mod:`.error_feedback`, :mod:`.dgc`), so every codec is a pure pair of functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from polytrain.comm.codecs.payload import Payload, PayloadError, Schema

Shape = tuple[int, ...]
Parts = tuple[Shape, ...]  # the shapes of the tensors a flat vector holds, back to back


@dataclass(frozen=True)
class Key:
    """What every rank knows about one encoding without exchanging it."""

    index: int  # the parameter's position in the model (same on every rank)
    call: int  # how many times this parameter was encoded before (same on every rank)
    seed: int  # the job's seed

    def generator(self) -> torch.Generator:
        """A generator every rank seeds identically for this (parameter, call)."""
        return torch.Generator().manual_seed((self.seed * 1_000_003 + self.index) * 1_000_033 + self.call)


class Codec:
    """Base of every codec. ``biased``: error feedback is on by default. ``sparse``: the payload
    holds a ``values`` field another codec may compress (the left side of ``a+b``); ``values``:
    it compresses any vector (the right side). ``reducible``: payloads of all ranks may be summed
    as they are (all-reduce in the compressed form) instead of all-gathered. ``flat``: several
    parameters may be encoded as one flat vector (one encode per DDP bucket instead of one per
    parameter; see :mod:`polytrain.comm.exchange`): casts and sparsifiers treat entries alone or
    by magnitude over the whole vector; quantisers keep one scale per tensor (or row) of ``parts``
    (the shapes the vector holds), so their encoding of each part is the per-parameter one.

    ``encode``/``decode`` take ``shape`` (one parameter's shape, or ``(N,)`` for a flat vector)
    and optionally ``parts``; without ``parts`` the vector is one tensor of ``shape``."""

    name: ClassVar[str] = ""
    biased: ClassVar[bool] = True
    sparse: ClassVar[bool] = False
    values: ClassVar[bool] = False
    reducible: ClassVar[bool] = False
    flat: ClassVar[bool] = False

    def __init__(self, gen: torch.Generator | None = None) -> None:
        self.gen = gen if gen is not None else torch.Generator().manual_seed(0)

    @property
    def label(self) -> str:
        return self.name

    def schema(self) -> Schema:
        raise NotImplementedError

    def encode(self, x: torch.Tensor, shape: Shape, key: Key, parts: Parts | None = None) -> Payload:
        """``x``: flat float32 (N,) = the gradient to send; ``shape``: its parameter's shape."""
        raise NotImplementedError

    def decode(self, p: Payload, numel: int, shape: Shape, key: Key,
               parts: Parts | None = None) -> torch.Tensor:
        """The flat float32 (numel,) the payload stands for; PayloadError if it cannot be."""
        raise NotImplementedError

    # Codecs with state of their own (dgc's velocity) override these four.
    def pre(self, g: torch.Tensor, key: Key) -> torch.Tensor:
        """What to compress instead of the raw gradient ``g`` (before error feedback)."""
        return g

    def post(self, p: Payload, key: Key) -> None:
        """Called with what was sent."""

    def post_group(self, p: Payload, keys: list[Key], sizes: list[int]) -> None:
        """:meth:`post` for one payload that encoded several parameters back to back (``sizes``
        entries each, in ``keys`` order). Codecs with per-parameter state override it."""
        if len(keys) == 1:
            self.post(p, keys[0])

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def expect(cond: bool, what: str) -> None:
    """Refuse a payload whose fields do not fit the parameter (PayloadError naming the rule)."""
    if not cond:
        raise PayloadError(what)


def count(numel: int, ratio: float) -> int:
    """Entries a sparsifier keeps: ceil(ratio·N), at least 1 (none for an empty tensor)."""
    return min(numel, max(1, int(-(-ratio * numel // 1)))) if numel else 0


def rows_of(shape: Shape, numel: int) -> int:
    """Rows for per-row scales: the first dimension of a matrix, else one row."""
    return shape[0] if len(shape) >= 2 and shape[0] > 0 else 1


def numel_of(shape: Shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class Segments:
    """The scale groups of a quantiser over a flat vector: one per part (per tensor) or one per
    row of each part (per row), back to back. Every reduction here treats each group on its own
    (sequential float64 sums of the group's entries alone), so a part's scales are the same
    whether it is encoded alone or inside a flat vector of several parameters."""

    def __init__(self, shape: Shape, parts: Parts | None, per_row: bool) -> None:
        lengths: list[int] = []
        for p in parts if parts is not None else (shape,):
            n = numel_of(p)
            rows = rows_of(p, n) if per_row else 1
            lengths += [n // rows] * rows
        self.count = len(lengths)
        self.lengths = torch.tensor(lengths, dtype=torch.int64)

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        """float64 (count,): each group's sum."""
        return torch.segment_reduce(x.double(), "sum", lengths=self.lengths, unsafe=True)

    def max(self, x: torch.Tensor) -> torch.Tensor:
        """(count,): each group's largest entry, 0 for an empty group (``x`` ≥ 0)."""
        return torch.segment_reduce(x, "max", lengths=self.lengths, unsafe=True, initial=0.0)

    def expand(self, v: torch.Tensor) -> torch.Tensor:
        """Each group's value repeated over its entries (N,)."""
        return torch.repeat_interleave(v, self.lengths, output_size=int(self.lengths.sum()))
