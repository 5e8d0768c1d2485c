"""Tier 3: pipeline strategies on real processes over gloo.

Oracles: gpipe and 1f1b equal single-process training (parameters and per-step losses) on 2 and
4 stages; pipedream's backward always differentiates the weight version its forward used, and
with vertical sync every stage runs a mini-batch on the input stage's version, and the run equals
single-process SGD with gradients P-1 updates stale. Each launch costs
~15-50 s of process start-up on the 2-core dev box, so the cases are few and each checks a lot.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch

import polytrain
from polytrain.strategies.pipeline.activations_wire import HEADER
from tests.conftest import assert_same_params, load_model, step_losses

pytestmark = pytest.mark.slow

COMMON: dict[str, Any] = {
    "model": "mlp",
    "dataset": "digits",
    "steps": 4,
    "batch_size": 32,
    "optimizer": "momentum",
    "lr": 0.05,
    "seed": 3,
}
DEPTH = ["model.depth=3"]  # fc1 fc2 fc3 head: four layers, enough for four stages
HIDDEN = 128  # mlp's default width: the activation at every cut is (b, 128) float32


@pytest.fixture(scope="module")
def single_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pipeline") / "single"
    polytrain.train(strategy="single", procs=1, out=str(out), sets=DEPTH, **COMMON)
    return out


@pytest.mark.parametrize(
    "strategy,procs,microbatches,sets",
    [
        ("gpipe", 2, 4, ["partition=3,1", "checkpoint=except_last"]),
        ("1f1b", 4, 2, ["partition=auto"]),
        ("gpipe", 4, 8, ["partition=uniform", "checkpoint=always"]),
    ],
)
def test_flush_pipelines_equal_single(
    single_run: Path, tmp_path: Path, strategy: str, procs: int, microbatches: int, sets: list[str]
) -> None:
    out = tmp_path / strategy
    summary = polytrain.train(
        strategy=strategy,
        procs=procs,
        out=str(out),
        sets=[*DEPTH, f"microbatches={microbatches}", *sets],
        **COMMON,
    )
    assert_same_params(load_model(out), load_model(single_run))
    ours, theirs = step_losses(out), step_losses(single_run)
    assert list(ours) == [1, 2, 3, 4]
    for s in ours:
        assert ours[s] == pytest.approx(theirs[s], rel=1e-5, abs=1e-6)

    m = summary["strategy_metrics"]
    assert m["schedule"] == strategy and m["stages"] == procs and m["microbatches"] == microbatches
    assert sum(m["partition"]["counts"]) == 4 and len(m["layers_per_stage"]) == procs
    assert 0.0 < m["bubble_fraction"] < 1.0
    assert m["bubble_fraction_theory"] == pytest.approx((procs - 1) / (microbatches + procs - 1))
    assert len(m["busy_s_per_stage"]) == procs and all(b > 0 for b in m["busy_s_per_stage"])
    assert all(b > 0 for b in m["peak_memory_bytes_per_stage"])
    # bytes are measured: each micro-batch crosses each cut once each way, with a HEADER-byte trailer
    message = HEADER + (32 // microbatches) * HIDDEN * 4
    for rank in summary["per_rank"][: procs - 1]:
        assert rank["bytes_by_op"]["activation"] == COMMON["steps"] * microbatches * message
    assert summary["per_rank"][-1]["bytes_by_op"]["gradient"] == COMMON["steps"] * microbatches * message
    assert summary["eval"] is not None and summary["samples"] == 4 * 32

    spans = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    forwards = [e for e in spans if e["event"] == "span" and e["name"] == "forward"]
    assert len(forwards) == procs * COMMON["steps"] * microbatches
    assert {e["stage"] for e in forwards} == set(range(procs)) == {e["rank"] for e in forwards}


def test_pipedream_stashes_weights_and_syncs_versions(tmp_path: Path) -> None:
    out = tmp_path / "pipedream"
    steps = 8
    summary = polytrain.train(
        strategy="pipedream",
        procs=3,
        out=str(out),
        sets=[*DEPTH, "vertical_sync=true", "trace_versions=true", "partition=2,1,1"],
        **{**COMMON, "steps": steps},
    )
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trace: dict[tuple[int, int], dict[str, dict[str, Any]]] = defaultdict(dict)
    for e in events:
        if e["event"] == "version":
            trace[(e["stage"], e["step"])][e["phase"]] = e
    assert len(trace) == 3 * steps
    moved = 0
    for (stage, step), ev in trace.items():
        f, b = ev["F"], ev["B"]
        # weight stashing: the backward runs on the very tensors (version and values) of its forward
        assert b["version"] == f["version"] and b["used_sum"] == f["used_sum"], (stage, step)
        # vertical sync: every stage runs mini-batch `step` on the input stage's version
        assert f["version"] == trace[(0, step)]["F"]["version"], (stage, step)
        moved += b["current"] > b["version"] and b["live_sum"] != b["used_sum"]
    assert moved >= steps  # the live weights had moved on: without the stash, backward would differ

    m = summary["strategy_metrics"]
    assert m["schedule"] == "pipedream" and m["vertical_sync"] is True and not m["flush"]
    assert m["max_staleness"] == 2  # stage 0 sees P-1 updates between a forward and its backward
    assert sum(m["staleness"]["0"].values()) == steps
    assert all(v >= 2 for v in m["stashed_versions_peak_per_stage"])
    assert all(b > 0 for b in m["stash_bytes_peak_per_stage"])
    assert list(step_losses(out)) == list(range(1, steps + 1))
    assert load_model(out).keys() == {
        f"{n}.{p}" for n in ("fc1.1", "fc2.0", "fc3.0", "head") for p in ("weight", "bias")
    }
    assert summary["eval"] is not None
    # the whole run: with vertical sync mini-batch m meets one model, version max(m-(P-1), 0), on
    # every stage, and its gradient updates the live weights — SGD with gradients P-1 updates stale
    state, losses = delayed_sgd(steps, delay=2)
    assert_same_params(load_model(out), state)
    assert list(step_losses(out).values()) == pytest.approx(losses, rel=1e-4, abs=1e-6)


def delayed_sgd(steps: int, delay: int) -> tuple[dict[str, torch.Tensor], list[float]]:
    """One process: step k's gradient is taken at the weights after max(k-1-delay, 0) updates and
    applied to the current ones (the oracle of pipedream with vertical sync, delay = P-1)."""
    from torch.func import functional_call

    from polytrain.config import make_config
    from polytrain.runtime.job import Job

    cfg = make_config({**COMMON, "strategy": "single", "procs": 1, "steps": steps,
                       "model_options": {"depth": 3}})  # fmt: skip
    job = Job.from_config(cfg)
    model = job.build_model()
    optimizer = job.make_optimizer(model.parameters())
    batches = job.batches()
    versions = [{n: p.detach().clone() for n, p in model.named_parameters()}]
    losses = []
    for step in range(1, steps + 1):
        params = {n: t.clone().requires_grad_() for n, t in versions[max(step - 1 - delay, 0)].items()}
        x, y = batches.shard(step)
        loss = job.loss(functional_call(model, params, (x,)), y)
        for p, g in zip(model.parameters(), torch.autograd.grad(loss, list(params.values())), strict=True):
            p.grad = g
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        versions.append({n: p.detach().clone() for n, p in model.named_parameters()})
        losses.append(float(loss))
    return model.state_dict(), losses


@pytest.mark.parametrize(
    "strategy,partition",
    [("1f1b", "2x2,2"), ("gpipe", "3,1x2")],  # a replicated first stage; a replicated last stage
)
def test_replicated_stages_equal_single(
    single_run: Path, tmp_path: Path, strategy: str, partition: str
) -> None:
    """Replicas of a stage take micro-batches in turn and sum gradients at the flush."""
    out = tmp_path / strategy
    summary = polytrain.train(
        strategy=strategy, procs=3, out=str(out),
        sets=[*DEPTH, "microbatches=4", f"partition={partition}"], **COMMON,
    )
    assert_same_params(load_model(out), load_model(single_run))
    ours, theirs = step_losses(out), step_losses(single_run)
    assert list(ours) == [1, 2, 3, 4]
    for s in ours:
        assert ours[s] == pytest.approx(theirs[s], rel=1e-5, abs=1e-6)
    m = summary["strategy_metrics"]
    assert m["partition"]["text"] == partition and m["stages"] == 2
    assert len(m["busy_s_per_rank"]) == 3 and all(b > 0 for b in m["busy_s_per_rank"])
    replicated = [0, 1] if partition.startswith("2x2") else [1, 2]
    for rank, r in enumerate(summary["per_rank"]):
        assert ("replica_allreduce" in r["bytes_by_op"]) == (rank in replicated)
    # each replica runs half of the micro-batches: the cut carries every micro-batch once
    message = HEADER + (32 // 4) * HIDDEN * 4
    senders = [0, 1] if partition.startswith("2x2") else [0]
    sent = sum(summary["per_rank"][r]["bytes_by_op"]["activation"] for r in senders)
    assert sent == COMMON["steps"] * 4 * message
