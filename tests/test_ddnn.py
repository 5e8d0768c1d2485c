"""`ddnn`: a sample leaves at the first exit whose normalised entropy is below the threshold;
training runs over real cloud/edge/device ranks; accuracy with end devices missing is reported."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import polytrain
from polytrain.config import load_config
from polytrain.errors import ConfigError
from polytrain.strategies import make_strategy
from polytrain.strategies.hybrid.ddnn_net import exits_here, normalized_entropy, strips


def test_exit_decisions_follow_the_threshold() -> None:
    uniform = torch.zeros(1, 10)
    sure = torch.tensor([[10.0] + [0.0] * 9])
    mixed = torch.tensor([[1.0, 0.0] + [0.0] * 8])
    assert normalized_entropy(uniform).item() == pytest.approx(1.0)
    h = normalized_entropy(torch.cat([sure, mixed]))
    assert 0 < h[0] < h[1] < 1
    logits = torch.cat([uniform, sure, mixed])
    assert exits_here(logits, 0.0).tolist() == [False, False, False]  # 0: never early
    assert exits_here(logits, 0.999).tolist() == [False, True, True]  # uniform: entropy 1
    middle = float((h[0] + h[1]) / 2)
    assert exits_here(logits, middle).tolist() == [False, True, False]
    p = torch.softmax(mixed, -1)
    assert h[1] == pytest.approx(float(-(p * p.log()).sum() / math.log(10)))


def test_devices_see_strips_covering_the_image() -> None:
    assert strips(8, 3) == [(0, 3), (3, 6), (6, 8)]


@pytest.mark.slow
def test_ddnn_trains_across_tiers_and_reports_missing_devices(tmp_path: Path) -> None:
    out = tmp_path / "ddnn"
    summary = polytrain.train(strategy="ddnn", procs=4, steps=40, optimizer="adam", lr=3e-3,
                              batch_size=32, out=str(out), sets=["threshold=0.4"])
    m = summary["strategy_metrics"]
    assert summary["per_rank"][0]["role"] == "cloud" and summary["per_rank"][3]["role"] == "device1"
    for key in ("exit_fractions", "missing_exit_fractions"):
        assert sum(m[key].values()) == pytest.approx(1.0)
    assert m["missing_devices"] == [1] and 0 <= m["missing_accuracy"] <= 1
    assert summary["eval"]["accuracy"] > 0.3  # 40 steps on digits; chance is 0.1
    # training: every sample's features cross both links every step
    assert m["train_bytes_by_tier"]["devices"] > m["train_bytes_by_tier"]["cloud"] > 0
    # inference: what went up depends on how many samples exited below
    inf = m["inference_bytes_by_tier"]
    assert inf["devices"] > 0 and inf["edge"] > 0
    if m["exit_fractions"]["cloud"] == 0 and m["missing_exit_fractions"]["cloud"] == 0:
        assert inf["cloud"] == 0


def test_ddnn_checks_its_layout() -> None:
    cfg = load_config(overrides={"strategy": "ddnn", "dataset": "digits"})
    with pytest.raises(ConfigError, match=r"--procs 3 or more \(got 2\)"):
        make_strategy("ddnn", {}).check(cfg, 2)
    with pytest.raises(ConfigError, match=r"missing='0,1' with 2 end devices"):
        make_strategy("ddnn", {"missing": "0,1"}).check(cfg, 4)
    # one end device: the default 'last' would switch it off too — refused before any process starts
    with pytest.raises(ConfigError, match=r"missing='last' with 1 end device .* Fix: --set missing=none"):
        make_strategy("ddnn", {}).check(cfg, 3)
    make_strategy("ddnn", {"missing": "none"}).check(cfg, 3)
    with pytest.raises(ConfigError, match=r"weights are three non-negative numbers"):
        make_strategy("ddnn", {"weights": "1,2"})
