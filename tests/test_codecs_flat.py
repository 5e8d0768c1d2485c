"""Flat encoding (tier 1, no processes): a ``flat`` codec encodes several parameters (a DDP
bucket) as one vector, each parameter keeping its own residual and state.

* error feedback stays exact per parameter (rational arithmetic, values spanning < 2^29);
* elementwise codecs (fp16, bf16, threshold), the quantisers (onebit per tensor and per row,
  terngrad, qsgd: one scale per parameter or row) and topk/dgc/topk+onebit at ratio 1 give bit
  for bit what encoding each parameter alone gives (decoded values, residuals, dgc's velocity);
* a flat topk+onebit keeps one pair of means per parameter (over its kept entries);
* every codec encodes a bucket as one unit, in model order whatever order the bucket lists its
  parameters in.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from polytrain.comm.codecs.engine import Engine
from polytrain.comm.codecs.payload import unpack
from polytrain.comm.exchange import Item, units
from polytrain.comm.options import CodecOptions

SHAPES = ((4, 3), (5,), (2, 2, 2))
NAMES = ("a.weight", "a.bias", "b.weight")


def engine(name: str, ratio: float = 0.3, select: str = "bucket") -> Engine:
    name, _, scale = name.partition(":")  # "onebit:row": scale=row
    opts = CodecOptions(compression=name, ratio=ratio, tau=0.5, error_feedback=True, levels=4,
                        scale=scale or "tensor", select=select)
    return Engine.from_options(opts, world=2, rank=0, seed=3)


def gradients(step: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    # powers of two times small integers: every float64 sum below is exact
    return [torch.randint(-64, 65, s, generator=gen).float() * 2.0 ** -torch.randint(0, 8, s, generator=gen)
            for s in SHAPES]


def flat_step(e: Engine, gs: list[torch.Tensor]) -> list[torch.Tensor]:
    members = [(i, n, g) for i, (n, g) in enumerate(zip(NAMES, gs, strict=True))]
    total = sum(g.numel() for g in gs)
    parts = tuple(tuple(g.shape) for g in gs)
    decoded = e.decode(0, "bucket", e.encode_group(members), (total,), parts=parts)
    for i in range(len(gs)):
        e.done(i)
    return list(decoded.split([g.numel() for g in gs]))


def single_step(e: Engine, gs: list[torch.Tensor]) -> list[torch.Tensor]:
    out = []
    for i, (n, g) in enumerate(zip(NAMES, gs, strict=True)):
        out.append(e.decode(i, n, e.encode(i, n, g, tuple(g.shape)), tuple(g.shape)))
        e.done(i)
    return out


@pytest.mark.parametrize("name", ["fp16", "bf16", "topk", "randomk", "threshold", "topk+fp16", "dgc",
                                  "onebit", "onebit:row", "terngrad", "qsgd", "topk+onebit", "randomk+qsgd"])
def test_error_feedback_is_exact_for_each_parameter_of_a_flat_encoding(name: str) -> None:
    e = engine(name)
    assert e.codec.flat and e.ef is not None
    for step in range(3):
        gs = gradients(step)
        old = [e.ef.residuals.get(n) for n in NAMES]
        velocity = getattr(e.codec, "velocity", {})
        xs = [velocity[i].clone().mul_(0.9).add_(g.reshape(-1)) if i in velocity else g.reshape(-1)
              for i, g in enumerate(gs)]  # dgc compresses u = m·u + g (same float32 ops)
        decoded = flat_step(e, gs)
        for n, x, r, d in zip(NAMES, xs, old, decoded, strict=True):
            want = [Fraction(v) + (Fraction(w) if r is not None else 0)
                    for v, w in zip(x.double().tolist(), (r if r is not None else x).tolist(), strict=True)]
            new = e.ef.residuals[n]
            assert new.numel() == x.numel()
            got = [Fraction(a) + Fraction(b) for a, b in zip(d.double().tolist(), new.tolist(), strict=True)]
            assert got == want, (name, step, n)


@pytest.mark.parametrize("name, ratio", [("fp16", 0.3), ("bf16", 0.3), ("threshold", 0.3), ("topk", 1.0),
                                         ("dgc", 1.0), ("onebit", 0.3), ("onebit:row", 0.3),
                                         ("terngrad", 0.3), ("qsgd", 0.3), ("topk+onebit", 1.0)])
def test_flat_equals_per_parameter_where_the_codec_is_elementwise(name: str, ratio: float) -> None:
    assert_flat_equals_single(name, ratio, "bucket")


def assert_flat_equals_single(name: str, ratio: float, select: str) -> None:
    """Three steps: decoded values, residuals and dgc's velocity bit for bit alike."""
    flat, single = engine(name, ratio, select), engine(name, ratio, select)
    for step in range(3):
        gs = gradients(step)
        for a, b in zip(flat_step(flat, gs), single_step(single, gs), strict=True):
            assert torch.equal(a, b), (name, step)
        assert flat.ef is not None and single.ef is not None
        for n in NAMES:
            assert torch.equal(flat.ef.residuals[n], single.ef.residuals[n]), (name, n)
        for i, u in getattr(single.codec, "velocity", {}).items():
            assert torch.equal(flat.codec.velocity[i], u)  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", ["topk", "dgc", "topk+onebit", "dgc+fp16"])
def test_select_tensor_keeps_what_each_parameter_alone_keeps(name: str) -> None:
    assert_flat_equals_single(name, 0.3, "tensor")
    bucket = engine(name, 0.3)  # the whole bucket's largest: not each parameter's share
    gs = gradients(0)
    gs[1] = gs[1] * 1e-3
    assert torch.count_nonzero(flat_step(bucket, gs)[1]) == 0
    assert torch.count_nonzero(flat_step(engine(name, 0.3, "tensor"), gs)[1]) == 2


@pytest.mark.parametrize("name", ["onebit", "randomk", "threshold", "fp16", "randomk+onebit"])
def test_select_tensor_is_refused_where_nothing_is_selected_by_magnitude(name: str) -> None:
    with pytest.raises(ValueError, match=r"select=tensor .* applies to topk and dgc"):
        CodecOptions(compression=name, select="tensor")


def test_flat_topk_onebit_keeps_one_pair_of_means_per_parameter() -> None:
    e = engine("topk+onebit", ratio=0.4)
    gs = gradients(0)
    members = [(i, n, g) for i, (n, g) in enumerate(zip(NAMES, gs, strict=True))]
    p = unpack(e.encode_group(members), e.codec.schema())
    idx = p["indices"].long()
    assert p["v.scales"].numel() == 2 * len(SHAPES)
    ends = torch.tensor([12, 17, 25])
    decoded = e.decode(0, "bucket", e.pack(p), (25,), parts=SHAPES)
    lo = 0
    for end, (pos, neg) in zip(ends.tolist(), p["v.scales"].view(-1, 2).tolist(), strict=True):
        kept = decoded[idx[(idx >= lo) & (idx < end)]]  # each parameter's kept entries: its own means
        assert set(kept.tolist()) <= {pos, neg}
        lo = end


def test_every_codec_encodes_a_bucket_as_one_unit_in_model_order() -> None:
    items = [Item(i, n, torch.zeros(s)) for i, (n, s) in enumerate(zip(NAMES, SHAPES, strict=True))]
    backward = list(reversed(items))  # DDP's first bucket order
    for name in ("onebit", "qsgd", "terngrad", "topk+onebit", "topk", "fp16"):
        (u,) = units(engine(name), backward)
        assert u.items == items and u.parts == SHAPES
    (u,) = units(engine("topk"), backward)
    assert u.items == items and u.shape == (12 + 5 + 8,) and u.name == "a.weight..b.weight"
    assert [t.numel() for t in u.split(torch.zeros(25))] == [12, 5, 8]
