"""Tier 3: users' own models, losses and datasets in real multi-process runs; oracle: equal to
single-process training."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import polytrain
from tests.conftest import assert_same_params, load_model, step_losses

pytestmark = pytest.mark.slow

GPT = {"model": "userzoo.nanogpt:GPT", "dataset": "chars",
       "data_options": {"seq_len": 16, "chars": 4000},
       "model_options": {"n_layer": 2, "n_head": 2, "n_embd": 16}}
CASES: dict[str, dict[str, Any]] = {
    "factory": {"model": "userzoo.factories:make", "model_options": {"width": 16},
                "loss": "userzoo.factories:smooth_loss"},
    "gpt": GPT,
    "dataset": {"model": "userzoo.factories:blob_mlp", "dataset": "userzoo.factories:blobs"},
}


def train(out: Path, strategy: str, procs: int, **job: Any) -> dict[str, Any]:
    return polytrain.train(strategy=strategy, procs=procs, steps=5, batch_size=16, optimizer="sgd",
                           lr=0.1, seed=2, out=str(out), **job)


@pytest.mark.parametrize("case", sorted(CASES))
def test_user_jobs_allreduce_equal_single(tmp_path: Path, case: str) -> None:
    ref = train(tmp_path / "single", "single", 1, **CASES[case])
    ours = train(tmp_path / "ar", "allreduce", 2, **CASES[case])
    assert_same_params(load_model(tmp_path / "ar"), load_model(tmp_path / "single"))
    a, b = step_losses(tmp_path / "ar"), step_losses(tmp_path / "single")
    assert list(a) == [1, 2, 3, 4, 5]
    for s in a:
        assert a[s] == pytest.approx(b[s], rel=1e-5, abs=1e-6)
    assert ours["final_loss"] == pytest.approx(ref["final_loss"], rel=1e-5)
    assert ours["eval"]["loss"] == pytest.approx(ref["eval"]["loss"], rel=1e-4)
