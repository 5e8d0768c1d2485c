"""Pipeline schedules as plain data (tier 1: pure logic, no processes).

Golden files ``tests/golden/schedules/{name}_P{P}_M{M}.txt`` hold ``format_grid`` output. After an
intended change, regenerate them and review the diff before committing:

    POLYTRAIN_REGEN_GOLDEN=1 pytest tests/test_schedule.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from polytrain.errors import ConfigError
from polytrain.schedules.registry import (
    SCHEDULES,
    Action,
    Grid,
    bubble_fraction,
    check_cost,
    dry_run,
    gpipe,
    in_flight,
    makespan,
    one_f_one_b,
    pipedream_async,
    schedule_names,
    simulate,
    stage_load,
    stage_orders,
    validate,
)
from polytrain.strategies.pipeline.draw import (
    draw_grid,
    format_grid,
    format_orders,
    parse_cost,
    parse_orders,
    schedule_cli,
)

GOLDEN = Path(__file__).parent / "golden" / "schedules"
SIZES = [(1, 1), (1, 3), (2, 1), (2, 4), (3, 2), (4, 4), (4, 8), (5, 7)]


def _times(grid: Grid) -> dict[Action, tuple[int, int]]:
    """(start, finish) of every action in a grid."""
    out: dict[Action, tuple[int, int]] = {}
    for row in grid.values():
        for t, a in enumerate(row):
            if a is not None:
                start, _ = out.get(a, (t, t))
                out[a] = (start, t + 1)
    return out


# --- actions -----------------------------------------------------------------------------------


def test_action_prints_and_parses_like_torch_pipelining() -> None:
    a = Action(1, "F", 3)
    assert str(a) == "1F3" and repr([a]) == "[1F3]" and a.cell == "F3"
    assert Action.parse("1F3") == a
    assert Action.parse("12B10") == Action(12, "B", 10)
    for bad in ("F3", "1X3", "1F", "", "-1F3"):
        with pytest.raises(ConfigError, match="<stage><op><micro-batch>"):
            Action.parse(bad)


def test_orders_text_round_trip() -> None:
    orders = stage_orders("1f1b", 3, 4)
    text = format_orders(orders)
    assert text.splitlines()[0] == "0: 0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3"
    assert parse_orders(text + "# a comment\n") == orders
    with pytest.raises(ConfigError, match="one per stage"):
        parse_orders("0: 0F0\n0: 0B0")


# --- builders, registry ------------------------------------------------------------------------


def test_registry_names_and_descriptions() -> None:
    assert schedule_names() == ["gpipe", "1f1b", "pipedream", "interleaved-1f1b", "looped-bfs", "zb-h1",
                                "zbv", "dualpipev"]
    assert all(spec.description for spec in SCHEDULES.values())
    assert SCHEDULES["pipedream"].flush is False and SCHEDULES["1f1b"].flush is True


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "pipedream"])
@pytest.mark.parametrize(("stages", "microbatches"), SIZES)
def test_every_builtin_schedule_validates_and_runs(name: str, stages: int, microbatches: int) -> None:
    orders = stage_orders(name, stages, microbatches)
    validate(orders, stages, microbatches)
    assert dry_run(orders) == makespan(simulate(orders))


@pytest.mark.parametrize("cost", [None, {"F": 1, "B": 2}, {"F": 2, "B": 3}])
@pytest.mark.parametrize(("stages", "microbatches"), SIZES)
def test_gpipe_bubble_is_textbook(stages: int, microbatches: int, cost: dict[str, int]) -> None:
    # (P-1)/(M+P-1) holds for any constant F and B costs, not only F=B.
    expected = (stages - 1) / (microbatches + stages - 1)
    assert bubble_fraction(gpipe(stages, microbatches, cost)) == pytest.approx(expected)


@pytest.mark.parametrize("cost", [None, {"F": 1, "B": 2}])
@pytest.mark.parametrize(("stages", "microbatches"), [(2, 4), (4, 8), (4, 4), (5, 7)])
def test_1f1b_has_gpipe_bubble_but_bounded_memory(
    stages: int, microbatches: int, cost: dict[str, int] | None
) -> None:
    assert bubble_fraction(one_f_one_b(stages, microbatches, cost)) == pytest.approx(
        bubble_fraction(gpipe(stages, microbatches, cost))
    )
    assert in_flight(stage_orders("gpipe", stages, microbatches)) == dict.fromkeys(
        range(stages), microbatches
    )
    peaks = in_flight(stage_orders("1f1b", stages, microbatches))
    assert all(peaks[s] <= stages - s for s in range(stages))
    assert peaks == {s: min(stages - s, microbatches) for s in range(stages)}


def test_simulated_grid_respects_dependencies_and_costs() -> None:
    cost = {"F": 1, "B": 2}
    for name in ("gpipe", "1f1b", "pipedream"):  # one chunk per rank, no W (others: test_schedule_virtual)
        grid = SCHEDULES[name].grid(4, 6, cost)
        times = _times(grid)
        for a, (start, finish) in times.items():
            assert finish - start == cost[a.op]  # one contiguous block per action
            if a.op == "F" and a.stage > 0:
                assert start >= times[Action(a.stage - 1, "F", a.microbatch)][1]
            if a.op == "B":
                assert start >= times[Action(a.stage, "F", a.microbatch)][1]
                if a.stage < 3:
                    assert start >= times[Action(a.stage + 1, "B", a.microbatch)][1]


def test_pipedream_is_figure_10() -> None:
    # Survey: "worker 2 runs B2, F5, B3, F6" (1-based) = stage 1 runs 1B1 1F4 1B2 1F5.
    row = " ".join(map(str, stage_orders("pipedream", 4, 8)[1]))
    assert "1B1 1F4 1B2 1F5" in row
    # Stage s admits P-s mini-batches before its first backward (PipeDream's NOAM on stage 0).
    orders = stage_orders("pipedream", 4, 8)
    assert [next(i for i, a in enumerate(orders[s]) if a.op == "B") for s in range(4)] == [
        4,
        3,
        2,
        1,
    ]
    # Steady state: from stage 0's first backward to its last forward, nobody idles.
    for stages, minibatches in [(2, 4), (4, 8), (3, 9)]:
        grid = pipedream_async(stages, minibatches)
        for t in range(2 * stages - 1, 2 * minibatches):
            assert all(grid[s][t] is not None for s in grid), (stages, minibatches, t)


# --- validator and dry run ---------------------------------------------------------------------


def test_validate_catches_swapped_forward_and_backward() -> None:
    orders = stage_orders("1f1b", 4, 8)
    assert orders[3][:2] == [Action(3, "F", 0), Action(3, "B", 0)]
    orders[3][:2] = orders[3][1::-1]  # the last stage now runs 3B0 before 3F0
    with pytest.raises(ConfigError, match=r"3B0 runs before 3F0 \(step 0: \[3B0\] 3F0 3F1"):
        validate(orders, 4, 8)


def test_validate_catches_missing_duplicate_and_foreign_actions() -> None:
    orders = stage_orders("gpipe", 2, 4)
    orders[1] = [a for a in orders[1] if str(a) != "1B2"]
    orders[0].append(Action(0, "F", 1))
    with pytest.raises(ConfigError) as err:
        validate(orders, 2, 4)
    assert "1B2 is missing" in str(err.value) and "0F1 appears 2 times" in str(err.value)
    orders = stage_orders("gpipe", 2, 4)
    orders[0][0] = Action(1, "F", 0)
    with pytest.raises(ConfigError, match=r"Stage 0 lists 1F0.*move 1F0 to row 1"):
        validate(orders, 2, 4)
    with pytest.raises(ConfigError, match="one row per stage"):
        validate(stage_orders("gpipe", 2, 4), 3, 4)
    with pytest.raises(ConfigError, match=r"0F4 micro-batch 4 is outside 0\.\.3"):
        validate(parse_orders("0: 0F0 0B0 0F4 0B4"), 1, 4)


def test_validate_requires_neighbours_to_keep_microbatch_order() -> None:
    orders = parse_orders("0: 0F0 0F1 0B0 0B1\n1: 1F1 1F0 1B0 1B1")
    with pytest.raises(ConfigError, match=r"stage 1 runs F in micro-batch order \[1, 0\]"):
        validate(orders, 2, 2)


def test_dry_run_names_stuck_stages_of_a_deadlock() -> None:
    # Well-formed (validate passes) but circular: stage 0 waits for 1B0 before it sends 0F1,
    # and stage 1 wants 0F1 before it runs 1B0.
    orders = parse_orders("0: 0F0 0B0 0F1 0B1\n1: 1F0 1F1 1B0 1B1")
    validate(orders, 2, 2)
    with pytest.raises(ConfigError) as err:
        dry_run(orders)
    msg = str(err.value)
    assert "Deadlock" in msg
    assert "stage 0 at step 1: 0B0 waits for 1B0 (stage 1 is stuck at step 1: 1F1)" in msg
    assert "stage 1 at step 1: 1F1 waits for 0F1 (stage 0 is stuck at step 1: 0B0)" in msg


def test_dry_run_reports_an_action_never_scheduled() -> None:
    with pytest.raises(ConfigError, match=r"1F0 waits for 0F0 \(never scheduled on stage 0\)"):
        dry_run(parse_orders("0: \n1: 1F0 1B0"))


def test_split_backward_weight_op() -> None:
    orders = parse_orders("0: 0F0 0F1 0B0 0B1 0W0 0W1\n1: 1F0 1B0 1F1 1B1 1W0 1W1")
    validate(orders, 2, 2)
    grid = simulate(orders, {"F": 1, "B": 1, "W": 1})
    assert _times(grid)[Action(0, "W", 0)][0] >= _times(grid)[Action(0, "B", 0)][1]
    assert in_flight(orders) == {0: 2, 1: 2}  # W still needs the stored activations
    with pytest.raises(ConfigError, match="0W0 runs before 0B0"):
        validate(parse_orders("0: 0F0 0W0 0B0"), 1, 1)


# --- measures, text, picture, CLI --------------------------------------------------------------


def test_stage_load_and_format_grid() -> None:
    grid = gpipe(2, 4)
    assert stage_load(grid)[0].busy == 8 and stage_load(grid)[0].idle == 2
    assert format_grid(grid) == (
        "time     0  1  2  3  4  5  6  7  8  9\n"
        "stage 0  F0 F1 F2 F3 .  .  B3 B2 B1 B0\n"
        "stage 1  .  F0 F1 F2 F3 B3 B2 B1 B0 .\n"
    )


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "pipedream"])
@pytest.mark.parametrize(("stages", "microbatches"), [(2, 4), (4, 8)])
def test_golden_grids(name: str, stages: int, microbatches: int) -> None:
    path = GOLDEN / f"{name}_P{stages}_M{microbatches}.txt"
    text = format_grid(SCHEDULES[name].grid(stages, microbatches))
    if os.environ.get("POLYTRAIN_REGEN_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.read_text() == text, f"regenerate with POLYTRAIN_REGEN_GOLDEN=1 if intended: {path}"


def test_costs() -> None:
    assert check_cost(None) == {"F": 1, "B": 1, "W": 1}
    assert parse_cost("F=1,B=2") == {"F": 1, "B": 2}
    with pytest.raises(ConfigError, match="whole number of slots"):
        check_cost({"B": 0})
    with pytest.raises(ConfigError, match="Unknown op 'X'"):
        parse_cost("X=2")
    with pytest.raises(ConfigError, match="F=1,B=2"):
        parse_cost("F=one")


def test_schedule_cli_text_and_png(tmp_path: Path) -> None:
    text = schedule_cli("gpipe", 2, 4, tmp_path / "gpipe.png")
    assert format_grid(gpipe(2, 4)) in text
    assert "bubble fraction: 20.0%" in text
    assert "peak in flight (activations held) per stage: 0: 4, 1: 4" in text
    assert (tmp_path / "gpipe.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "mini-batches" in schedule_cli("pipedream", 2, 2, None, {"F": 1, "B": 2})


@pytest.mark.parametrize(
    ("name", "stages", "microbatches", "match"),
    [
        ("gpip", 4, 8, "Valid choices: 1f1b, dualpipev, gpipe, interleaved-1f1b, .*Did you mean 'gpipe'"),
        ("gpipe", 0, 8, "stages is 0. Rule: stages must be a whole number >= 1"),
        ("1f1b", 4, 0, "microbatches is 0"),
        ("pipedream", 2, -1, "minibatches is -1"),
    ],
)
def test_schedule_cli_rejects_bad_input(name: str, stages: int, microbatches: int, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        schedule_cli(name, stages, microbatches, None)


def test_draw_rejects_empty_grid(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="Nothing to draw"):
        draw_grid({}, tmp_path / "x.png", "empty")
