"""Tier 3: real processes, real gloo. The oracle: allreduce on W ranks equals single-process
training on the same global batches — parameters and per-step losses."""

from __future__ import annotations

from pathlib import Path

import pytest

import polytrain
from tests.conftest import assert_same_params, load_model, read_summary, step_losses

COMMON = {"model": "cnn", "dataset": "digits", "steps": 6, "batch_size": 32, "seed": 5}


@pytest.fixture(scope="module")
def single_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("single")
    out = {}
    for opt, lr in (("sgd", 0.1), ("adam", 1e-3)):
        out[opt] = root / opt
        polytrain.train(strategy="single", procs=1, optimizer=opt, lr=lr, out=str(out[opt]), **COMMON)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("procs,opt,lr", [(2, "sgd", 0.1), (4, "sgd", 0.1), (2, "adam", 1e-3)])
def test_allreduce_equals_single(single_runs: dict[str, Path], tmp_path: Path, procs: int,
                                 opt: str, lr: float) -> None:
    out = tmp_path / f"ar{procs}"
    summary = polytrain.train(strategy="allreduce", procs=procs, optimizer=opt, lr=lr, out=str(out),
                              **COMMON)
    ref = single_runs[opt]
    assert_same_params(load_model(out), load_model(ref))
    ours, theirs = step_losses(out), step_losses(ref)
    assert list(ours) == list(range(1, 7))
    for s in ours:
        assert ours[s] == pytest.approx(theirs[s], rel=1e-5, abs=1e-6)
    # the figures the run directory promises
    assert summary["world_size"] == procs and summary["samples"] == 6 * 32
    n_params = sum(t.numel() for t in load_model(out).values())
    # every step all-reduces the whole gradient once: ring traffic 2(W-1)/W per rank, summed
    assert summary["bytes_sent"] == pytest.approx(6 * 2 * (procs - 1) * n_params * 4, rel=0.01)
    assert len(summary["per_rank"]) == procs
    assert summary["per_rank"][1]["bytes_by_op"]["allreduce"] > 0
    assert read_summary(out)["strategy"] == "allreduce"


@pytest.mark.slow
def test_batch_norm_buffers_broadcast_counted(tmp_path: Path) -> None:
    """A model with buffers (VGG-16-BN): rank 0's BatchNorm statistics reach every rank before each
    training forward, as DDP's default does, but through the accounted comm: the bytes are counted
    where sent (op ``buffers``: one float32 and one int64 broadcast per step to the other rank)."""
    from polytrain.models.vgg import BLOCKS

    out = tmp_path / "bn"
    summary = polytrain.train(strategy="allreduce", procs=2, model="vgg16", dataset="synthetic-images",
                              steps=3, batch_size=8, optimizer="sgd", lr=0.01, out=str(out),
                              sets=["model.width=2", "model.batch_norm=true"])
    channels = sum(m * 2 for block in BLOCKS for m in block)
    per_step = 2 * channels * 4 + len([m for b in BLOCKS for m in b]) * 8  # mean+var, batches seen
    assert summary["per_rank"][0]["bytes_by_op"]["buffers"] == 3 * per_step
    state = load_model(out)
    assert sum(k.endswith("running_var") for k in state) == 13
    assert int(state["conv1_1.1.num_batches_tracked"]) == 3
