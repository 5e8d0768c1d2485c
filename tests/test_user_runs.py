"""Tier 3: users' own models, losses and datasets in real multi-process runs; oracle: equal to
single-process training."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import polytrain
from polytrain.errors import ConfigError
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


RESNET = {"model": "userzoo.resnet:resnet18", "dataset": "synthetic-images",
          "data_options": {"size": 16, "train": 256, "test": 64},
          "model_options": {"width": 4}}
UNTIED = {**GPT, "model": "userzoo.nanogpt:UntiedGPT",
          "model_options": {**GPT["model_options"], "split": "transformer.h.1"}}


def test_resnet18_allreduce_equals_single(tmp_path: Path) -> None:
    """GroupNorm: data-parallel BatchNorm normalises each rank's part (as DDP does without
    SyncBatchNorm), so only a per-sample norm makes W ranks equal one process."""
    job = {**RESNET, "model_options": {"width": 4, "norm": "group"}}
    train(tmp_path / "single", "single", 1, **job)
    train(tmp_path / "ar", "allreduce", 2, **job)
    assert_same_params(load_model(tmp_path / "ar"), load_model(tmp_path / "single"))


def test_resnet18_gpipe_split_auto_equals_single_at_one_microbatch(tmp_path: Path) -> None:
    """With M > 1 BatchNorm would see micro-batch statistics (as in GPipe); M = 1 is exact."""
    job = {**RESNET, "model_options": {"width": 4, "split": "auto"}}
    train(tmp_path / "single", "single", 1, **job)
    train(tmp_path / "gp", "gpipe", 2, options={"microbatches": 1}, **job)
    assert_same_params(load_model(tmp_path / "gp"), load_model(tmp_path / "single"))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_traced_gpt_pipeline_equals_single_after_20_steps(tmp_path: Path, schedule: str) -> None:
    common = {**UNTIED, "steps": 20, "batch_size": 8, "seed": 3, "optimizer": "sgd", "lr": 0.1}
    polytrain.train(strategy="single", procs=1, out=str(tmp_path / "single"), **common)
    polytrain.train(strategy=schedule, procs=2, out=str(tmp_path / "pp"),
                    options={"microbatches": 4}, **common)
    a, b = step_losses(tmp_path / "pp"), step_losses(tmp_path / "single")
    assert len(a) == 20
    for s in a:
        assert a[s] == pytest.approx(b[s], abs=1e-5)


def test_tied_gpt_split_refused_before_launch(tmp_path: Path) -> None:
    job = {**GPT, "model_options": {**GPT["model_options"], "split": "transformer.h.1"}}
    with pytest.raises(ConfigError, match="tied weights"):
        train(tmp_path / "pp", "gpipe", 2, **job)
    assert not (tmp_path / "pp").exists()
