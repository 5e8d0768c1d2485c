"""``--grad-accum K`` (issue 45 item 2). Oracle: K micro-steps of B/K samples equal one step of B
(SGD, fp32); the multi-process runs of each strategy are in test_training_runs.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from polytrain.config import make_config
from polytrain.errors import ConfigError
from polytrain.launch.prepare import prepare
from polytrain.runtime.accumulate import accumulate
from polytrain.runtime.job import Job
from tests.conftest import assert_same_params

MLP: dict[str, Any] = {"model": "mlp", "model_options": {"hidden": 16}, "dataset": "digits",
                       "batch_size": 16, "steps": 4, "seed": 6, "optimizer": "sgd", "lr": 0.2}


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
        prepare(make_config(MLP | {"strategy": "malt", "procs": 2, "grad_accum": 2}))
