"""``malt``: the Halton peer graph (tier 1) and a real 4-rank run held exactly to an in-process
simulation of the same gossip (tier 3). That all-peer MALT equals single-process SGD (exchanging
parameters or gradients) is checked on the simulator (tests/test_ps_oracles.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

import polytrain
from polytrain.strategies.data.malt import halton, halton_offsets, in_peers, peer_graph
from tests.conftest import assert_same_params, load_model, step_losses
from tests.test_ps_oracles import malt_mixer, replicas

COMMON = {"model": "mlp", "dataset": "digits", "steps": 5, "batch_size": 24, "seed": 2,
          "optimizer": "sgd", "lr": 0.2}


def test_halton_sequence_and_graph() -> None:
    assert [halton(i) for i in range(1, 8)] == [0.5, 0.25, 0.75, 0.125, 0.625, 0.375, 0.875]
    assert halton_offsets(8) == [4, 2, 6] and halton_offsets(4) == [2, 1]
    assert halton_offsets(2) == [1] and halton_offsets(1) == []
    assert peer_graph("halton", 8)[1] == [5, 3, 7]
    for w in (2, 3, 5, 8, 16, 32):
        g = peer_graph("halton", w)
        assert all(len(outs) == min(w - 1, (w - 1).bit_length()) for outs in g)  # ceil(log2 W)
        assert all(len(in_peers(g, r)) == len(g[r]) and r not in g[r] for r in range(w))
    assert peer_graph("all", 3) == [[1, 2], [2, 0], [0, 1]]


@pytest.mark.slow
def test_halton_run_equals_simulated_gossip(tmp_path: Path) -> None:
    out = tmp_path / "malt"
    summary = polytrain.train(strategy="malt", procs=4, out=str(out), sets=["graph=halton"], **COMMON)
    sim, sim_losses = replicas(COMMON, 4, malt_mixer("halton", "params"))
    assert_same_params(load_model(out), sim)
    ours = step_losses(out)
    assert all(ours[s] == pytest.approx(sim_losses[s], rel=1e-5, abs=1e-6) for s in sim_losses)
    m = summary["strategy_metrics"]
    n = sum(t.numel() for t in sim.values())
    assert m["peers"] == 2 and m["exchange"] == "params"
    assert m["bytes_per_worker"] == 5 * 2 * n * 4  # 2 pushes of N floats a step
    assert m["bytes_vs_allreduce"] == pytest.approx(2 / 1.5, rel=1e-3)  # ring: 2(W-1)/W = 1.5 N
