"""Model parallelism, tier 3 (real processes): `alexnet-2col` and `layerwise` equal single-process
training of the same network — per-step losses and parameters (model.pt, full shapes)."""

from __future__ import annotations

from pathlib import Path

import pytest

import polytrain
from polytrain.config import load_config
from polytrain.errors import ConfigError
from polytrain.strategies import make_strategy
from polytrain.strategies.pipeline.activations_wire import HEADER
from tests.conftest import assert_same_params, load_model, step_losses
from tests.test_model_parallel_refs import ALEXNET, MLP, single_reference


def assert_same_run(out: Path, ref: Path, steps: int = 3) -> None:
    assert_same_params(load_model(out), load_model(ref))
    ours, theirs = step_losses(out), step_losses(ref)
    assert list(ours) == list(range(1, steps + 1))
    for s in ours:
        assert ours[s] == pytest.approx(theirs[s], rel=1e-5, abs=1e-6)


@pytest.mark.slow
def test_alexnet_2col_equals_single(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    ref = single_reference(tmp_path_factory, ALEXNET)
    out = tmp_path / "2col"
    summary = polytrain.train(strategy="alexnet-2col", procs=2, out=str(out), **ALEXNET)
    assert_same_run(out, ref)
    m = summary["strategy_metrics"]
    assert m["exchange_points"] == ["conv3", "fc1", "fc2", "fc3"]
    # forward: 4 exchanges + the logits; backward: 4 reduce-scatters (the logits' is local)
    assert m["exchange_collectives_per_step"] == 9
    for rec in summary["per_rank"]:
        assert set(rec["bytes_by_op"]) == {"exchange", "eval_exchange", "gather_model"}
    assert summary["eval"]["accuracy"] >= 0


def test_alexnet_2col_refuses_other_models_and_world_sizes() -> None:
    strategy = make_strategy("alexnet-2col", {})
    cfg = load_config(overrides={"strategy": "alexnet-2col", "model": "alexnet", "dataset": "digits"},
                      sets=["model.width=12"])
    with pytest.raises(ConfigError, match=r"exactly 2 processes \(got --procs 4\)"):
        strategy.check(cfg, 4)
    other = load_config(overrides={"strategy": "alexnet-2col", "model": "cnn", "dataset": "digits"})
    with pytest.raises(ConfigError, match=r"not --model cnn.*--model alexnet"):
        strategy.check(other, 2)


@pytest.mark.slow
def test_layerwise_equals_single_and_reports_utilisation(tmp_path_factory: pytest.TempPathFactory,
                                                         tmp_path: Path) -> None:
    ref = single_reference(tmp_path_factory, MLP)
    out = tmp_path / "layerwise"
    summary = polytrain.train(strategy="layerwise", procs=2, out=str(out), **MLP)
    assert_same_run(out, ref)
    m = summary["strategy_metrics"]
    assert m["partition"]["counts"] == [2, 2]  # fc1 fc2 | fc3 head
    assert len(m["utilisation_per_rank"]) == 2
    assert all(0 < u < 1 for u in m["utilisation_per_rank"])
    ops = [rec["bytes_by_op"] for rec in summary["per_rank"]]
    # activations flow 0 -> 1, gradients 1 -> 0: (B, 32) float32 per step (the executor's wire)
    hop = 3 * (MLP["batch_size"] * 32 * 4 + HEADER)  # + the trailer of each message
    assert ops[0]["activation"] == ops[1]["gradient"] == hop
    assert "gradient" not in ops[0] and "activation" not in ops[1]


def test_layerwise_partition_is_validated() -> None:
    with pytest.raises(ConfigError, match=r"Cannot read partition 'two'"):
        make_strategy("layerwise", {"partition": "two"})
    strategy = make_strategy("layerwise", {"partition": "2,2"})
    cfg = load_config(overrides={"strategy": "layerwise", "model": "mlp", "dataset": "digits"})
    strategy.check(cfg, 2)
    with pytest.raises(ConfigError, match=r"partition=2,2 has 2 stages .* for --procs 3"):
        strategy.check(cfg, 3)


def test_layerwise_refuses_more_ranks_than_layers_before_any_process() -> None:
    """One stage per rank: the cnn's 4 layers run on at most 4 ranks, refused in `check` (before the
    launcher starts anything), not by every rank at its first step."""
    strategy = make_strategy("layerwise", {})
    cfg = load_config(overrides={"strategy": "layerwise", "model": "cnn", "dataset": "digits"})
    strategy.check(cfg, 4)
    with pytest.raises(ConfigError, match=r"has 4 layer\(s\) but the pipeline needs at least one per "
                                          r"stage \(5 stages\).*Fix: use --procs 4 or fewer"):
        strategy.check(cfg, 5)
