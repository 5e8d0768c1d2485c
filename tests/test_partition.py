"""Tier 1: partitions as data, the cut, the planners (against brute force) and the profiler."""

from __future__ import annotations

import itertools
import random
from collections import OrderedDict

import pytest
import torch
from torch import nn

from polytrain.cost.layer_profile import format_profile, profile_layers
from polytrain.errors import ConfigError
from polytrain.models.boundaries import boundary_metas
from polytrain.models.partition import (
    LayerCost,
    Partition,
    balanced,
    check_cuttable,
    cut,
    evaluate,
    pipedream_plan,
    uniform,
)

# --- Partition ------------------------------------------------------------------------------------


def test_partition_prints_parses_and_numbers_ranks() -> None:
    p = Partition((3, 5, 5, 6))
    assert str(p) == "3,5,5,6" and p.replicas == (1, 1, 1, 1)
    assert p.stages == 4 and p.layers == 19 and p.ranks == 4
    assert p.bounds == [(0, 3), (3, 8), (8, 13), (13, 19)]
    q = Partition.parse("3, 5x2 ,4")
    assert q == Partition((3, 5, 4), (1, 2, 1)) and str(q) == "3,5x2,4" and q.ranks == 4
    assert [q.stage_of_rank(r) for r in range(4)] == [(0, 0), (1, 0), (1, 1), (2, 0)]
    assert Partition.parse(4) == Partition((4,)) and Partition.parse([2, 2]) == Partition((2, 2))
    assert q.to_json() == {"counts": [3, 5, 4], "replicas": [1, 2, 1], "text": "3,5x2,4"}


@pytest.mark.parametrize(
    "counts,replicas",
    [((), ()), ((3, 0), ()), ((3, -1), ()), ((2, 2), (1,)), ((2, 2), (1, 0)), ((True, 2), ())],
)
def test_partition_refuses_bad_counts_on_construction(
    counts: tuple[int, ...], replicas: tuple[int, ...]
) -> None:
    with pytest.raises(ConfigError, match=r"Rule: at least one stage.*Fix: e\.g\."):
        Partition(counts, replicas)


@pytest.mark.parametrize("text", ["3,,5", "a,b", "3,5y2", "-1,3"])
def test_partition_parse_errors_say_the_syntax(text: str) -> None:
    with pytest.raises(ConfigError, match="comma-separated layer counts"):
        Partition.parse(text)


def test_partition_check_names_counts_layers_and_ranks() -> None:
    with pytest.raises(ConfigError) as err:
        Partition((3, 5, 5, 5)).check(layers=19, ranks=4)
    msg = str(err.value)
    assert "3,5,5,5 holds 18 layers but the model has 19" in msg and "partition=5,5,5,4" in msg
    with pytest.raises(ConfigError, match=r"needs 4 ranks .* --procs 2.*partition=10,9"):
        Partition((3, 5, 5, 6)).check(layers=19, ranks=2)
    Partition((3, 5, 5, 6)).check(layers=19, ranks=4)


# --- the cut --------------------------------------------------------------------------------------


def _mlp(depth: int = 4) -> nn.Sequential:
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    for i in range(depth):
        layers[f"fc{i}"] = nn.Sequential(nn.Linear(6, 6), nn.ReLU())
    layers["head"] = nn.Linear(6, 3)
    return nn.Sequential(layers)


def test_cut_keeps_names_shares_layers_and_composes() -> None:
    model = _mlp()
    stages = cut(model, Partition((2, 3)))
    assert [list(dict(s.named_children())) for s in stages] == [["fc0", "fc1"], ["fc2", "fc3", "head"]]
    assert stages[0].fc0 is model.fc0  # shared, not copied: updates reach the full model
    merged = {**stages[0].state_dict(), **stages[1].state_dict()}
    assert merged.keys() == model.state_dict().keys()
    x = torch.randn(5, 6)
    torch.testing.assert_close(stages[1](stages[0](x)), model(x))


def test_models_that_cannot_be_cut_say_what_is_needed() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.a(x)

    with pytest.raises(ConfigError, match=r"Cannot cut a Net.*ordered list of layers"):
        cut(Net(), Partition((1,)))
    with pytest.raises(ConfigError, match=r"1 layer.*held as ONE layer.*split=auto.*--procs 1"):
        check_cuttable(nn.Sequential(Net()), 2)
    with pytest.raises(ConfigError, match="holds 4 layers but the model has 5"):
        cut(_mlp(), Partition((2, 2)))


# --- planners against brute force -----------------------------------------------------------------


def _compositions(n: int, k: int) -> list[tuple[int, ...]]:
    return [
        tuple(b - a for a, b in zip((0, *cuts), (*cuts, n), strict=True))
        for cuts in itertools.combinations(range(1, n), k - 1)
    ]


def test_uniform_and_balanced_splits() -> None:
    assert uniform(19, 4) == Partition((5, 5, 5, 4))
    assert balanced([1, 1, 1, 1, 8, 1, 1, 1], 3).counts == (4, 1, 3)
    rng = random.Random(0)
    for _ in range(60):
        n = rng.randint(1, 8)
        k = rng.randint(1, n)
        costs = [rng.choice([0.5, 1.0, 2.0, 3.0, 7.0]) for _ in range(n)]
        best = min(max(sum(costs[a:b]) for a, b in Partition(c).bounds) for c in _compositions(n, k))
        got = balanced(costs, k)
        assert got.stages == k and got.layers == n
        assert max(sum(costs[a:b]) for a, b in got.bounds) == pytest.approx(best)


def _brute_plan(costs: list[LayerCost], workers: int, bw: float, replicate: bool) -> float:
    best = float("inf")
    n = len(costs)
    for k in range(1, min(n, workers) + 1):
        for counts in _compositions(n, k):
            reps_options = _compositions(workers, k) if replicate else ([(1,) * k] if k == workers else [])
            for reps in reps_options:
                best = min(best, evaluate(costs, Partition(counts, reps), bw).period_s)
    return best


@pytest.mark.parametrize("replicate", [True, False])
def test_pipedream_planner_finds_the_brute_force_optimum(replicate: bool) -> None:
    rng = random.Random(1 + replicate)
    for _ in range(40):
        n, workers = rng.randint(1, 6), rng.randint(1, 5)
        if not replicate and workers > n:
            workers = n
        costs = [
            LayerCost(f"l{i}", rng.uniform(0.1, 3.0), rng.randint(1, 400), rng.randint(0, 4000))
            for i in range(n)
        ]
        bw = rng.choice([100.0, 1000.0, 10000.0])
        plan = pipedream_plan(costs, workers, bw, replicate=replicate)
        assert plan.partition.ranks == workers and plan.partition.layers == n
        assert plan.period_s == pytest.approx(_brute_plan(costs, workers, bw, replicate))
        assert plan.period_s == pytest.approx(evaluate(costs, plan.partition, bw).period_s)


def test_pipedream_planner_replicates_heavy_layers_with_few_weights() -> None:
    # conv-like layers: much compute, few weights; an fc layer: little compute, many weights
    costs = [LayerCost("conv", 8.0, 10, 10), LayerCost("conv", 8.0, 10, 10), LayerCost("fc", 1.0, 1, 10**6)]
    plan = pipedream_plan(costs, 5, bandwidth=1e4, replicate=True)
    assert plan.partition == Partition((2, 1), (4, 1))  # the convs data-parallel over 4, the fc alone
    assert plan.period_s == pytest.approx(4.0)
    flat = pipedream_plan(costs, 3, bandwidth=1e4, replicate=False)
    assert flat.partition.replicas == (1, 1, 1) and flat.period_s == pytest.approx(8.0)


def test_planner_refuses_more_stages_than_layers() -> None:
    with pytest.raises(ConfigError, match="Cannot split 2 layers into 3 stages"):
        pipedream_plan([LayerCost("a", 1, 1, 1)] * 2, 3, 1.0, replicate=False)


# --- profiler -------------------------------------------------------------------------------------


def test_profile_measures_every_layer_and_leaves_the_model_alone() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Dropout(0.5), nn.Linear(16, 4))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(32, 8)
    torch.manual_seed(7)
    expected_draw = torch.rand(1)
    torch.manual_seed(7)
    profiles = profile_layers(model, x, repeats=2)
    assert torch.rand(1) == expected_draw  # the random stream is untouched
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert [p.activation_bytes for p in profiles] == [32 * 16 * 4] * 3 + [32 * 4 * 4]
    assert [p.param_bytes for p in profiles] == [(8 * 16 + 16) * 4, 32 * 4, 0, (16 * 4 + 4) * 4]
    assert all(p.forward_s > 0 and p.backward_s >= 0 for p in profiles)
    assert profiles[0].cost().compute_s == pytest.approx(profiles[0].compute_s)
    assert "fwd ms" in format_profile(profiles)


def test_boundary_metas_and_layers_that_return_tuples() -> None:
    model = nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(12, 2))
    metas = boundary_metas(model, torch.zeros(5, 3, dtype=torch.long))
    assert [(m.shape, m.dtype) for m in metas] == [
        ((5, 3, 4), torch.float32),
        ((5, 12), torch.float32),
        ((5, 2), torch.float32),
    ]
    assert metas[0].nbytes == 5 * 3 * 4 * 4 and model.training

    class Pair(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x, x

    with pytest.raises(ConfigError, match=r"Layer 1 \('1'\) returns a tuple.*one tensor to one tensor"):
        boundary_metas(nn.Sequential(nn.Identity(), Pair()), torch.zeros(2, 2))
