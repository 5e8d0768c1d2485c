"""What accumulation and clipping mean on the strategies without one synchronous gradient
(issue 45 item 9): per worker where simple and right, else refused before launch with the reason.

``ps`` (bsp) and ``local-sgd`` (period 1) clip each worker's gradient by its own norm and
accumulate K micro-batches of its rows: with SGD both equal one step on the mean of the W
individually clipped gradients, computed here in one process with torch's ``clip_grad_norm_``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import polytrain
from polytrain.config import make_config
from polytrain.errors import ConfigError
from polytrain.launch.prepare import prepare
from polytrain.runtime.job import Job
from polytrain.strategies.describe import describe_strategy
from tests.conftest import assert_same_params, load_model

MAX_NORM = 0.1
JOB: dict[str, Any] = {"model": "mlp", "model_options": {"hidden": 16}, "dataset": "digits",
                       "batch_size": 16, "steps": 3, "optimizer": "sgd", "lr": 0.2, "seed": 4,
                       "clip_grad_norm": MAX_NORM, "grad_accum": 2, "report": False}


def per_worker_reference(workers: int) -> dict[str, torch.Tensor]:
    """SGD on the mean of the workers' gradients, each clipped by its own norm."""
    job = Job.from_config(make_config({k: v for k, v in JOB.items() if k != "report"}))
    model, batches = job.build_model(), job.batches()
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=JOB["lr"])
    for i in range(1, job.steps + 1):
        total = [torch.zeros_like(p) for p in params]
        for w in range(workers):
            x, y = batches.shard(i, w, workers)
            model.zero_grad()
            job.forward_loss(model, x, y).backward()
            assert torch.nn.utils.clip_grad_norm_(params, MAX_NORM) > 1.5 * MAX_NORM  # it clips
            for t, p in zip(total, params, strict=True):
                t += p.grad
        for t, p in zip(total, params, strict=True):
            p.grad = t / workers
        opt.step()
    return dict(model.state_dict())


@pytest.mark.slow
@pytest.mark.parametrize("strategy,procs,sets", [
    ("ps", 3, ["servers=1", "consistency=bsp"]),  # 2 workers push clipped gradients; bsp: their mean
    ("local-sgd", 2, ["period=1"]),  # each clips its local gradient; the average after every step
])
def test_per_worker_clipping_and_accumulation(tmp_path: Path, strategy: str, procs: int,
                                              sets: list[str]) -> None:
    out = tmp_path / strategy
    polytrain.train(**(JOB | {"strategy": strategy, "procs": procs, "sets": sets, "out": str(out)}))
    assert_same_params(load_model(out), per_worker_reference(2), atol=1e-6, rtol=1e-5)


def test_each_strategy_says_what_it_means_or_why_it_refuses() -> None:
    training = dict(describe_strategy("ps")["training"])
    assert training["clip"].startswith("per worker, per push")
    assert training["grad_accum"].startswith("per worker")
    assert dict(describe_strategy("local-sgd")["training"])["clip"].startswith("per worker")
    assert dict(describe_strategy("1f1b")["training"])["clip"] == "yes"  # the global norm
    refusals = {  # strategy -> (feature, config) -> words of its reason
        ("pipedream", "clip_grad_norm", 1.0): "updates each stage after every backward",
        ("spectrain", "grad_accum", 2): "weight versions are per",
        ("hogwild", "clip_grad_norm", 1.0): "by its own norm before its write",
        ("malt", "grad_accum", 2): "per worker",
        ("sandblaster", "clip_grad_norm", 1.0): "curvature pairs",
        ("ps", "precision", "fp16"): "skip a push on overflow",
    }
    for (strategy, key, value), words in refusals.items():
        cfg = {"strategy": strategy, "procs": 3, "model": "mlp", "optimizer": "sgd", key: value}
        with pytest.raises(ConfigError, match=f"Strategy '{strategy}' does not support .*{words}"):
            prepare(make_config(cfg))
