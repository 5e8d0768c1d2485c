"""Typed payloads: what a codec puts on the wire, and its exact byte layout.

A :class:`Payload` is a codec's named fields (e.g. ``indices`` int32 + ``values`` float32 for
top-k). :func:`pack` lays them out as one uint8 tensor — a header of int32 byte lengths, one per
field, then each field's raw bytes — so what is counted at the send is exactly what travels.
:func:`unpack` reverses it against the codec's schema (field names and dtypes) and refuses a
buffer whose lengths do not add up (truncated, padded, wrong codec) with :class:`PayloadError`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

Schema = tuple[tuple[str, torch.dtype], ...]


class PayloadError(ValueError):
    """A payload that does not decode (truncated, wrong size, wrong codec)."""


@dataclass(frozen=True)
class Payload:
    """One parameter's encoded gradient: named tensors, in the codec's schema order."""

    fields: dict[str, torch.Tensor]

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.fields[name]

    @property
    def nbytes(self) -> int:
        """Bytes of the fields alone (without the packing header)."""
        return sum(t.numel() * t.element_size() for t in self.fields.values())


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def pack(payload: Payload) -> torch.Tensor:
    """One uint8 tensor: int32 byte length of each field, then the fields' bytes."""
    parts = [_as_bytes(t) for t in payload.fields.values()]
    head = torch.tensor([p.numel() for p in parts], dtype=torch.int32).view(torch.uint8)
    return torch.cat([head, *parts]) if parts else head


def unpack(buf: torch.Tensor, schema: Schema) -> Payload:
    """The payload packed in ``buf`` under ``schema``; PayloadError if the sizes do not match."""
    head_len = 4 * len(schema)
    if buf.dtype != torch.uint8 or buf.dim() != 1:
        raise PayloadError(f"a packed payload is a 1-D uint8 tensor, got {buf.dtype} {tuple(buf.shape)}")
    if buf.numel() < head_len:
        raise PayloadError(f"{buf.numel()} bytes is shorter than the {head_len}-byte header")
    lengths = buf[:head_len].clone().view(torch.int32).tolist()
    if any(n < 0 for n in lengths) or head_len + sum(lengths) != buf.numel():
        raise PayloadError(f"header announces {sum(lengths)} bytes of fields {lengths} but "
                           f"{buf.numel() - head_len} follow (truncated or wrong codec)")
    fields, pos = {}, head_len
    for (name, dtype), n in zip(schema, lengths, strict=True):
        size = torch.empty(0, dtype=dtype).element_size()
        if n % size:
            raise PayloadError(f"field '{name}' has {n} bytes, not a whole number of {dtype}")
        fields[name] = buf[pos : pos + n].clone().view(dtype)
        pos += n
    return Payload(fields)


def frame(messages: list[torch.Tensor]) -> torch.Tensor:
    """Several packed payloads as one message: their count and int32 lengths, then the bytes."""
    head = torch.tensor([len(messages), *(m.numel() for m in messages)], dtype=torch.int32)
    return torch.cat([head.view(torch.uint8), *messages])


def unframe(buf: torch.Tensor, count: int) -> list[torch.Tensor]:
    """The ``count`` packed payloads of one :func:`frame` message (PayloadError if malformed)."""
    head_len = 4 * (count + 1)
    if buf.numel() < head_len:
        raise PayloadError(f"message of {buf.numel()} bytes is shorter than its {head_len}-byte header")
    head = buf[:head_len].clone().view(torch.int32).tolist()
    if head[0] != count or any(n < 0 for n in head[1:]) or head_len + sum(head[1:]) != buf.numel():
        raise PayloadError(f"message announces {head[0]} payloads of {head[1:]} bytes, expected "
                           f"{count} payloads in {buf.numel() - head_len} bytes")
    out, pos = [], head_len
    for n in head[1:]:
        out.append(buf[pos : pos + n])
        pos += n
    return out


def pack_bits(values: torch.Tensor, width: int) -> torch.Tensor:
    """Unsigned integers < 2**width (width 1, 2, 4 or 8), ``8 // width`` to a byte."""
    if width == 8:
        return values.to(torch.uint8)
    per = 8 // width
    v = values.to(torch.uint8).reshape(-1)
    pad = (-v.numel()) % per
    if pad:
        v = torch.cat([v, v.new_zeros(pad)])
    shifts = torch.arange(per, dtype=torch.uint8) * width
    return (v.reshape(-1, per) << shifts).sum(dim=1, dtype=torch.uint8)


def unpack_bits(packed: torch.Tensor, width: int, count: int) -> torch.Tensor:
    """The first ``count`` values of :func:`pack_bits` (int64)."""
    if width == 8:
        out = packed.to(torch.int64)
    else:
        per = 8 // width
        shifts = torch.arange(per, dtype=torch.uint8) * width
        out = ((packed.unsqueeze(1) >> shifts) & ((1 << width) - 1)).reshape(-1).to(torch.int64)
    if out.numel() < count:
        raise PayloadError(f"{packed.numel()} bytes hold {out.numel()} values of {width} bits, "
                           f"expected {count}")
    return out[:count]


def bits_width(levels: int) -> int:
    """The smallest of 1, 2, 4, 8 bits that holds 0..levels."""
    for w in (1, 2, 4, 8):
        if levels < (1 << w):
            return w
    raise ValueError(f"levels must be < 256, got {levels}")
