"""Codecs (tier 1, no processes): property tests with hypothesis over shapes and values.

* error feedback: decode(encode(g + r_old)) + r_new == g + r_old checked in exact rational
  arithmetic, over several steps: exactly for every codec on gradients whose values span less
  than 2^29 (real gradients; the residual is float64, see error_feedback.py), and within
  2^-52·(|x| + |d|) at extreme spans (1e6 next to subnormals), where no fixed-width residual
  can be exact;
* payloads: what is packed is exactly header + fields, unpacks to the same fields, and a
  truncated or grown buffer is refused naming the parameter;
* composition: ``a+b`` decodes to a's decoding of b's decoding of a's values.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from pydantic import ValidationError

from polytrain.comm.codecs import SINGLE, build
from polytrain.comm.codecs.base import Key
from polytrain.comm.codecs.engine import DecodeError, Engine
from polytrain.comm.codecs.payload import pack, unpack
from polytrain.comm.options import CodecOptions

SPARSE_OR_CAST = ("fp16", "bf16", "topk", "randomk", "dgc", "topk+fp16", "randomk+bf16", "dgc+fp16")
QUANTISERS = ("threshold", "onebit", "terngrad", "qsgd", "topk+onebit", "randomk+qsgd", "dgc+terngrad")

values = st.one_of(st.floats(-1e6, 1e6, allow_nan=False, width=32), st.sampled_from([0.0, 1.0, -1.0]))
shapes = st.lists(st.integers(0, 9), min_size=1, max_size=3).map(tuple)


def grads(shape: tuple[int, ...]) -> st.SearchStrategy[np.ndarray]:
    return arrays(np.float32, shape, elements=values)


def engine(name: str, **kw: object) -> Engine:
    opts = CodecOptions(compression=name, ratio=0.3, tau=0.5, scale="row", levels=7, dgc_warmup=2, **kw)
    return Engine.from_options(opts, world=2, rank=0, seed=11)


def exact(t: torch.Tensor) -> list[Fraction]:
    return [Fraction(v) for v in t.double().reshape(-1).tolist()]


Exact = list[Fraction]


def step(e: Engine, g: torch.Tensor, shape: tuple[int, ...]) -> tuple[Exact, Exact, Exact]:
    """One encoding of ``g``, as exact rationals: (g + r_old, decoded + r_new, |x| + |decoded|)."""
    assert e.ef is not None
    old = e.ef.residuals.get("w")
    x = exact(g)
    velocity = getattr(getattr(e.codec, "outer", e.codec), "velocity", None)
    if velocity is not None and 0 in velocity:  # dgc compresses its velocity u = m·u + g
        x = exact(velocity[0].clone().mul_(0.9).add_(g.reshape(-1)))  # same float32 ops as the codec
    want = x if old is None else [a + b for a, b in zip(x, exact(old), strict=True)]
    decoded = e.decode(0, "w", e.encode(0, "w", g, shape), shape)
    e.done(0)
    got = [a + b for a, b in zip(exact(decoded), exact(e.ef.residuals["w"]), strict=True)]
    return want, got, [abs(a) + abs(b) for a, b in zip(want, exact(decoded), strict=True)]


narrow = st.one_of(st.floats(2.0**-12, 2.0**12, width=32), st.floats(-(2.0**12), -(2.0**-12), width=32),
                   st.just(0.0))  # a span of 2^24 < 2^29


@settings(max_examples=25, deadline=None)
@given(data=st.data(), shape=shapes, name=st.sampled_from(SPARSE_OR_CAST + QUANTISERS), wide=st.booleans())
def test_error_feedback_keeps_every_bit_of_the_gradient(data: st.DataObject, shape: tuple[int, ...],
                                                        name: str, wide: bool) -> None:
    e = engine(name, error_feedback=True)
    for _ in range(3):  # residuals carried over several steps
        g = torch.from_numpy(data.draw(grads(shape) if wide else arrays(np.float32, shape, elements=narrow)))
        want, got, size = step(e, g, shape)
        if not wide:
            assert got == want, name
        else:  # 1e6 beside 1e-45: at most two float64 roundings
            bound = Fraction(2) ** -52
            assert all(abs(a - b) <= bound * m for a, b, m in zip(got, want, size, strict=True)), name


@settings(max_examples=25, deadline=None)
@given(data=st.data(), shape=shapes, name=st.sampled_from((*SINGLE, "topk+onebit", "randomk+qsgd")),
       zstd=st.booleans())
def test_payload_bytes_round_trip_and_refuse_truncation(data: st.DataObject, shape: tuple[int, ...],
                                                        name: str, zstd: bool) -> None:
    e = engine(name, entropy="zstd" if zstd else "none")
    g = torch.from_numpy(data.draw(grads(shape)))
    buf = e.encode(0, "w", g, shape)
    assert e.encoded_bytes == buf.numel()  # what the engine reports is what it handed over
    p = e.unpack(buf, g.numel())
    raw = pack(p)
    assert raw.numel() == 4 * len(p.fields) + p.nbytes  # the header and the fields, nothing else
    assert zstd or torch.equal(raw, buf)
    back = unpack(raw, e.codec.schema())
    assert all(torch.equal(back[k], p[k]) for k in p.fields)
    assert torch.equal(e.decode(0, "w", buf, shape), e.codec.decode(p, g.numel(), shape, e.key(0)))
    for bad in (buf[:-1], torch.cat([buf, buf[:3]])):
        with pytest.raises(DecodeError, match="parameter 'w'"):
            e.decode(0, "w", bad, shape)


@settings(max_examples=20, deadline=None)
@given(data=st.data(), n=st.integers(1, 60))
def test_composition_is_the_value_codec_inside_the_sparsifier(data: st.DataObject, n: int) -> None:
    g = torch.from_numpy(data.draw(grads((n,))))
    opts = CodecOptions(compression="topk+fp16", ratio=0.25)
    both = build(opts, 2, torch.Generator())
    key = Key(0, 0, 3)
    topk = build(CodecOptions(compression="topk", ratio=0.25), 2, torch.Generator())
    p = topk.encode(g, (n,), key)
    half = build(CodecOptions(compression="fp16"), 2, torch.Generator())
    k = p["values"].numel()
    vals = half.decode(half.encode(p["values"], (k,), key), k, (k,), key)
    want = topk.decode(type(p)({**p.fields, "values": vals}), n, (n,), key)
    assert torch.equal(both.decode(both.encode(g, (n,), key), n, (n,), key), want)


def test_randomk_ranks_agree_on_indices_and_codecs_are_checked() -> None:
    a, b = (Engine.from_options(CodecOptions(compression="randomk", ratio=0.1), 2, r, 5) for r in (0, 1))
    g = torch.randn(1000)
    da = a.decode(3, "w", a.encode(3, "w", g, (1000,)), (1000,))
    db = b.decode(3, "w", b.encode(3, "w", -g, (1000,)), (1000,))
    assert torch.equal(da.nonzero(), db.nonzero()) and da.count_nonzero() == 100
    bad_options = (({"compression": "zip"}, "valid: none, fp16"),
                   ({"compression": "onebit+topk"}, r"a\+b with"),
                   ({"ratio": 0.0}, r"\(0, 1\]"), ({"ratio": 1.5}, r"\(0, 1\]"),
                   ({"tau": -1.0}, "tau must be > 0"), ({"levels": 0}, "1..255"))
    for bad, msg in bad_options:
        with pytest.raises(ValidationError, match=msg):
            CodecOptions(**bad)  # type: ignore[arg-type]


def test_dgc_at_ratio_one_is_plain_sgd() -> None:
    """Momentum factor masking zeroes every sent entry's velocity: at ratio 1 everything is sent
    each step, so what travels is the gradient itself, with no momentum (the docstring's claim)."""
    e = Engine.from_options(CodecOptions(compression="dgc", ratio=1.0), world=2, rank=0, seed=1)
    gen = torch.Generator().manual_seed(5)
    for _ in range(4):
        g = torch.randn(6, generator=gen)
        got = e.decode(0, "w", e.encode(0, "w", g, (6,)), (6,))
        e.done(0)
        assert torch.equal(got, g)


def test_dgc_without_masking_at_ratio_one_is_momentum_sgd() -> None:
    """dgc_masking=false keeps the velocity of sent entries: at ratio 1 what travels each step is
    the momentum-SGD velocity u ← m·u + g itself."""
    opts = CodecOptions(compression="dgc", ratio=1.0, dgc_masking=False, dgc_momentum=0.9)
    e = Engine.from_options(opts, world=2, rank=0, seed=1)
    gen = torch.Generator().manual_seed(5)
    u = torch.zeros(6)
    for _ in range(4):
        g = torch.randn(6, generator=gen)
        u = 0.9 * u + g
        got = e.decode(0, "w", e.encode(0, "w", g, (6,)), (6,))
        e.done(0)
        torch.testing.assert_close(got, u, rtol=0, atol=1e-6)
