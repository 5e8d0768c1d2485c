"""``--set collective=ring``: refused on one rank before launch; training through the ring equals
training through the backend's all-reduce, and the timeline shows the ring's 2(W−1) phases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import polytrain
from polytrain.config import make_config
from polytrain.errors import ConfigError
from polytrain.launch.prepare import prepare
from polytrain.strategies import make_strategy
from tests.conftest import assert_same_params, load_model

COMMON = {"model": "mlp", "dataset": "digits", "steps": 3, "batch_size": 24, "seed": 3,
          "optimizer": "sgd", "lr": 0.1}


@pytest.mark.parametrize("strategy", ["allreduce", "local-sgd"])
def test_ring_on_one_rank_is_refused_before_launch(strategy: str) -> None:
    cfg = make_config({"strategy": strategy, "procs": 1, "options": {"collective": "ring"}})
    with pytest.raises(ConfigError, match=r"collective=ring needs world size >= 2.*builtin, ring"):
        prepare(cfg)
    with pytest.raises(ConfigError, match="builtin"):
        make_strategy(strategy, {"collective": "star"})


def _ring_spans(run: Path) -> list[dict[str, object]]:
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [e for e in events if e["event"] == "span" and str(e["name"]).startswith("ring ")]


@pytest.mark.slow
@pytest.mark.parametrize("strategy,options", [("allreduce", {}), ("local-sgd", {"period": 2}),
                                              ("mesh", {"dp": 2})])
def test_ring_training_equals_builtin(tmp_path: Path, strategy: str, options: dict[str, int]) -> None:
    runs = {}
    for coll in ("builtin", "ring"):
        runs[coll] = tmp_path / coll
        polytrain.train(strategy=strategy, procs=2, out=str(runs[coll]),
                        sets=[f"{k}={v}" for k, v in {**options, "collective": coll}.items()],
                        **COMMON)
    assert_same_params(load_model(runs["ring"]), load_model(runs["builtin"]))
    spans = [s for s in _ring_spans(runs["ring"]) if s["rank"] == 0]
    phases = {str(s["name"]) for s in spans}
    assert phases == {f"ring {k} 0" for k in ("reduce-scatter", "all-gather")}  # 2(W-1) phases, W=2
    assert not _ring_spans(runs["builtin"])
