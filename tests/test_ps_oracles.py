"""In-process oracles for the data-parallel and parameter-server tests, and their own tier-1 checks.

``reference`` is what ``single`` computes (same Job, batches, optimizer and loop), run in this
process to save a launch; ``replicas`` simulates W replicas on their parts of each global batch
with a mixing rule (local-SGD averaging, MALT gossip), so a multi-process run can be held to it
exactly. Each simulator is checked here against ``reference`` in the case where theory says
they coincide (period=1 averaging, all-peer MALT).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from polytrain.config import load_config
from polytrain.runtime.job import Job
from polytrain.strategies.data.local_sgd import averages_after
from polytrain.strategies.data.malt import in_peers, peer_graph

Mixer = Callable[[int, list[nn.Module], str], None]  # (step, replicas, "grads"|"params")


def _job(common: dict[str, Any], sets: list[str] | tuple[str, ...] = ()) -> Job:
    cfg = load_config(None, {**common, "strategy": "single", "procs": 1}, list(sets))
    return Job.from_config(cfg)


def reference(common: dict[str, Any], sets: list[str] | tuple[str, ...] = ()
              ) -> tuple[dict[str, torch.Tensor], dict[int, float]]:
    """Single-process training: final state dict and the loss of every step."""
    return replicas(common, 1, None, sets)


def replicas(common: dict[str, Any], workers: int, mix: Mixer | None,
             sets: list[str] | tuple[str, ...] = ()) -> tuple[dict[str, torch.Tensor], dict[int, float]]:
    """W replicas, replica w on part w of each global batch; ``mix`` couples them. Returns
    replica 0's final state and the mean loss over replicas of every step."""
    job = _job(common, sets)
    models = [job.build_model() for _ in range(workers)]
    opts = [job.make_optimizer(m.parameters()) for m in models]
    batches = job.batches()
    losses: dict[int, float] = {}
    for step in range(1, job.steps + 1):
        total = 0.0
        for w, (m, o) in enumerate(zip(models, opts, strict=True)):
            x, y = batches.shard(step, w, workers)
            o.zero_grad(set_to_none=True)
            loss = job.loss(m(x), y)
            loss.backward()
            total += float(loss.detach())
        if mix is not None:
            mix(step, models, "grads")
        for o in opts:
            o.step()
        if mix is not None:
            mix(step, models, "params")
        losses[step] = total / workers
    return {k: v.detach().clone() for k, v in models[0].state_dict().items()}, losses


def _average(tensors: list[list[torch.Tensor]], groups: list[list[int]]) -> None:
    """Replace tensors[w] by the mean over groups[w] (computed from the old values)."""
    new = [[sum(tensors[j][i] for j in g) / len(g) for i in range(len(tensors[0]))] for g in groups]
    with torch.no_grad():
        for w, ts in enumerate(tensors):
            for t, v in zip(ts, new[w], strict=True):
                t.copy_(v)


def local_sgd_mixer(steps: int, period: int, warmup: int) -> Mixer:
    def mix(step: int, models: list[nn.Module], phase: str) -> None:
        if phase == "params" and averages_after(step, steps, period, warmup):
            everyone = list(range(len(models)))
            _average([list(m.parameters()) for m in models], [everyone] * len(models))
    return mix


def malt_mixer(graph: str, exchange: str = "grads") -> Mixer:
    def mix(step: int, models: list[nn.Module], phase: str) -> None:
        if phase == exchange:
            g = peer_graph(graph, len(models))
            groups = [[w, *in_peers(g, w)] for w in range(len(models))]
            pick: Callable[[nn.Parameter], torch.Tensor] = (
                (lambda p: p.grad) if exchange == "grads" else (lambda p: p.data))  # type: ignore[return-value]
            _average([[pick(p) for p in m.parameters()] for m in models], groups)
    return mix


COMMON = {"model": "mlp", "dataset": "digits", "steps": 5, "batch_size": 24, "seed": 4,
          "optimizer": "sgd", "lr": 0.1}


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=1e-4)


def test_local_sgd_period_1_is_sgd_on_the_whole_batch() -> None:
    ref, ref_losses = reference(COMMON)
    sim, losses = replicas(COMMON, 3, local_sgd_mixer(5, period=1, warmup=0))
    _close(sim, ref)
    assert all(abs(losses[s] - ref_losses[s]) < 1e-5 for s in ref_losses)


def test_malt_all_peers_is_sgd_on_the_whole_batch() -> None:
    ref, _ = reference(COMMON)
    for exchange in ("params", "grads"):
        sim, _ = replicas(COMMON, 3, malt_mixer("all", exchange))
        _close(sim, ref)
