"""1-bit Adam (issue 51) and the codec × optimizer rule.

Tier 1 (no processes): the two-stage exchange run by hand between simulated ranks — error
feedback keeps every bit on the worker and on the server side (exact rationals, as
tests/test_codecs.py does for every codec), every rank assembles the same vector, payload sizes
are the sign bits and scales; refusals before launch. Tier 3 (2 ranks, gloo): with the warm-up
covering every step it *is* uncompressed Adam bit for bit; the bytes counted at the sends are the
payload sizes; a resumed run equals the uninterrupted one. The same on ``mesh``'s data-parallel
axis (dp=2 × pp=2, 4 ranks): equal to uncompressed mesh (and single) while warm, then only the
1-bit payloads on the dp axis, and its resume exact.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import torch

import polytrain
from polytrain.comm.twostage import TwoStage, chunk_pieces
from polytrain.config import make_config
from polytrain.errors import ConfigError
from polytrain.launch.prepare import prepare
from tests.conftest import assert_same_params, load_model
from tests.test_resume_all import _cut_back as cut_back

SIZES = [("fc1.weight", 7 * 5), ("fc1.bias", 7), ("fc2.weight", 3 * 7), ("fc2.bias", 3)]
SMALL = {"model": "mlp", "dataset": "digits", "batch_size": 32, "seed": 4, "optimizer": "adam", "lr": 0.01}


def exact(t: torch.Tensor) -> list[Fraction]:
    return [Fraction(v) for v in t.double().reshape(-1).tolist()]


def residual(engine: Any, ts: TwoStage, j: int) -> torch.Tensor:
    """The chunk's residual, its pieces back to back (zeros before the first encoding)."""
    assert engine.ef is not None
    return torch.cat([engine.ef.residuals.get(p.label, torch.zeros(p.hi - p.lo, dtype=torch.float64))
                      for p in ts.pieces[j]])


def narrow(n: int, gen: torch.Generator) -> torch.Tensor:
    """Momentum-like values spanning less than 2^29 (see error_feedback.py's exactness note)."""
    return (torch.randn(n, generator=gen) * 2.0 ** torch.randint(-8, 8, (n,), generator=gen)).float()


def test_chunks_hold_every_entry_once() -> None:
    bounds = [0, 22, 44, 66]
    pieces = chunk_pieces(SIZES, bounds)
    lengths = [sum(p.hi - p.lo for p in chunk) for chunk in pieces]
    assert lengths == [22, 22, 22]
    assert [p.label for p in pieces[0]] == ["fc1.weight[0:22]"]
    assert [p.label for p in pieces[1]] == ["fc1.weight[22:35]", "fc1.bias[0:7]", "fc2.weight[0:2]"]


@pytest.mark.parametrize("world,entropy", [(2, "none"), (3, "none"), (3, "zstd")])
def test_both_stages_keep_every_bit_and_ranks_agree(world: int, entropy: str) -> None:
    """decode(encode(x + r_old)) + r_new == x + r_old on workers (each chunk) and servers."""
    ranks = [TwoStage(SIZES, world, r, entropy=entropy, seed=3) for r in range(world)]
    gen = torch.Generator().manual_seed(world)
    for _ in range(3):  # residuals carried over steps
        xs = [narrow(66, gen) for _ in range(world)]
        old = [[residual(ts.worker, ts, j) for j in range(world)] for ts in ranks]
        sent = [ts.encode_chunks(x) for ts, x in zip(ranks, xs, strict=True)]
        for r, ts in enumerate(ranks):
            for j in range(world):
                decoded = ts._decode(ts.worker, j, sent[r][j], "")
                chunk = xs[r][ts.bounds[j] : ts.bounds[j + 1]]
                got = [a + b for a, b in zip(exact(decoded), exact(residual(ts.worker, ts, j)), strict=True)]
                assert got == [a + b for a, b in zip(exact(chunk), exact(old[r][j]), strict=True)]
        served = []
        for j, ts in enumerate(ranks):
            old_s = residual(ts.server, ts, j)
            mean = ts.average([sent[r][j] for r in range(world)])
            served.append(ts.serve([sent[r][j] for r in range(world)]))
            decoded = ts._decode(ts.server, j, served[-1], "")
            got = [a + b for a, b in zip(exact(decoded), exact(residual(ts.server, ts, j)), strict=True)]
            assert got == [a + b for a, b in zip(exact(mean), exact(old_s), strict=True)]
        outs = [ts.assemble(served) for ts in ranks]
        assert all(torch.equal(o, outs[0]) for o in outs)  # one momentum on every rank


def test_payloads_are_sign_bits_and_two_scales_per_piece() -> None:
    ts = TwoStage(SIZES, 3, 0)
    bufs = ts.encode_chunks(torch.randn(66))
    for j, buf in enumerate(bufs):
        n, pieces = ts.numel(j), len(ts.pieces[j])
        assert buf.numel() == 8 + -(-n // 8) + 8 * pieces  # header, signs, (pos, neg) means


def allreduce(options: dict[str, Any], optimizer: str = "adam", strategy: str = "allreduce") -> None:
    prepare(make_config({"strategy": strategy, "procs": 2, "optimizer": optimizer, "options": options}))


@pytest.mark.parametrize("strategy,optimizer,options,match", [
    ("allreduce", "momentum", {"compression": "dgc"},
     r"dgc_momentum=0.9.*--optimizer momentum.*use --optimizer sgd .* or --set dgc_momentum=0"),
    ("allreduce", "adam", {"compression": "dgc+fp16"}, r"--optimizer adam adds a second one"),
    ("local-sgd", "adam", {"compression": "dgc"}, r"--optimizer adam adds a second one"),
    ("ps", "momentum", {"compression": "dgc"}, r"--optimizer momentum adds a second one"),
    ("mesh", "adam", {"compression": "dgc", "dp": 2}, r"--optimizer adam adds a second one"),
    ("allreduce", "sgd", {"compression": "onebit-adam"}, r"needs --optimizer adam \(got --optimizer sgd\)"),
    ("local-sgd", "adam", {"compression": "onebit-adam"}, r"only 'allreduce' and 'mesh' run"),
    ("mesh", "adam", {"compression": "onebit-adam", "dp": 1, "pp": 2}, r"dp=1 has none.*--set dp=2"),
    ("allreduce", "adam", {"compression": "onebit-adam", "collective": "ring"}, "drop collective=ring"),
    ("allreduce", "adam", {"compression": "onebit-adam", "error_feedback": False},
     "error_feedback= is read only by"),
    ("allreduce", "adam", {"compression": "topk", "onebit_warmup": 5}, "onebit_warmup= is read only by"),
])
def test_codec_optimizer_pairs_are_refused_before_launch(strategy: str, optimizer: str,
                                                         options: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        allreduce(options, optimizer, strategy)


def test_the_fixes_the_refusal_names_are_accepted() -> None:
    allreduce({"compression": "dgc"}, "sgd")
    allreduce({"compression": "dgc", "dgc_momentum": 0.0}, "adam")
    allreduce({"compression": "onebit-adam", "onebit_warmup": 5, "entropy": "zstd"}, "adam")
    allreduce({"compression": "onebit-adam", "dp": 2}, "adam", "mesh")


def test_mesh_refuses_onebit_adam_with_weights_tied_across_stages(tmp_path: Path) -> None:
    """nanoGPT's wte = lm_head on stages 0 and 1: two 1-bit updates of one weight would drift."""
    job = {"model": "userzoo.nanogpt:GPT", "dataset": "chars", "optimizer": "adam",
           "model_options": {"n_layer": 2, "n_head": 2, "n_embd": 16, "split": "transformer.h.1"}}
    with pytest.raises(ConfigError, match=r"pp=2 and compression=onebit-adam: the tied weights .*lm_head"):
        polytrain.train(strategy="mesh", procs=4, out=str(tmp_path / "m"), steps=2,
                        options={"dp": 2, "pp": 2, "compression": "onebit-adam"}, **job)
    assert not (tmp_path / "m").exists()


def run(tmp_path: Path, name: str, sets: list[str], **kw: Any) -> dict[str, Any]:
    return polytrain.train(strategy="allreduce", procs=2, out=str(tmp_path / name), sets=sets,
                           **{**SMALL, **kw})


@pytest.mark.slow
def test_warmup_covering_every_step_is_uncompressed_adam_bit_for_bit(tmp_path: Path) -> None:
    run(tmp_path, "adam", [], steps=4)
    s = run(tmp_path, "onebit", ["compression=onebit-adam", "onebit_warmup=4"], steps=4)
    assert s["strategy_metrics"]["codec"]["compressed_steps"] == 0
    a, b = load_model(tmp_path / "adam"), load_model(tmp_path / "onebit")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_bytes_counted_are_the_payloads_and_resume_is_exact(tmp_path: Path) -> None:
    """2 warm-up steps, 4 compressed ones; then the same run cut back to step 3 and resumed."""
    sets = ["compression=onebit-adam", "onebit_warmup=2"]
    s = run(tmp_path, "full", sets, steps=6, checkpoint_every=3)
    params = [(k, v.numel()) for k, v in load_model(tmp_path / "full").items()]
    codec = s["strategy_metrics"]["codec"]
    assert codec["compressed_steps"] == 4 and codec["ratio_vs_fp32"] > 20
    for rank, counts in enumerate(s["per_rank"]):
        ts = TwoStage(params, 2, rank)
        bufs = ts.encode_chunks(torch.randn(ts.total))
        # all-to-all: the chunk of the other rank; ring all-gather: its own server payload
        assert counts["bytes_by_op"]["onebit"] == 4 * (bufs[1 - rank].numel() + bufs[rank].numel())
    cut_back(tmp_path / "full", tmp_path / "part", 3)
    polytrain.train(resume=str(tmp_path / "part"))
    a, b = load_model(tmp_path / "part"), load_model(tmp_path / "full")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_strategies_allreduce_lists_onebit_adam_and_its_option(capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from polytrain.cli import main

    monkeypatch.setenv("COLUMNS", "200")
    assert main(["strategies", "allreduce"]) == 0
    out = capsys.readouterr().out
    assert "onebit-adam" in out and "onebit_warmup" in out
    assert main(["strategies", "mesh"]) == 0
    head = capsys.readouterr().out.split("options (--set")[0]  # mesh's own lines, not the table
    assert "compression=onebit-adam" in " ".join(head.split()) and "not ``powersgd``" in head


MESH = {**SMALL, "batch_size": 16, "sets": ["model.depth=3", "model.hidden=32", "dp=2", "pp=2"]}


def mesh(tmp_path: Path, name: str, sets: list[str], **kw: Any) -> dict[str, Any]:
    job = {**MESH, **kw}
    job["sets"] = [*MESH["sets"], *sets]
    return polytrain.train(strategy="mesh", procs=4, out=str(tmp_path / name), **job)


def stage_sizes(full: dict[str, torch.Tensor], numel: int, first: bool) -> list[tuple[str, int]]:
    """The (name, numel) of the stage holding ``numel`` entries: a prefix or suffix of the model."""
    sizes = [(k, v.numel()) for k, v in full.items()]
    for cut in range(len(sizes) + 1):
        part = sizes[:cut] if first else sizes[cut:]
        if sum(n for _, n in part) == numel:
            return part
    raise AssertionError(f"no stage of {numel} entries")


@pytest.mark.slow
def test_mesh_dp_axis_warm_equals_uncompressed_then_counts_one_bit_and_resumes(tmp_path: Path) -> None:
    """dp=2 × pp=2: warm-up ≥ steps is uncompressed mesh bit for bit (and single to float
    tolerance); warm-up 2 of 6 steps sends the full all-reduce twice, then exactly the 1-bit
    payloads (worker chunk + server chunk to the other replica, and their sizes) on the dp axis
    only; cut back to step 3 and resumed, it ends where the uninterrupted run does."""
    from polytrain.runtime.layout import Layout
    from polytrain.strategies.hybrid.mesh import DP_OPS

    mesh(tmp_path, "plain", [], steps=6)
    mesh(tmp_path, "warm", ["compression=onebit-adam", "onebit_warmup=6"], steps=6)
    polytrain.train(strategy="single", procs=1, out=str(tmp_path / "single"), steps=6,
                    **{**SMALL, "batch_size": 16, "sets": MESH["sets"][:2]})
    plain, warm = load_model(tmp_path / "plain"), load_model(tmp_path / "warm")
    assert all(torch.equal(plain[k], warm[k]) for k in plain)
    assert_same_params(warm, load_model(tmp_path / "single"))

    s = mesh(tmp_path, "full", ["compression=onebit-adam", "onebit_warmup=2"], steps=6, checkpoint_every=3)
    assert s["strategy_metrics"]["codec"]["compressed_steps"] == 4
    full = load_model(tmp_path / "full")
    plain_runs = json.loads((tmp_path / "plain" / "summary.json").read_text())["per_rank"]
    layout = Layout(2, 2, 1)
    for rank, (ours, theirs) in enumerate(zip(s["per_rank"], plain_runs, strict=True)):
        d, stage, _ = layout.coords(rank)
        per_step = theirs["bytes_by_op"]["dp_allreduce"] // 6  # 2·(W−1)/W·4N = 4N at W=2
        assert ours["bytes_by_op"]["dp_allreduce"] == 2 * per_step  # the warm-up only
        ts = TwoStage(stage_sizes(full, per_step // 4, stage == 0), 2, d)
        bufs = ts.encode_chunks(torch.randn(ts.total))
        assert ours["bytes_by_op"]["onebit"] == 4 * (bufs[1 - d].numel() + bufs[d].numel())
        assert ours["bytes_by_op"]["onebit_sizes"] == 4 * (2 * 8 + 8)  # W sizes, then one
        assert bufs[0].numel() + bufs[1].numel() < per_step / 16  # the drop, headers and scales in
        others = {op: n for op, n in ours["bytes_by_op"].items() if op not in DP_OPS}
        assert others == {op: n for op, n in theirs["bytes_by_op"].items() if op not in DP_OPS}
    cut_back(tmp_path / "full", tmp_path / "part", 3)
    polytrain.train(resume=str(tmp_path / "part"))
    part = load_model(tmp_path / "part")
    assert all(torch.equal(part[k], full[k]) for k in full)
