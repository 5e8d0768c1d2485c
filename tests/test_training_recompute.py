"""``--activation-checkpointing`` (issue 45 item 5): each block's forward runs again during
backward, and the gradients equal those without it; parameter names do not change."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from polytrain.config import make_config
from polytrain.errors import ConfigError
from polytrain.launch.prepare import prepare
from polytrain.runtime import recompute
from polytrain.runtime.job import Job

GPT: dict[str, Any] = {"model": "gpt-mini", "dataset": "chars", "batch_size": 4,
                       "model_options": {"n_layer": 2, "n_head": 2, "d_model": 16},
                       "data_options": {"seq_len": 16, "chars": 20_000}}


def _counting(forward: Any, calls: list[str]) -> Any:
    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append("forward")
        return forward(*args, **kwargs)

    return counted


@pytest.mark.parametrize("cfg,units", [({"model": "mlp", "batch_size": 8}, "layers"), (GPT, "blocks")])
def test_blocks_recompute_with_equal_gradients(cfg: dict[str, Any], units: str) -> None:
    job = Job.from_config(make_config(cfg))
    x, y = job.batches().shard(1)
    plain, ours = job.build_model(), job.build_model()
    names = list(dict(ours.named_parameters()))
    calls: list[str] = []
    for m in recompute.blocks(ours):  # count every run of each block's forward, recomputed too
        m.forward = _counting(m.forward, calls)  # type: ignore[method-assign]
    n = recompute.apply(ours, True)
    assert n >= 2 and list(dict(ours.named_parameters())) == names
    for model in (plain, ours):
        job.forward_loss(model, x, y).backward()
    assert len(calls) == 2 * n  # every block ran its forward again in backward
    for (name, a), b in zip(plain.named_parameters(), ours.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-7, msg=name)
    with torch.no_grad():  # evaluation keeps nothing and recomputes nothing
        calls.clear()
        ours(x)
        assert len(calls) == n


def test_refused_where_not_honoured() -> None:
    with pytest.raises(ConfigError, match=r"does not support recompute \(--activation-checkpointing\)"
                                          r".*that does: .*gpipe"):
        prepare(make_config({"strategy": "local-sgd", "procs": 2, "model": "mlp",
                             "activation_checkpointing": True}))
