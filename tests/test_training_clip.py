"""``--clip-grad-norm X`` (issue 45 item 3): the global norm over the whole model, however its
gradient is split, equals ``torch.nn.utils.clip_grad_norm_``'s (the multi-process oracle for
each strategy is in test_training_runs.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from polytrain.config import make_config
from polytrain.errors import ConfigError
from polytrain.launch.prepare import prepare
from polytrain.runtime.clip import GradSplit, clip_grad_norm, squared_norm

MLP: dict[str, Any] = {"model": "mlp", "model_options": {"hidden": 16}, "dataset": "digits",
                       "batch_size": 16, "steps": 5, "seed": 4, "optimizer": "sgd", "lr": 0.2,
                       "clip_grad_norm": 0.3}


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


def test_refused_before_launch_where_not_honoured() -> None:
    cfg = make_config(MLP | {"strategy": "hogwild", "procs": 2, "optimizer": "sgd"})
    with pytest.raises(ConfigError, match=r"does not support clip \(--clip-grad-norm 0.3\).*"
                                          r"that does: .*allreduce.*gpipe.*local-sgd.*ps"):
        prepare(cfg)
    with pytest.raises(ConfigError, match="gradient-norm limit is a finite positive number"):
        make_config(MLP | {"clip_grad_norm": 0.0})
