"""Tier 3: pipelines with virtual stages (V = 2 chunks per rank) equal ``single`` on gloo.

One launch per schedule (P = 2; interleaved-1f1b also at P = 4), alternating SGD/Adam and
M ∈ {P, 2P}; each checks parameters, per-step losses, where the chunks ran and the activations
held per rank against the schedule's stated count. Bad input is refused before any process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import polytrain
from polytrain.errors import ConfigError
from polytrain.schedules.registry import in_flight, stage_orders
from tests.conftest import assert_same_params, load_model, step_losses

COMMON: dict[str, Any] = {"model": "mlp", "dataset": "digits", "steps": 3, "batch_size": 32, "seed": 7}
LR = {"sgd": 0.1, "adam": 0.01}


@pytest.fixture(scope="module")
def singles(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], Path]:
    """Single-process runs per (optimizer, depth), made once."""
    root, out = tmp_path_factory.mktemp("virtual"), {}
    for opt, depth in (("sgd", 3), ("adam", 3), ("sgd", 7)):
        run = root / f"single-{opt}-{depth}"
        polytrain.train(strategy="single", procs=1, out=str(run), sets=[f"model.depth={depth}"],
                        optimizer=opt, lr=LR[opt], **COMMON)
        out[(opt, depth)] = run
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,procs,microbatches,optimizer",
    [
        ("interleaved-1f1b", 2, 2, "sgd"),
        ("looped-bfs", 2, 4, "adam"),
        ("zbv", 2, 2, "adam"),  # M < 2P: the 2P-order restricted to M
        ("dualpipev", 2, 4, "sgd"),
        # P = 4 with SGD: under Adam a near-zero gradient turns float reassociation (M micro-batch
        # sums against one batch) into a 3e-5 step on one element — 1f1b shows the same element
        ("interleaved-1f1b", 4, 4, "sgd"),
    ],
)
def test_virtual_pipelines_equal_single(singles: dict[tuple[str, int], Path], tmp_path: Path, name: str,
                                        procs: int, microbatches: int, optimizer: str) -> None:
    depth = 2 * procs - 1  # P·V = 2P chunks of one layer each (mlp: depth hidden layers + head)
    out = tmp_path / name
    summary = polytrain.train(strategy=name, procs=procs, out=str(out), optimizer=optimizer, lr=LR[optimizer],
                              sets=[f"model.depth={depth}", f"microbatches={microbatches}"], **COMMON)
    single = singles[(optimizer, depth)]
    assert_same_params(load_model(out), load_model(single))
    ours, theirs = step_losses(out), step_losses(single)
    assert list(ours) == [1, 2, 3]
    for s in ours:
        assert ours[s] == pytest.approx(theirs[s], rel=1e-5, abs=1e-6)
    m = summary["strategy_metrics"]
    assert m["schedule"] == name and m["chunks"] == 2 * procs and m["virtual_stages"] == 2
    v_shape = name in ("zbv", "dualpipev")
    assert m["chunks_of_rank"] == [[r, (2 * procs - 1 - r) if v_shape else r + procs] for r in range(procs)]
    # the activations each rank held: the schedule's stated count (test_schedule_virtual's formulas)
    planned = in_flight(stage_orders(name, procs, microbatches))
    assert m["peak_in_flight_per_stage"] == [planned[r] for r in range(procs)]
    assert 0.0 < m["bubble_fraction"] < 1.0


@pytest.mark.parametrize(
    "name,procs,sets,match",
    [
        ("interleaved-1f1b", 2, ["model.depth=4"], "4 chunks. Rule: .*divide the layers"),
        ("interleaved-1f1b", 2, ["microbatches=3", "model.depth=3"], "multiple of the ranks"),
        ("zbv", 2, ["virtual_stages=3", "model.depth=5"], "exactly 2 chunks per rank"),
        ("zbv", 2, ["checkpoint=always", "model.depth=3"], "split backward"),
        ("dualpipev", 2, ["partition=2,1,1", "model.depth=3"], "one layer count per chunk"),
        ("looped-bfs", 2, ["model.depth=3"], None),  # accepted: the check passes, nothing launched
    ],
)
def test_bad_virtual_input_refused_before_launch(name: str, procs: int, sets: list[str],
                                                  match: str | None) -> None:
    from polytrain.config import JobConfig
    from polytrain.strategies.base import make_strategy

    options = dict(s.split("=", 1) for s in sets if not s.startswith("model."))
    model_options = dict(s.removeprefix("model.").split("=", 1) for s in sets if s.startswith("model."))
    cfg = JobConfig(model="mlp", dataset="digits", batch_size=24,
                    model_options={k: int(v) for k, v in model_options.items()})
    strategy = make_strategy(name, options)
    if match is None:
        strategy.check(cfg, procs)
        return
    with pytest.raises(ConfigError, match=match):
        strategy.check(cfg, procs)
