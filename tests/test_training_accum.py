"""``--grad-accum K`` (issue 45 item 2). Oracle: K micro-steps of B/K samples equal one step of B
(SGD, fp32) for every synchronous strategy that accepts it; data parallelism all-reduces once
per optimizer step, not K times."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import polytrain
from polytrain.config import make_config
from polytrain.errors import ConfigError
from polytrain.launch.prepare import prepare
from polytrain.runtime.accumulate import accumulate
from polytrain.runtime.job import Job
from tests.conftest import assert_same_params, load_model, step_losses

MLP: dict[str, Any] = {"model": "mlp", "model_options": {"hidden": 16}, "dataset": "digits",
                       "batch_size": 16, "steps": 4, "seed": 6, "optimizer": "sgd", "lr": 0.2}
GPT: dict[str, Any] = {"model": "gpt-mini", "dataset": "chars", "batch_size": 8, "steps": 3,
                       "seed": 6, "optimizer": "sgd", "lr": 0.2,
                       "model_options": {"n_layer": 1, "n_head": 2, "d_model": 16},
                       "data_options": {"seq_len": 16, "chars": 20_000}}


def _reference(cfg: dict[str, Any], k: int = 1) -> tuple[dict[str, torch.Tensor], list[float]]:
    """The job on one process, ``k`` micro-steps per step through the same helper."""
    job = Job.from_config(make_config(cfg))
    model = job.build_model()
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"])
    batches, losses = job.batches(), []
    for i in range(1, cfg["steps"] + 1):
        x, y = batches.shard(i)
        opt.zero_grad()
        losses.append(accumulate(model, x, y, k, job.forward_loss, lambda t: t.backward()))
        opt.step()
    return dict(model.state_dict()), losses


def test_k_micro_steps_equal_one_batch_in_process() -> None:
    whole, whole_losses = _reference(MLP)
    for k in (2, 4, 16):
        parts, part_losses = _reference(MLP, k)
        assert_same_params(parts, whole, atol=1e-6, rtol=1e-5)
        assert part_losses == pytest.approx(whole_losses, rel=1e-6)


def test_bad_accumulation_refused_before_launch() -> None:
    with pytest.raises(ConfigError, match="--grad-accum 3 must divide --batch-size 16"):
        make_config(MLP | {"grad_accum": 3})
    with pytest.raises(ConfigError, match=r"--batch-size must be a multiple of 16 \(got 8\)"):
        prepare(make_config(MLP | {"strategy": "allreduce", "procs": 2, "batch_size": 8,
                                   "grad_accum": 8}))
    with pytest.raises(ConfigError, match=r"does not support grad_accum \(--grad-accum 2\).*"
                                          r"that does: .*allreduce"):
        prepare(make_config(MLP | {"strategy": "local-sgd", "procs": 2, "grad_accum": 2}))


@pytest.fixture(scope="module")
def mlp_reference() -> dict[str, torch.Tensor]:
    return _reference(MLP)[0]


@pytest.mark.slow
@pytest.mark.parametrize("strategy,procs,sets", [
    ("single", 1, []), ("allreduce", 2, []), ("gpipe", 2, ["microbatches=2"]), ("1f1b", 2, []),
    ("layerwise", 2, []), ("mesh", 4, ["dp=2", "pp=2"]),
])
def test_accumulation_equals_the_whole_batch(mlp_reference: dict[str, torch.Tensor], tmp_path: Path,
                                             strategy: str, procs: int, sets: list[str]) -> None:
    out = tmp_path / strategy
    summary = polytrain.train(**(MLP | {"strategy": strategy, "procs": procs, "grad_accum": 2,
                                        "out": str(out), "sets": sets}))
    assert_same_params(load_model(out), mlp_reference, atol=1e-6, rtol=1e-5)
    assert list(step_losses(out)) == [1, 2, 3, 4] and summary["samples"] == 4 * 16
    if strategy == "allreduce":  # no_sync: one gradient all-reduce per optimizer step, not two
        n_params = sum(t.numel() for t in mlp_reference.values())
        assert summary["bytes_sent"] == pytest.approx(4 * 2 * n_params * 4, rel=0.01)


@pytest.mark.slow
def test_tensor_accumulation_equals_the_whole_batch(tmp_path: Path) -> None:
    out = tmp_path / "tensor"
    polytrain.train(**(GPT | {"strategy": "tensor", "procs": 2, "grad_accum": 2, "out": str(out)}))
    assert_same_params(load_model(out), _reference(GPT)[0], atol=1e-6, rtol=1e-5)
