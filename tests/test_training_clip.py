"""``--clip-grad-norm X`` (issue 45 item 3): the global norm over the whole model, however its
gradient is split. Oracle: every strategy that accepts it ends with the parameters of
``torch.nn.utils.clip_grad_norm_`` on the single-process model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import polytrain
from polytrain.config import make_config
from polytrain.errors import ConfigError
from polytrain.launch.prepare import prepare
from polytrain.runtime.clip import GradSplit, clip_grad_norm, squared_norm
from polytrain.runtime.job import Job
from tests.conftest import assert_same_params, load_model

MAX_NORM = 0.3  # below every step's gradient norm on these jobs (asserted), so every step clips
MLP: dict[str, Any] = {"model": "mlp", "model_options": {"hidden": 16}, "dataset": "digits",
                       "batch_size": 16, "steps": 5, "seed": 4, "optimizer": "sgd", "lr": 0.2,
                       "clip_grad_norm": MAX_NORM}
GPT: dict[str, Any] = {"model": "gpt-mini", "dataset": "chars", "batch_size": 8, "steps": 3,
                       "seed": 4, "optimizer": "sgd", "lr": 0.2, "clip_grad_norm": MAX_NORM,
                       "model_options": {"n_layer": 1, "n_head": 2, "d_model": 16},
                       "data_options": {"seq_len": 16, "chars": 20_000}}


def _grads(seed: int) -> list[nn.Parameter]:
    torch.manual_seed(seed)
    params = [nn.Parameter(torch.randn(5, 3)), nn.Parameter(torch.randn(7)), nn.Parameter(torch.randn(2))]
    for p in params:
        p.grad = torch.randn_like(p) * 3
    return params


def test_equals_torch_on_one_process() -> None:
    ours, theirs = _grads(0), _grads(0)
    n = clip_grad_norm(ours, 1.0)
    assert n == pytest.approx(float(torch.nn.utils.clip_grad_norm_(theirs, 1.0)), rel=1e-6)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=0)


def test_shares_of_split_gradients_add_up_to_the_whole() -> None:
    """Rank A holds params 0 and 2, rank B params 1 and 2 (2 replicated: counted half on each)."""
    p = _grads(1)
    shared = {id(p[2]): 2}
    a = squared_norm([p[0], p[2]], GradSplit(copies=shared))
    b = squared_norm([p[1], p[2]], GradSplit(copies=shared))
    whole = torch.nn.utils.get_total_norm([q.grad for q in p])  # type: ignore[misc]
    assert float((a + b).sqrt()) == pytest.approx(float(whole), rel=1e-6)


def _reference(cfg: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The job on one process with torch's clip_grad_norm_ (each step must clip)."""
    job = Job.from_config(make_config(cfg))
    model = job.build_model()
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"])
    batches = job.batches()
    for i in range(1, cfg["steps"] + 1):
        x, y = batches.shard(i)
        opt.zero_grad()
        job.forward_loss(model, x, y).backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        assert norm > 2 * MAX_NORM, "the oracle needs steps that clip"
        opt.step()
    return dict(model.state_dict())


def test_refused_before_launch_where_not_honoured() -> None:
    cfg = make_config(MLP | {"strategy": "local-sgd", "procs": 2})
    with pytest.raises(ConfigError, match=r"does not support clip \(--clip-grad-norm 0.3\).*"
                                          r"that does: .*allreduce.*gpipe"):
        prepare(cfg)
    with pytest.raises(ConfigError, match="gradient-norm limit is a finite positive number"):
        make_config(MLP | {"clip_grad_norm": 0.0})


@pytest.fixture(scope="module")
def mlp_reference() -> dict[str, torch.Tensor]:
    return _reference(MLP)


@pytest.mark.slow
@pytest.mark.parametrize("strategy,procs,sets", [
    ("single", 1, []), ("allreduce", 2, []), ("gpipe", 2, []), ("1f1b", 3, []),
    ("layerwise", 2, []), ("gpipe", 4, ["partition=2x2"]),
])
def test_split_gradients_clip_as_torch_does(mlp_reference: dict[str, torch.Tensor], tmp_path: Path,
                                            strategy: str, procs: int, sets: list[str]) -> None:
    out = tmp_path / strategy
    polytrain.train(**(MLP | {"strategy": strategy, "procs": procs, "out": str(out), "sets": sets}))
    assert_same_params(load_model(out), mlp_reference)


@pytest.mark.slow
@pytest.mark.parametrize("strategy,procs,sets", [("tensor", 2, []),
                                                 ("mesh", 4, ["dp=2", "tp=2", "pp=1"])])
def test_tensor_shards_clip_as_torch_does(tmp_path: Path, strategy: str, procs: int,
                                          sets: list[str]) -> None:
    out = tmp_path / strategy
    polytrain.train(**(GPT | {"strategy": strategy, "procs": procs, "out": str(out), "sets": sets}))
    assert_same_params(load_model(out), _reference(GPT))
