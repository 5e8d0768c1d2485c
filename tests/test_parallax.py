"""``hybrid-ps-ar`` (Parallax): the path rule, row partitions and bad input (tier 1, no
processes), and the oracle (tier 3): synchronous training with SGD equals ``single``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import polytrain
from polytrain.config import make_config
from polytrain.errors import ConfigError
from polytrain.launch.prepare import prepare
from polytrain.strategies import make_strategy
from polytrain.strategies.hybrid.parallax_plan import (
    RowPartition,
    assign_paths,
    paths_table,
    row_density,
)
from polytrain.strategies.hybrid.parallax_rows import LazyRows
from tests.conftest import assert_same_params, load_model, step_losses

TINY = {"model": "sparse-bow", "dataset": "bow-ids", "steps": 4, "batch_size": 16, "seed": 3,
        "optimizer": "sgd", "lr": 0.5, "model_options": {"dim": 4, "hidden": 8},
        "data_options": {"features": 3000, "nnz": 5, "train": 256, "test": 64}}


def test_embeddings_go_to_servers_dense_to_allreduce_and_the_threshold_decides_the_rest() -> None:
    model = nn.Sequential(nn.EmbeddingBag(50, 4), nn.Linear(4, 6), nn.Linear(6, 3))
    density = {"0.weight": 0.9, "1.weight": 0.05, "1.bias": 0.05, "2.weight": 1.0, "2.bias": 1.0}
    paths = {a.name: a for a in assign_paths(model, density, threshold=0.1)}
    assert paths["0.weight"].path == "ps" and "embedding" in paths["0.weight"].reason  # whatever its density
    assert paths["1.weight"].path == "ps" and "5.0% < sparse_threshold 10.0%" in paths["1.weight"].reason
    assert paths["2.weight"].path == "allreduce" and "100.0% >= 10.0%" in paths["2.weight"].reason
    off = {a.name: a.path for a in assign_paths(model, density, threshold=0.0)}
    assert off == {"0.weight": "ps", "1.weight": "allreduce", "1.bias": "allreduce",
                   "2.weight": "allreduce", "2.bias": "allreduce"}


def test_the_console_table_lists_server_held_parameters_and_counts_the_rest() -> None:
    model = nn.Sequential(nn.Embedding(50, 4), *[nn.Linear(4, 4) for _ in range(8)])
    paths = assign_paths(model, {}, threshold=0.1)
    table = paths_table(paths)
    assert "0.weight" in table and "(16 more)" in table and "8.bias" not in table
    assert "8.bias" in paths_table(paths, most=20)


def test_row_density_counts_rows_with_any_nonzero_entry() -> None:
    g = torch.zeros(10, 3)
    g[2, 1], g[7] = 1.0, -2.0
    assert row_density(g) == pytest.approx(0.2)
    emb = nn.EmbeddingBag(100, 4)
    emb(torch.tensor([[1, 5, 5], [9, 1, 2]])).sum().backward()
    assert row_density(emb.weight.grad) == pytest.approx(4 / 100)


@pytest.mark.parametrize("kind", ["hash", "range"])
def test_row_partitions_cover_every_row_once(kind: str) -> None:
    part = RowPartition(kind, rows=1001, servers=3)
    owned = [part.owned(s) for s in range(3)]
    assert torch.equal(torch.cat(owned).sort().values, torch.arange(1001))
    for s, rows in enumerate(owned):
        assert bool((part.owner(rows) == s).all())
    sizes = part.sizes()
    assert sum(sizes) == 1001 and max(sizes) - min(sizes) <= (1 if kind == "range" else 60)
    if kind == "range":  # contiguous blocks in order
        assert [int(o[0]) for o in owned] == part.bounds()[:-1] == [0, 334, 667]
    else:  # the frequent ids (the first ones, in a vocabulary sorted by frequency) are spread
        assert sorted(set(part.owner(torch.arange(6)).tolist())) == [0, 1, 2]


def test_lazy_sgd_rows_equal_dense_sgd() -> None:
    table = torch.randn(8, 3)
    dense = nn.Parameter(table.clone())
    grad = torch.zeros(8, 3)
    grad[[1, 6]] = torch.randn(2, 3)
    dense.grad = grad
    torch.optim.SGD([dense], lr=0.3).step()
    rows = LazyRows(table.clone(), "sgd", lr=0.3)
    rows.apply(torch.tensor([1, 6]), grad[[1, 6]])
    assert torch.equal(rows.table, dense.detach())


@pytest.mark.parametrize(("options", "procs", "match"), [
    ({"partition": "modulo"}, 2, r"partition.*'hash' or 'range'"),
    ({"sparse_threshold": 1.5}, 2, r"sparse_threshold.*less than or equal to 1"),
    ({"servers": -1}, 2, r"servers.*greater than or equal to 0"),
    ({"shards": 2}, 2, r"unknown option 'shards'"),
    ({"servers": 2}, 2, r"servers=2 needs at least one worker.*--procs 3"),
    ({}, 3, r"--batch-size must be a multiple of 3"),
])
def test_bad_options_are_one_line_errors_before_launch(options: dict, procs: int, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as err:
        prepare(make_config({"strategy": "hybrid-ps-ar", "procs": procs, "batch_size": 64,
                             "options": options}))
    assert "\n" not in str(err.value)


def test_options_are_validated_by_the_registry() -> None:
    strat = make_strategy("hybrid-ps-ar", {"servers": 2, "partition": "range"})
    assert strat.roles(5) == ["worker", "worker", "worker", "server", "server"]
    assert make_strategy("hybrid-ps-ar", {}).roles(3) == ["worker"] * 3  # co-located servers


@pytest.fixture(scope="module")
def single_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("single") / "run"
    polytrain.train(strategy="single", procs=1, out=str(out), **TINY)
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("procs", "options"), [
    (2, {}),  # a server on each worker, hash partition
    (3, {"servers": 1, "partition": "range"}),  # a dedicated server
])
def test_hybrid_equals_single_with_sgd(single_run: Path, tmp_path: Path, procs: int,
                                       options: dict) -> None:
    out = tmp_path / "hybrid"
    summary = polytrain.train(strategy="hybrid-ps-ar", procs=procs, out=str(out), options=options,
                              **TINY)
    assert_same_params(load_model(out), load_model(single_run), atol=1e-6, rtol=1e-5)
    ours, theirs = step_losses(out), step_losses(single_run)
    assert list(ours) == [1, 2, 3, 4]
    for s in ours:
        assert ours[s] == pytest.approx(theirs[s], rel=1e-5, abs=1e-6)
    m = summary["strategy_metrics"]
    assert [(a["name"], a["path"]) for a in m["paths"]][:2] == [("embed.weight", "ps"),
                                                               ("fc1.0.weight", "allreduce")]
    assert "embedding (nn.EmbeddingBag)" in m["console_table"]
    # bytes counted where sent: rows on the ps path, the dense rest all-reduced
    by_op = {op: sum(r["bytes_by_op"].get(op, 0) for r in summary["per_rank"])
             for op in ("ps_push_rows", "ps_pull_rows", "allreduce")}
    assert all(by_op.values())
    assert by_op["ps_push_rows"] < 4 * 16 * 5 * (4 * 4 + 4)  # at most the ids of the batch, as rows
