"""Schedules with virtual stages and a split backward, as plain data (tier 1: no processes).

Golden files ``tests/golden/schedules/{name}_P4_M8_V{V}.txt`` hold ``format_orders`` output (each
rank's action list, what the executor runs). Regenerate after an intended change, review the diff:

    POLYTRAIN_REGEN_GOLDEN=1 pytest tests/test_schedule_virtual.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from polytrain.errors import ConfigError
from polytrain.schedules.checks import chunk_rows, full_backwards
from polytrain.schedules.registry import (
    SCHEDULES,
    Action,
    dry_run,
    get_schedule,
    in_flight,
    makespan,
    simulate,
    stage_orders,
    validate,
)
from polytrain.schedules.virtual import chunk_rank
from polytrain.strategies.pipeline.draw import format_grid, format_orders, parse_orders, schedule_cli

GOLDEN = Path(__file__).parent / "golden" / "schedules"
NEW = ["interleaved-1f1b", "looped-bfs", "zb-h1", "zbv", "dualpipev"]
COSTS = [(1, 1, 1), (2, 2, 1), (3, 2, 1), (1, 2, 1)]  # (F, B, W) per chunk, uniform over chunks


def _idle(name: str, p: int, m: int, f: int, b: int, w: int) -> set[int]:
    """Idle slots per rank (the set of distinct values) of ``name`` with costs F, B, W per chunk."""
    orders = stage_orders(name, p, m)
    grid = simulate(orders, {"F": f, "B": b, "W": w})
    return {row.count(None) for row in grid.values()}


@pytest.mark.parametrize("name", NEW)
def test_valid_and_no_deadlock_for_all_small_sizes(name: str) -> None:
    """Every P <= 8, M <= 32 the schedule accepts validates and dry-runs; the rest are refused."""
    spec = get_schedule(name)
    for p in range(1, 9):
        for m in range(1, 33):
            if spec.placement == "loop" and name == "interleaved-1f1b" and m % p:
                with pytest.raises(ConfigError, match="multiple of the ranks"):
                    stage_orders(name, p, m)
                continue
            orders = stage_orders(name, p, m)
            validate(orders, p, m)
            assert dry_run(orders) > 0
            v = spec.default_virtual
            homes = chunk_rows(orders)
            assert sorted(homes) == list(range(p * v))
            assert all(homes[c] == chunk_rank(c, p, spec.placement) for c in homes)


@pytest.mark.parametrize("p", [2, 3, 4, 8])
@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("fbw", COSTS)
def test_bubble_formulas(p: int, m: int, fbw: tuple[int, int, int]) -> None:
    """Per-rank idle with uniform costs per chunk (F, B = input gradient, W; full backward B+W):

    - 1f1b (one chunk per rank, B whole): (P−1)(F+B);
    - interleaved-1f1b: (P−1)(F+B) per chunk, i.e. (P−1)(F_stage+B_stage)/V;
    - zb-h1: (P−1)(F+B−W), the ZB paper's (P−1)(F+B_full−2W), when W <= B;
    - dualpipev: (P−1)(F+B−W) per chunk for M >= 2P and F >= B (see docs/schedules.md on the
      DualPipe table; with B > F the order, run without DualPipe's overlapped F&B, idles more and
      follows no closed form).
    """
    f, b, w = fbw
    mm = m * p  # M a multiple of P, >= P
    assert _idle("1f1b", p, mm, f, b + w, w) == {(p - 1) * (f + b + w)}
    assert _idle("interleaved-1f1b", p, mm, f, b + w, w) == {(p - 1) * (f + b + w)}
    if w <= b:
        assert _idle("zb-h1", p, mm, f, b, w) == {(p - 1) * (f + b - w)}
    if mm >= 2 * p and f >= b:
        assert _idle("dualpipev", p, mm, f, b, w) == {(p - 1) * (f + b - w)}


@pytest.mark.parametrize("p", [2, 4, 8])
def test_zbv_bubble_with_equal_costs(p: int) -> None:
    """ZB-V with F = B = W: (P−1)·F idle per rank once M >= 2P (a 1F1B over 2P chunks idles 2(P−1)(F+B+W))."""
    for c in (1, 2):
        assert _idle("zbv", p, 2 * p, c, c, c) == {(p - 1) * c}


@pytest.mark.parametrize("p", [1, 2, 4, 8])
@pytest.mark.parametrize("m", [1, 2, 4, 8, 16])
def test_in_flight_is_each_schedules_stated_count(p: int, m: int) -> None:
    """Peak (chunk, micro-batch) activations held per rank, freed by the last of B and W:

    interleaved: warm-up + 1 = 2(P−1−r) + (V−1)P + 1 (capped at MV); looped-bfs: all MV;
    zb-h1: P on every rank (1F1B's stage-0 peak) capped at M; zbv: 2P chunks (1F1B's P stages);
    dualpipev: 2P + 1 (DualPipe's table: PP + 1, PP = 2P chunks)."""
    v = 2
    if m % p == 0:
        got = in_flight(stage_orders("interleaved-1f1b", p, m))
        assert got == {r: min(2 * (p - 1 - r) + (v - 1) * p + 1, m * v) for r in range(p)}
    assert in_flight(stage_orders("looped-bfs", p, m)) == dict.fromkeys(range(p), m * v)
    assert in_flight(stage_orders("zb-h1", p, m)) == dict.fromkeys(range(p), min(p, m))
    if m >= 2 * p:
        assert in_flight(stage_orders("zbv", p, m)) == dict.fromkeys(range(p), 2 * p)
        assert in_flight(stage_orders("dualpipev", p, m)) == dict.fromkeys(range(p), 2 * p + 1)


def test_split_backward_shapes() -> None:
    """zb-h1 and zbv split every backward; dualpipev splits some (the rest run whole); the
    interleaved and looped schedules split none."""
    for name in NEW:
        orders = stage_orders(name, 4, 8)
        acts = [a for row in orders.values() for a in row]
        ws = sum(a.op == "W" for a in acts)
        full = full_backwards(orders)
        if name in ("zb-h1", "zbv"):
            assert ws == sum(a.op == "B" for a in acts) and not full
        elif name == "dualpipev":
            assert 0 < ws < sum(a.op == "B" for a in acts) and full
        else:
            assert ws == 0 and not full


def test_w_waits_for_its_b_and_frees_the_activations() -> None:
    orders = {0: [Action(0, "F", 0), Action(0, "W", 0), Action(0, "B", 0)]}
    with pytest.raises(ConfigError, match="runs before"):
        validate(orders, 1, 1)
    ok = {0: [Action(0, "F", 0), Action(0, "F", 1), Action(0, "B", 0), Action(0, "B", 1),
              Action(0, "W", 0), Action(0, "W", 1)]}
    validate(ok, 1, 2)
    assert in_flight(ok) == {0: 2}
    assert makespan(simulate(ok, {"F": 1, "B": 1, "W": 3})) == 10


def test_a_chunk_lives_on_one_rank() -> None:
    orders = stage_orders("interleaved-1f1b", 2, 2)
    moved = {0: orders[0] + [Action(3, "F", 0)], 1: orders[1]}
    with pytest.raises(ConfigError, match="Chunk 3 has actions on rows"):
        validate(moved, 2, 2)


@pytest.mark.parametrize(
    "name,p,m,v,match",
    [
        ("interleaved-1f1b", 4, 6, 2, "microbatches must be a multiple of the ranks.*microbatches=8"),
        ("interleaved-1f1b", 4, 8, 1, "needs >= 2 chunks per rank"),
        ("zbv", 4, 8, 3, "exactly 2 chunks per rank"),
        ("dualpipev", 2, 4, 1, "exactly 2 chunks per rank"),
        ("zb-h1", 4, 8, 2, "one chunk per rank"),
        ("1f1b", 4, 8, 2, "one chunk per rank"),
        ("looped-bfs", 2, 4, 0, "virtual_stages is 0"),
    ],
)
def test_bad_virtual_and_microbatches_refused(name: str, p: int, m: int, v: int, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        get_schedule(name).build(p, m, v)


def test_interleaved_with_three_chunks() -> None:
    orders = stage_orders("interleaved-1f1b", 4, 8, 3)
    validate(orders, 4, 8)
    assert max(len({a.stage for a in row}) for row in orders.values()) == 3
    assert {row.count(None) for row in simulate(orders).values()} == {(4 - 1) * 2}


@pytest.mark.parametrize("name", NEW)
def test_golden_orders(name: str) -> None:
    v = get_schedule(name).default_virtual
    path = GOLDEN / f"{name}_P4_M8_V{v}.txt"
    orders = stage_orders(name, 4, 8)
    text = format_orders(orders)
    if os.environ.get("POLYTRAIN_REGEN_GOLDEN"):
        path.write_text(text)
    assert path.read_text() == text, f"regenerate with POLYTRAIN_REGEN_GOLDEN=1 if intended: {path}"
    assert parse_orders(text) == orders


def test_grid_and_cli_name_chunks() -> None:
    grid = SCHEDULES["interleaved-1f1b"].grid(2, 2)
    assert "2F0" in format_grid(grid)  # rank 0 runs chunks 0 and 2: cells carry the chunk
    text = schedule_cli("zbv", 2, 4, virtual=2, cost={"F": 1, "B": 1, "W": 1})
    assert "V=2 chunks per rank" in text and "W=1" in text and "1W0" in text
