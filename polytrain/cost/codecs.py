"""Pricing gradient codecs for the planner (``allreduce --set compression=NAME``).

Bytes come from the real codec: every parameter of the profile (name, shape) is encoded once by
:mod:`polytrain.comm.codecs` and the payload's size is read, so a payload format change is priced
without a second formula. Time comes from timing that codec's encode and decode of those tensors
on this machine (scaled by the scene's compute scale, as compute is). PowerSGD is PyTorch's hook:
its two rank-r factors per matrix (and the uncompressed vectors) are all-reduced, and its cost is
two matrix products and an orthogonalisation per matrix, timed here too.

How the runtime uses them (:func:`polytrain.comm.exchange.compressed_mean`, called inside the DDP
hook, which blocks backward while it runs): ``reducible`` codecs (fp16, bf16, randomk) all-reduce
their payload in place; the others all-gather every rank's payload and each rank decodes all W of
them; a ``flat`` codec encodes each DDP bucket as one vector (priced so). Gradients are random
normal here; a data-dependent payload (``threshold``: how many entries pass τ) or
``entropy=zstd`` would need real gradients, so the planner does not price them.
"""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

# what `polytrain plan` lists besides uncompressed all-reduce: (compression, options)
DEFAULT_CODECS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("fp16", {}),
    ("onebit", {}),
    ("topk", {"ratio": 0.01}),
    ("topk+onebit", {"ratio": 0.01}),
    ("dgc", {"ratio": 0.001}),
    ("powersgd", {"powersgd_rank": 1}),
)
UNPRICED = {"threshold": "its payload depends on the gradients' magnitudes against tau",
            "none": "nothing to price",
            "onebit-adam": "it is Adam's step, not a gradient codec: full-price warm-up, then 1 bit "
                           "(docs/codecs-onebit.md); the planner does not model it yet"}


@dataclass(frozen=True)
class CodecPrice:
    """One rank's codec work and payload per step, for the whole model."""

    compression: str
    reducible: bool  # payloads summed in place (all-reduce) rather than all-gathered
    payload_bytes: int  # one rank's payload for all parameters (packed, as sent; no frame)
    fp32_bytes: int
    encode_s: float  # this rank encoding its gradients
    decode_s: float  # decoding ONE rank's payload (all-gathering codecs decode W of them)
    flat: bool = False  # one payload per DDP bucket (a flat codec), else one per parameter

    @property
    def ratio(self) -> float:
        return self.fp32_bytes / self.payload_bytes if self.payload_bytes else float("inf")


def _median_s(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def price(compression: str, options: dict[str, Any], params: tuple[tuple[str, tuple[int, ...]], ...],
          world: int, repeats: int = 3) -> CodecPrice:
    """Encode and decode one random gradient per parameter with the named codec."""
    if compression in UNPRICED:
        raise ValueError(f"compression={compression} is not priced by the planner: {UNPRICED[compression]}")
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(max(1, _numel(s)), generator=gen) for _, s in params]
    fp32 = sum(4 * g.numel() for g in grads)
    if compression == "powersgd":
        return _powersgd(options.get("powersgd_rank", 1), params, grads, fp32, repeats)
    from polytrain.comm.codecs import build
    from polytrain.comm.codecs.base import Key
    from polytrain.comm.codecs.payload import pack
    from polytrain.comm.options import CodecOptions
    from polytrain.cost.network import buckets_of

    opts = CodecOptions(compression=compression, **options)
    codec = build(opts, world, torch.Generator().manual_seed(0))
    shapes = [tuple(s) or (1,) for _, s in params]
    keys = [Key(i, 0, 0) for i in range(len(grads))]
    parts: list[tuple[tuple[int, ...], ...] | None] = [None] * len(grads)
    if codec.flat:  # the runtime encodes each DDP bucket as one flat vector (parts: its shapes)
        groups = [list(reversed(b)) for b in buckets_of([4 * g.numel() for g in reversed(grads)], 25 * 2**20)]
        parts = [tuple(shapes[len(grads) - 1 - i] for i in b) if len(b) > 1 else None for b in groups]
        grads = [torch.cat([grads[len(grads) - 1 - i] for i in b]) for b in groups]
        shapes = [(g.numel(),) if pt is not None else shapes[len(shapes) - 1 - b[0]]
                  for g, pt, b in zip(grads, parts, groups, strict=True)]
        keys = keys[: len(grads)]
    payloads = [codec.encode(codec.pre(g, k), s, k, pt)
                for g, s, k, pt in zip(grads, shapes, keys, parts, strict=True)]

    def encode() -> None:
        for g, s, k, pt in zip(grads, shapes, keys, parts, strict=True):
            codec.encode(codec.pre(g, k), s, k, pt)

    def decode() -> None:
        for p, g, s, k, pt in zip(payloads, grads, shapes, keys, parts, strict=True):
            codec.decode(p, g.numel(), s, k, pt)

    if codec.reducible:  # the runtime all-reduces the values fields, concatenated
        sent = sum(p["values"].numel() * p["values"].element_size() for p in payloads)
    else:  # it frames the packed payloads (each with its header) and all-gathers the frame
        sent = sum(pack(p).numel() for p in payloads)
    return CodecPrice(compression, bool(codec.reducible), sent, fp32,
                      _median_s(encode, repeats), _median_s(decode, repeats), bool(codec.flat))


def codec_price(options: Any, params: tuple[tuple[str, tuple[int, ...]], ...]) -> CodecPrice | None:
    """The codec a strategy's typed ``CodecOptions`` name, priced; None when it sends fp32."""
    if options.compression == "none":
        return None
    if options.entropy != "none":
        raise ValueError("entropy coding is not priced by the planner (its size depends on the gradients)")
    from polytrain.comm.options import CodecOptions

    keys = set(CodecOptions.model_fields) - {"compression", "collective", "entropy", "error_feedback"}
    chosen = options.model_dump(include=keys, exclude_defaults=True)
    return cached_price(options.compression, tuple(sorted(chosen.items())), params)


#: at most this many gradient elements are encoded here to price a codec; a larger model (one
#: profiled on the meta device) has its codecs left unpriced (`recommend.candidates` lists them)
MAX_ENCODED = 1 << 28


@functools.lru_cache(maxsize=64)
def cached_price(compression: str, options: tuple[tuple[str, Any], ...],
                 params: tuple[tuple[str, tuple[int, ...]], ...]) -> CodecPrice:
    """:func:`price` once per (codec, options, model) in a process (a sweep prices many worlds;
    the payload does not depend on the world size, nor do the codecs' timings)."""
    total = sum(_numel(s) for _, s in params)
    if total > MAX_ENCODED:
        raise ValueError(f"a codec is priced by encoding every gradient once on this machine; "
                         f"{total:,} elements is past {MAX_ENCODED:,}")
    return price(compression, dict(options), params, world=2)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _powersgd(rank: int, params: tuple[tuple[str, tuple[int, ...]], ...], grads: list[torch.Tensor],
              fp32: int, repeats: int) -> CodecPrice:
    """PyTorch's PowerSGD: a matrix n×m sends P (n×r) and Q (m×r); vectors go uncompressed."""
    mats = [(g.view(s[0], -1), r) for (_, s), g in zip(params, grads, strict=True)
            if len(s) >= 2 and (r := min(rank, s[0], _numel(s) // s[0])) > 0]
    payload = sum(4 * g.numel() for (_, s), g in zip(params, grads, strict=True) if len(s) < 2)
    payload += sum(4 * r * (m.shape[0] + m.shape[1]) for m, r in mats)
    qs = [torch.randn(m.shape[1], r) for m, r in mats]

    def compress() -> None:
        for (m, _), q in zip(mats, qs, strict=True):
            p = torch.linalg.qr(m @ q).Q
            _ = m.t() @ p

    def rebuild() -> None:
        for (m, r), q in zip(mats, qs, strict=True):
            _ = torch.randn(m.shape[0], r) @ q.t()

    return CodecPrice("powersgd", True, payload, fp32, _median_s(compress, repeats),
                      _median_s(rebuild, repeats))
