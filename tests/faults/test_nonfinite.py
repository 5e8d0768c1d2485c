"""Divergence is never silent: every numeric option is checked for finiteness and range before
launch, a run whose parameters go non-finite stops with the step named, keeps its last good
checkpoint and fails; JSON written by polytrain always parses (null, never NaN)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import polytrain
from polytrain.config import load_config
from polytrain.errors import ConfigError, RankFailure
from polytrain.metrics.jsonsafe import atomic_json, json_safe
from polytrain.runtime.checkpoint import CheckpointStore

BAD = [("lr", v) for v in (math.nan, math.inf, 0.0, -1.0)] + \
      [("momentum", v) for v in (math.nan, math.inf, -0.1, 1.0)] + \
      [("weight_decay", v) for v in (math.nan, math.inf, -1.0)] + \
      [("timeout_s", v) for v in (math.nan, math.inf, 0.0, -5.0)] + \
      [("epochs", v) for v in (math.nan, math.inf, 0.0, -1.0)] + \
      [("slow_factor", v) for v in (math.nan, math.inf, 0.5)] + \
      [("steps", v) for v in (0, -1)] + [("batch_size", v) for v in (0, -4)] + \
      [("procs", v) for v in (0, -2)] + [("eval_every", -1), ("checkpoint_every", -1),
                                         ("keep_checkpoints", 0), ("seed", -1)]


@pytest.mark.parametrize(("field", "value"), BAD)
def test_every_numeric_option_is_checked_before_launch(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=field):
        load_config(overrides={field: value})


@pytest.mark.parametrize("bucket", ["servers", "model.width", "data.noise"])
def test_non_finite_strategy_model_and_data_options_are_refused(bucket: str) -> None:
    with pytest.raises(ConfigError, match="must be finite"):
        load_config(sets=[f"{bucket}=nan"])
    with pytest.raises(ConfigError, match="must be finite"):
        load_config(sets=[f"{bucket}=inf"])


def test_json_written_by_polytrain_parses_strictly(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    atomic_json(path, {"loss": math.nan, "per_rank": [{"x": math.inf}], "ok": 1.5})
    data = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"bare {c} in JSON"))
    assert data == {"loss": None, "per_rank": [{"x": None}], "ok": 1.5}
    assert json_safe((1.0, -math.inf)) == [1.0, None]


@pytest.mark.slow
def test_a_diverging_run_stops_names_the_step_and_keeps_the_last_good_checkpoint(
        tmp_path: Path) -> None:
    out = tmp_path / "run"
    with pytest.raises(RankFailure, match=r"diverged at step (\d+)") as err:
        polytrain.train(strategy="single", procs=1, model="mlp", optimizer="sgd", lr=1e3, steps=30,
                        checkpoint_every=1, divergence_factor=0, max_param=0,  # the NaN check alone
                        out=str(out))
    step = int(str(err.value).split("diverged at step ")[1].split(":")[0])
    assert 1 < step < 30
    store = CheckpointStore(out / "checkpoints", "")
    latest = out / "checkpoints" / (out / "checkpoints" / "LATEST").read_text().strip()
    assert store.step_of(latest) == step - 1  # the step that diverged wrote nothing
    state = store.load_rank(latest, 0)
    assert all(torch.isfinite(t).all() for t in state["model"].values())
    for line in (out / "ranks" / "rank0.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c} in metrics"))


@pytest.mark.slow
def test_divergence_on_two_ranks_fails_the_launch(tmp_path: Path) -> None:
    same_step = r"rank \d failed at step (\d+): DivergedError: training diverged at step \1"
    with pytest.raises(RankFailure, match=same_step):
        polytrain.train(model="mlp", optimizer="sgd", lr=1e30, steps=20, out=str(tmp_path / "r"))


def test_skip_is_refused_where_ranks_could_not_skip_the_same_steps() -> None:
    from polytrain.launch.prepare import prepare

    with pytest.raises(ConfigError, match="--on-nonfinite skip is honoured by single, allreduce"):
        prepare(load_config(overrides={"strategy": "gpipe", "model": "mlp", "on_nonfinite": "skip"}))
    with pytest.raises(ConfigError, match="on_nonfinite"):
        load_config(overrides={"on_nonfinite": "ignore"})


SPIKE = '''
import os
import torch
from torch import nn

class Spike(nn.Module):
    """Rank 1's output is NaN in its 3rd forward (step 3)."""
    def __init__(self):
        super().__init__()
        self.calls = 0
    def forward(self, x):
        self.calls += 1
        if os.environ.get("RANK") == "1" and self.calls == 3:
            return x * float("nan")
        return x

def make():
    return [nn.Flatten(), nn.Linear(64, 16), Spike(), nn.ReLU(), nn.Linear(16, 10)]
'''


@pytest.mark.slow
def test_skip_drops_the_same_step_on_every_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A NaN on rank 1 only: the all-reduce the step already does carries it to rank 0, so both
    ranks skip step 3 (no extra message) and the run ends with finite parameters."""
    (tmp_path / "spike.py").write_text(SPIKE)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    summary = polytrain.train(strategy="allreduce", procs=2, model="spike:make", optimizer="sgd",
                              lr=0.1, steps=5, on_nonfinite="skip", out=str(out))
    assert summary["skipped_steps"] == [3] and summary["steps_run"] == 5
    events = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert sorted((e["rank"], e["step"]) for e in events if e["event"] == "skipped") == [(0, 3), (1, 3)]
    model = torch.load(out / "model.pt", weights_only=True)
    assert all(torch.isfinite(v).all() for v in model.values())
