"""``entropy=zstd``: Zstandard over the packed payload, sparse indices delta-encoded first.

Sorted indices become gaps (first index, then differences), which are small and repetitive, so
zstd (the ``zstandard`` package, level 3) shrinks them well; values compress little. Decoding
undoes both; a frame zstd cannot read is a :class:`PayloadError`.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from polytrain.comm.codecs.payload import Payload, PayloadError, Schema, pack, unpack

LEVEL = 3


def delta(p: Payload) -> Payload:
    idx = p.fields.get("indices")
    if idx is None or idx.numel() < 2:
        return p
    gaps = torch.cat([idx[:1], idx[1:] - idx[:-1]])
    return Payload({**p.fields, "indices": gaps})


def undelta(p: Payload) -> Payload:
    idx = p.fields.get("indices")
    if idx is None or idx.numel() < 2:
        return p
    return Payload({**p.fields, "indices": idx.cumsum(0, dtype=torch.int64).to(torch.int32)})


_local = threading.local()


def _compressor() -> Any:
    """One compressor per thread, reused (building one costs more than compressing a small
    payload; a zstd compressor must not be shared between threads)."""
    if not hasattr(_local, "cctx"):
        import zstandard  # a dependency; imported here so polytrain loads without it until asked

        _local.cctx = zstandard.ZstdCompressor(level=LEVEL, write_checksum=True, write_content_size=True)
    return _local.cctx


def compress(p: Payload) -> torch.Tensor:
    raw = pack(delta(p)).numpy().tobytes()
    return torch.frombuffer(bytearray(_compressor().compress(raw)), dtype=torch.uint8)


def decompress(buf: torch.Tensor, schema: Schema, limit: int) -> Payload:
    """``limit``: the most bytes the packed payload may have (refuses decompression bombs)."""
    import zstandard

    data = buf.numpy().tobytes()
    try:
        size = zstandard.frame_content_size(data)
        if not 0 <= size <= limit:
            raise PayloadError(f"zstd frame announces {size} bytes, more than the {limit} possible")
        dobj = zstandard.ZstdDecompressor().decompressobj()
        raw = dobj.decompress(data)
    except zstandard.ZstdError as err:
        raise PayloadError(f"zstd frame does not decode ({err})") from None
    if not dobj.eof or dobj.unused_data or len(raw) != size:
        raise PayloadError(f"zstd frame of {len(data)} bytes is truncated or followed by extra bytes")
    return undelta(unpack(torch.frombuffer(bytearray(raw), dtype=torch.uint8), schema))
