"""The per-rank compression engine: codec + error feedback + entropy coding + accounting.

``encode(index, name, g)`` compresses one parameter's local gradient and returns the packed bytes
to send (what the accounted comm counts); ``decode(index, name, buf, ...)`` turns any rank's bytes
back into a dense gradient, or fails the job naming the parameter. The engine counts its own
encode and decode time and the bytes it produced, for the report, and its ``state_dict`` (the
residuals, the per-parameter call counters that keep ``randomk`` ranks in step, dgc's velocity)
goes into checkpoints through ``LoopSpec.state``.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from polytrain.comm.codecs import build
from polytrain.comm.codecs.base import Codec, Key, Parts, Shape, numel_of
from polytrain.comm.codecs.entropy import compress, decompress
from polytrain.comm.codecs.error_feedback import ErrorFeedback
from polytrain.comm.codecs.payload import Payload, PayloadError, pack, unpack


def parts_of(tensors: list[torch.Tensor]) -> Parts | None:
    """The parts of a flat encoding of several tensors (their shapes); None for one tensor (the
    encoding's ``shape`` says it all)."""
    return tuple(tuple(t.shape) for t in tensors) if len(tensors) > 1 else None


class DecodeError(RuntimeError):
    """A received payload that does not decode; names the parameter (nothing is applied)."""


class Engine:
    def __init__(self, codec: Codec, *, error_feedback: bool | None = None, entropy: str = "none",
                 seed: int = 0) -> None:
        self.codec, self.seed, self.zstd = codec, seed, entropy == "zstd"
        self.ef = ErrorFeedback() if (codec.biased if error_feedback is None else error_feedback) else None
        self.calls: dict[int, int] = {}
        self.encode_s = self.decode_s = 0.0
        self.raw_bytes = self.encoded_bytes = 0  # float32 bytes in, packed bytes out

    @classmethod
    def from_options(cls, opts: Any, world: int, rank: int, seed: int) -> Engine:
        gen = torch.Generator().manual_seed(seed * 7919 + rank)  # rank-local stochastic rounding
        return cls(build(opts, world, gen), error_feedback=opts.error_feedback, entropy=opts.entropy,
                   seed=seed)

    def key(self, index: int) -> Key:
        """The key of this parameter's current (or just finished) encoding."""
        return Key(index, self.calls.get(index, 0), self.seed)

    def pack(self, p: Payload) -> torch.Tensor:
        return compress(p) if self.zstd else pack(p)

    def unpack(self, buf: torch.Tensor, numel: int) -> Payload:
        if self.zstd:
            return decompress(buf, self.codec.schema(), limit=16 * numel + 256)
        return unpack(buf, self.codec.schema())

    def encode(self, index: int, name: str, g: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """The bytes to send for parameter ``name`` (flat float32 gradient ``g``)."""
        return self.encode_group([(index, name, g)], shape)

    def encode_payload(self, index: int, name: str, g: torch.Tensor,
                       shape: tuple[int, ...]) -> Payload:
        """The payload for parameter ``name``, error feedback applied (not yet packed)."""
        return self.encode_group_payload([(index, name, g)], shape)

    def encode_group_payload(self, members: list[tuple[int, str, torch.Tensor]],
                             shape: Shape | None = None) -> Payload:
        """One payload for several parameters ``(index, name, gradient)`` encoded as one flat
        vector (a codec with ``flat``; one member: any codec, ``shape`` its parameter's shape).
        Each parameter keeps its own residual, codec state and call counter; the encoding's key is
        the first member's; the codec's parts are the gradients' shapes. Decode it with the first
        member's index, shape ``(total,)`` and the same parts (:func:`parts_of`)."""
        t0 = time.perf_counter()
        keys = [self.key(i) for i, _, _ in members]
        names = [n for _, n, _ in members]
        xs = [self.codec.pre(g.reshape(-1).float(), k) for k, (_, _, g) in zip(keys, members, strict=True)]
        sizes = [x.numel() for x in xs]
        total = sum(sizes)
        shape = shape if shape is not None else (total,)
        parts = parts_of([g for _, _, g in members])
        if self.ef is None:
            p = self.codec.encode(xs[0] if len(xs) == 1 else torch.cat(xs), shape, keys[0], parts)
        else:
            x64 = self.ef.add_group(names, xs)  # float64: see error_feedback's exactness note
            p = self.codec.encode(x64.float(), shape, keys[0], parts)
            self.ef.keep_group(names, x64, self.codec.decode(p, total, shape, keys[0], parts), sizes)
        self.codec.post_group(p, keys, sizes)
        self.raw_bytes += 4 * total
        self.encode_s += time.perf_counter() - t0
        return p

    def encode_group(self, members: list[tuple[int, str, torch.Tensor]],
                     shape: Shape | None = None) -> torch.Tensor:
        """:meth:`encode_group_payload`, packed (the bytes to send)."""
        payload = self.encode_group_payload(members, shape)
        t0 = time.perf_counter()  # the payload's own time is already counted
        buf = self.pack(payload)
        self.encoded_bytes += buf.numel()
        self.encode_s += time.perf_counter() - t0
        return buf

    def done(self, index: int) -> None:
        """Every rank's payload of this parameter's current encoding has been decoded."""
        self.calls[index] = self.calls.get(index, 0) + 1

    def decode(self, index: int, name: str, buf: torch.Tensor, shape: Shape, source: str = "",
               parts: Parts | None = None) -> torch.Tensor:
        """The dense float32 gradient (numel,) a rank's bytes stand for (``parts``: the shapes
        of a flat encoding's parameters, as :func:`parts_of` gave them to the encoder)."""
        return self.decode_payload(index, name, buf, shape, source, parts)

    def decode_payload(self, index: int, name: str, data: torch.Tensor | Payload,
                       shape: Shape, source: str = "", parts: Parts | None = None) -> torch.Tensor:
        """Decode packed bytes or a payload (e.g. a sum of reducible payloads)."""
        t0 = time.perf_counter()
        numel = numel_of(shape)
        try:
            p = data if isinstance(data, Payload) else self.unpack(data, numel)
            out = self.codec.decode(p, numel, shape, self.key(index), parts)
        except (PayloadError, ValueError, RuntimeError, IndexError) as err:
            raise DecodeError(f"the {self.codec.name} payload for parameter '{name}'{source} does not "
                              f"decode: {err}; nothing was applied") from None
        self.decode_s += time.perf_counter() - t0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"residuals": self.ef.state_dict() if self.ef is not None else {},
                "calls": torch.tensor(sorted(self.calls.items()), dtype=torch.int64).reshape(-1, 2),
                "codec": self.codec.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.ef is not None:
            self.ef.load_state_dict(state["residuals"])
        self.calls = {int(i): int(c) for i, c in state["calls"].tolist()}
        self.codec.load_state_dict(state["codec"])

    def report(self) -> dict[str, Any]:
        return {"codec": self.codec.label, "error_feedback": self.ef is not None, "entropy": self.zstd,
                "encode_s": round(self.encode_s, 6), "decode_s": round(self.decode_s, 6),
                "payload_bytes": self.encoded_bytes, "fp32_bytes": self.raw_bytes,
                "ratio_vs_fp32": (round(self.raw_bytes / self.encoded_bytes, 3)
                                  if self.encoded_bytes else None)}
