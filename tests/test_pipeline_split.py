"""Tier 3: zb-h1 (split backward: B now, W later) on real processes over gloo equals ``single``.

SGD and Adam (fp32), P = 2, M ∈ {P, 2P}; each launch costs seconds of process start-up, so there
are two runs, each checking parameters, per-step losses and that W really ran apart from B.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import polytrain
from polytrain.errors import ConfigError
from polytrain.strategies.pipeline.split_backward import backward_input, backward_weight, forward_pieces
from tests.conftest import assert_same_params, load_model, step_losses

COMMON: dict[str, Any] = {"model": "mlp", "dataset": "digits", "steps": 3, "batch_size": 32, "seed": 5}
DEPTH = ["model.depth=3"]  # fc1 fc2 fc3 head: stage 0 gets two layers, so its W spans two pieces


@pytest.mark.slow
@pytest.mark.parametrize("optimizer,lr,microbatches", [("sgd", 0.1, 2), ("adam", 0.01, 4)])
def test_zb_h1_equals_single(tmp_path: Path, optimizer: str, lr: float, microbatches: int) -> None:
    single = tmp_path / "single"
    polytrain.train(strategy="single", procs=1, out=str(single), sets=DEPTH, optimizer=optimizer, lr=lr,
                    **COMMON)
    out = tmp_path / "zb"
    summary = polytrain.train(strategy="zb-h1", procs=2, out=str(out), optimizer=optimizer, lr=lr,
                              sets=[*DEPTH, f"microbatches={microbatches}", "partition=2,2"], **COMMON)
    assert_same_params(load_model(out), load_model(single))
    ours, theirs = step_losses(out), step_losses(single)
    assert list(ours) == [1, 2, 3]
    for s in ours:
        assert ours[s] == pytest.approx(theirs[s], rel=1e-5, abs=1e-6)
    m = summary["strategy_metrics"]
    assert m["schedule"] == "zb-h1" and m["stages"] == 2
    # every stage ran a W per micro-batch, timed apart from its B (the timeline's "weight" spans)
    assert all(set(ops) >= {"F", "B", "W"} for ops in m["op_s_per_stage"])
    assert m["peak_in_flight_per_stage"] == [min(2, microbatches)] * 2  # P on every stage
    assert 0.0 <= m["bubble_fraction_schedule"] < 1.0


def test_zb_h1_refuses_checkpointing() -> None:
    with pytest.raises(ConfigError, match=r"split backward.*Fix: --set checkpoint=never"):
        polytrain.train(strategy="zb-h1", procs=2, sets=[*DEPTH, "checkpoint=always"], **COMMON)


class _Pair(torch.nn.Module):
    """A layer whose output is a tuple: no cut after it (the next layer takes the tuple)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.lin(x), x


class _Join(torch.nn.Module):
    def forward(self, pair: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return pair[0] * pair[1]


def _stages() -> list[tuple[torch.nn.Module, torch.Tensor]]:
    torch.manual_seed(0)
    tokens = torch.randint(0, 10, (4, 3))
    seq = torch.nn.Sequential(torch.nn.Embedding(10, 6), torch.nn.Flatten(), torch.nn.Linear(18, 6),
                              torch.nn.Tanh(), _Pair(), _Join(), torch.nn.Linear(6, 2))
    plain = torch.nn.Linear(6, 2)  # not a Sequential: one piece
    return [(seq, tokens), (plain, torch.randn(4, 6, requires_grad=True))]


@pytest.mark.parametrize("index", [0, 1])
def test_split_backward_equals_backward(index: int) -> None:
    """B then W give the input and weight gradients of one plain backward, exactly as summed."""
    module, inp = _stages()[index]
    grad_out = torch.randn(4, 2)
    ref_in = inp.detach().clone().requires_grad_(inp.requires_grad)
    module(ref_in).backward(grad_out)
    ref = {n: p.grad.clone() for n, p in module.named_parameters()}
    module.zero_grad()
    out, graph = forward_pieces(module, inp)
    g = backward_input(graph, grad_out)
    assert all(p.grad is None for p in module.parameters())  # B touched no weight
    backward_weight(graph)
    for n, p in module.named_parameters():
        torch.testing.assert_close(p.grad, ref[n], rtol=0, atol=1e-6)
    if inp.requires_grad:
        assert g is not None and ref_in.grad is not None
        torch.testing.assert_close(g, ref_in.grad)
    else:
        assert g is None  # token ids take no gradient
    if index == 0:  # cut after Linear(18, 6), Tanh, _Join and at the end; never after the tuple
        assert len(graph.pending) == 0 and out.shape == (4, 2)


def test_timeline_draws_w_apart_from_b() -> None:
    """The executor's W spans are named ``weight``: the timeline gives them their own colour."""
    from polytrain.report.gantt import COLOURS
    from polytrain.report.timeline import kind_of

    assert kind_of({"name": "weight", "cat": "compute"}) == "weight"
    assert kind_of({"name": "backward", "cat": "compute"}) == "backward"
    assert COLOURS["weight"] != COLOURS["backward"]
