"""``local-sgd``: the averaging schedule (tier 1) and real runs (tier 3). Oracles: period=1 with
SGD equals single-process training (hence ``allreduce``); one-shot averaging (period=0) equals an
in-process simulation of W independent replicas averaged once at the end."""

from __future__ import annotations

from pathlib import Path

import pytest

import polytrain
from polytrain.config import make_config
from polytrain.errors import ConfigError
from polytrain.strategies import make_strategy
from polytrain.strategies.data.local_sgd import averages_after, ring_bytes
from tests.conftest import assert_same_params, load_model, step_losses
from tests.test_ps_oracles import local_sgd_mixer, reference, replicas

COMMON = {"model": "mlp", "dataset": "digits", "steps": 6, "batch_size": 24, "seed": 11,
          "optimizer": "sgd", "lr": 0.2}


def test_schedule() -> None:
    assert [s for s in range(1, 11) if averages_after(s, 10, period=4, warmup=0)] == [4, 8, 10]
    assert [s for s in range(1, 11) if averages_after(s, 10, period=4, warmup=2)] == [1, 2, 4, 8, 10]
    assert [s for s in range(1, 11) if averages_after(s, 10, period=0, warmup=0)] == [10]
    assert ring_bytes(1000, 4, 3) == 3 * 2 * 3 * 1000 * 4 // 4 and ring_bytes(10, 1, 5) == 0


def test_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="period"):
        make_strategy("local-sgd", {"period": -1})
    cfg = make_config({"strategy": "local-sgd", "procs": 5, "batch_size": 24})
    with pytest.raises(ConfigError, match="multiple of 5"):
        make_strategy("local-sgd", {}).check(cfg, 5)


@pytest.mark.slow
def test_period_1_equals_single(tmp_path: Path) -> None:
    out = tmp_path / "p1"
    summary = polytrain.train(strategy="local-sgd", procs=2, out=str(out), sets=["period=1"], **COMMON)
    ref, ref_losses = reference(COMMON)
    assert_same_params(load_model(out), ref)
    ours = step_losses(out)
    assert all(ours[s] == pytest.approx(ref_losses[s], rel=1e-5, abs=1e-6) for s in ref_losses)
    m = summary["strategy_metrics"]
    assert m["averages"] == 6 and m["bytes_per_worker"] == m["allreduce_bytes_per_worker"]


@pytest.mark.slow
def test_one_shot_averaging(tmp_path: Path) -> None:
    out = tmp_path / "p0"
    summary = polytrain.train(strategy="local-sgd", procs=2, out=str(out), sets=["period=0"], **COMMON)
    sim, sim_losses = replicas(COMMON, 2, local_sgd_mixer(6, period=0, warmup=0))
    assert_same_params(load_model(out), sim)
    ours = step_losses(out)
    assert all(ours[s] == pytest.approx(sim_losses[s], rel=1e-5, abs=1e-6) for s in sim_losses)
    m = summary["strategy_metrics"]
    assert m["averages"] == 1 and m["bytes_vs_allreduce"] == pytest.approx(1 / 6, rel=1e-3)
