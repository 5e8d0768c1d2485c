"""Reports: run directories written per docs/run-directory.md, then read back and drawn."""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from polytrain.errors import ConfigError
from polytrain.report import (
    chrome_trace,
    flatten_lane,
    load_run,
    loss_curve,
    time_to_accuracy,
    timeline_rows,
    write_report,
)
from polytrain.report.timeline import RankRow, window

Event = dict[str, Any]
BATCH = 32

# --------------------------------------------------------------------------- fixture generator


def span(rank: int, name: str, cat: str, start: float, end: float, step: int) -> Event:
    return {
        "event": "span",
        "rank": rank,
        "t": end,
        "name": name,
        "cat": cat,
        "start": start,
        "end": end,
        "step": step,
    }


def allreduce_events(world: int, steps: int, rng: random.Random) -> list[Event]:
    """Data parallel: forward, backward with an all-reduce overlapping it (DDP), optimizer."""
    events: list[Event] = []
    for rank in range(world):
        t = 0.002 * rank
        for step in range(1, steps + 1):
            f, b, a, o = (t + 0.01, t + 0.03, t + 0.036, t + 0.04)
            events += [
                span(rank, "forward", "compute", t, f, step),
                span(rank, "backward", "compute", f, b, step),
                span(rank, "allreduce", "comm", t + 0.02, a, step),
                span(rank, "optimizer", "compute", a, o, step),
            ]
            loss = 2.3 * math.exp(-step / 8) + rng.uniform(0, 0.05)
            events.append(
                {
                    "event": "step",
                    "rank": rank,
                    "t": o,
                    "step": step,
                    "loss": loss,
                    "samples": step * BATCH * world,
                }
            )
            if rank == 0 and step % 4 == 0:
                events.append(
                    {
                        "event": "eval",
                        "rank": 0,
                        "t": o + 0.001,
                        "step": step,
                        "accuracy": min(0.99, 0.5 + step * 0.04),
                        "loss": loss,
                    }
                )
            t = o + 0.005  # idle: data loading
    return events


def ps_events(steps: int, rng: random.Random) -> list[Event]:
    """Parameter server: rank 0 serves (no step events), rank 1 works."""
    events: list[Event] = []
    t = 0.0
    for step in range(1, steps + 1):
        events += [
            span(1, "forward", "compute", t, t + 0.01, step),
            span(1, "backward", "compute", t + 0.01, t + 0.03, step),
            span(1, "push", "comm", t + 0.03, t + 0.035, step),
            span(0, "recv", "comm", t + 0.03, t + 0.035, step),
            span(0, "apply", "compute", t + 0.035, t + 0.04, step),
            span(0, "send", "comm", t + 0.04, t + 0.043, step),
            span(1, "pull", "comm", t + 0.04, t + 0.043, step),
        ]
        loss = 2.3 * math.exp(-step / 10) + rng.uniform(0, 0.05)
        events.append(
            {"event": "step", "rank": 1, "t": t + 0.043, "step": step, "loss": loss, "samples": step * BATCH}
        )
        t += 0.05
    events.append({"event": "eval", "rank": 1, "t": t, "step": steps, "accuracy": 0.8, "loss": 0.7})
    return events


def make_summary(strategy: str, roles: list[str], events: list[Event]) -> dict[str, Any]:
    steps = max((e["step"] for e in events if e["event"] == "step"), default=0)
    samples = max((e["samples"] for e in events if e["event"] == "step"), default=0)
    wall = max(e["t"] for e in events)
    per_rank = [
        {
            "rank": r,
            "role": role,
            "steps": steps if role == "worker" else 0,
            "bytes_sent": 150_000 * (r + 1),
            "bytes_by_op": {"allreduce": 150_000},
            "bytes_by_peer": {"0": 150_000},
            "peak_rss_bytes": (300 + 40 * r) << 20,
            "busy_s": wall * 0.8,
        }
        for r, role in enumerate(roles)
    ]
    sent = sum(r["bytes_sent"] for r in per_rank)
    return {
        "strategy": strategy,
        "world_size": len(roles),
        "steps": steps,
        "samples": samples,
        "wall_s": wall,
        "throughput_samples_per_s": samples / wall,
        "final_loss": next(e["loss"] for e in reversed(events) if e["event"] == "step"),
        "eval": {"accuracy": 0.9375, "loss": 0.21},
        "bytes_sent": sent,
        "bytes_sent_per_sample": sent / samples,
        "peak_rss_bytes": (340 << 20),
        "per_rank": per_rank,
        "strategy_metrics": {
            "staleness": {"max": 1, "histogram": {"0": 10, "1": 2}},
            "per_step_ms": [round(10 + i * 0.5, 2) for i in range(40)],
        },
        "config": {"strategy": strategy},
        "testbed": None,
        "polytrain_version": "0.1.0",
        "torch_version": "2.13.0",
    }


def write_run(run: Path, strategy: str, roles: list[str], events: list[Event]) -> dict[str, Any]:
    """A run directory: config.toml, metrics.jsonl, ranks/rank{R}.jsonl, summary.json."""
    (run / "ranks").mkdir(parents=True)
    events = sorted(events, key=lambda e: (e["t"], e["rank"]))
    (run / "config.toml").write_text(f'strategy = "{strategy}"\n')
    (run / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    for rank in range(len(roles)):
        mine = [json.dumps(e) + "\n" for e in events if e["rank"] == rank]
        (run / "ranks" / f"rank{rank}.jsonl").write_text("".join(mine))
    summary = make_summary(strategy, roles, events)
    (run / "summary.json").write_text(json.dumps(summary))
    return summary


def write_compare(root: Path, steps: int = 16) -> Path:
    """A compare directory: allreduce (2 workers) and ps (1 server + 1 worker)."""
    rng = random.Random(0)
    a = write_run(root / "allreduce", "allreduce", ["worker", "worker"], allreduce_events(2, steps, rng))
    p = write_run(root / "ps", "ps", ["server", "worker"], ps_events(steps, rng))
    (root / "compare.json").write_text(json.dumps({"strategies": [a, p], "target_accuracy": 0.75}))
    return root


@pytest.fixture(scope="module")
def compare_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    root = write_compare(tmp_path_factory.mktemp("cmp"))
    return root, write_report(root)


# --------------------------------------------------------------------------- write_report


def test_compare_report_writes_every_file(compare_report: tuple[Path, list[Path]]) -> None:
    root, files = compare_report
    names = {f.name for f in files}
    assert names == {
        "loss_time.png",
        "loss_samples.png",
        "accuracy_time.png",
        "throughput.png",
        "bytes_per_sample.png",
        "memory.png",
        "timeline_allreduce.png",
        "timeline_ps.png",
        "timeline_allreduce.json",
        "timeline_ps.json",
        "report.md",
    }
    for f in files:
        assert f.parent == root and f.stat().st_size > 0
        if f.suffix == ".png":
            assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_md_has_table_rows_and_image_links(compare_report: tuple[Path, list[Path]]) -> None:
    root, _ = compare_report
    md = (root / "report.md").read_text()
    assert "| Strategy | World | Steps | Throughput |" in md
    for strategy in ("allreduce", "ps"):
        row = next(line for line in md.splitlines() if line.startswith(f"| {strategy} |"))
        assert "samples/s" in row and "MiB" in row and "93.8 %" in row
        assert "/sample" in row and "Time to 75 %" in md
    links = [line[line.index("](") + 2 : -1] for line in md.splitlines() if line.startswith("![")]
    assert "loss_time.png" in links and "timeline_ps.png" in links
    assert all((root / link).is_file() for link in links)
    assert "| staleness.histogram.0 | 10 |" in md
    assert "40 values: min 10, mean 19.75, max 29.5" in md


def test_single_run_report(tmp_path: Path) -> None:
    write_run(tmp_path / "run", "allreduce", ["worker", "worker"], allreduce_events(2, 5, random.Random(1)))
    names = {f.name for f in write_report(tmp_path / "run")}
    assert {"timeline.png", "timeline.json", "report.md", "memory.png"} <= names
    md = (tmp_path / "run" / "report.md").read_text()
    assert md.startswith("# polytrain run: allreduce") and "Time to" not in md


def test_regression_run_with_loss_only_evaluations_gets_a_report(tmp_path: Path) -> None:
    """lasso/strads evaluate a loss and no accuracy: the report is written, without eval points."""
    events = allreduce_events(1, 5, random.Random(2))
    events += [{"event": "eval", "rank": 0, "t": 0.1 * s, "step": s, "loss": 1.0 / s} for s in (2, 4)]
    write_run(tmp_path / "run", "strads", ["worker"], events)
    names = {f.name for f in write_report(tmp_path / "run")}
    assert "report.md" in names and "timeline.png" in names


def test_report_from_rank_files_tolerates_cut_last_line(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_run(run, "allreduce", ["worker", "worker"], allreduce_events(2, 3, random.Random(2)))
    (run / "metrics.jsonl").unlink()  # the merge never happened
    with (run / "ranks" / "rank1.jsonl").open("a") as f:
        f.write('{"event": "step", "rank": 1, "t": 9.')  # killed mid-write
    events = load_run(run).events
    assert {e["rank"] for e in events} == {0, 1}
    assert all(a["t"] <= b["t"] for a, b in itertools.pairwise(events))


# --------------------------------------------------------------------------- timeline data


def assert_lanes_ok(row: RankRow) -> None:
    for boxes in row.lanes.values():
        assert all(b.duration > 0 for b in boxes)
        for a, b in itertools.pairwise(boxes):
            assert a.end <= b.start + 1e-12, (row.rank, a, b)


def test_timeline_rows_one_per_rank_without_overlap() -> None:
    events = allreduce_events(2, 6, random.Random(0))
    rows = timeline_rows(events, world_size=2, roles={0: "worker", 1: "worker"})
    assert [r.rank for r in rows] == [0, 1]
    for row in rows:
        assert_lanes_ok(row)
        assert {b.kind for b in row.lanes["compute"]} == {"forward", "backward", "optimizer"}
        assert {b.name for b in row.lanes["comm"]} == {"allreduce"}
        assert len(row.lanes["comm"]) == 6  # the all-reduce overlaps backward: its own lane
    ps_rows = timeline_rows(ps_events(4, random.Random(0)), world_size=2)
    assert [r.rank for r in ps_rows] == [0, 1] and ps_rows[0].boxes()  # server has spans


def test_rank_without_events_still_gets_a_row() -> None:
    rows = timeline_rows([span(0, "forward", "compute", 0, 1, 1)], world_size=3)
    assert [r.rank for r in rows] == [0, 1, 2] and rows[2].boxes() == []


def test_nested_spans_innermost_wins() -> None:
    """A `step` span around forward/backward, an optimizer partly overlapping backward."""
    spans = [
        span(0, "step", "compute", 0.0, 3.0, 1),
        span(0, "forward", "compute", 0.0, 1.0, 1),
        span(0, "backward", "compute", 1.0, 2.0, 1),
        span(0, "optimizer", "compute", 1.5, 2.5, 1),
    ]
    boxes = flatten_lane(spans)
    got = [(b.name, b.start, b.end) for b in boxes]
    assert got == [("forward", 0.0, 1.0), ("backward", 1.0, 1.5), ("optimizer", 1.5, 2.5), ("step", 2.5, 3.0)]
    row = timeline_rows(spans)[0]
    assert_lanes_ok(row)
    assert row.busy_s() == pytest.approx(3.0)


def test_comm_inside_compute_goes_to_its_own_lane() -> None:
    spans = [
        span(0, "backward", "compute", 0.0, 2.0, 1),
        span(0, "send", "comm", 0.5, 0.8, 1),
        span(0, "recv", "comm", 0.7, 1.0, 1),
    ]
    row = timeline_rows(spans)[0]
    assert [(b.name, b.start, b.end) for b in row.lanes["compute"]] == [("backward", 0.0, 2.0)]
    assert [(b.name, b.start, b.end) for b in row.lanes["comm"]] == [("send", 0.5, 0.7), ("recv", 0.7, 1.0)]
    assert row.lanes["comm"][0].kind == "comm"


def test_window_limits_boxes() -> None:
    spans = [span(0, "forward", "compute", i, i + 0.5, i) for i in range(100)]
    rows = timeline_rows(spans)
    shown, cut = window(rows, 10)
    assert cut == 10 and len(shown[0].boxes()) == 10
    assert window(rows, 1000) == (rows, None)


def test_chrome_trace_is_valid(compare_report: tuple[Path, list[Path]]) -> None:
    root, _ = compare_report
    trace = json.loads((root / "timeline_ps.json").read_text())
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {0: "rank 0 (server)", 1: "rank 1 (worker)"}
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1}
    source = [e for e in load_run(root / "ps").events if e["event"] == "span"]
    assert len(spans) == len(source)
    first = min(source, key=lambda e: (e["start"], e["rank"], e["name"]))
    x = next(e for e in spans if e["pid"] == first["rank"] and e["name"] == first["name"])
    assert x["ts"] == pytest.approx(first["start"] * 1e6)
    assert x["dur"] == pytest.approx((first["end"] - first["start"]) * 1e6)
    assert all(e["tid"] in (0, 1) and e["dur"] >= 0 for e in spans)
    assert x["args"] == {"step": first["step"]}  # extra span fields travel as args


def test_chrome_trace_skips_nan_loss() -> None:
    events = [{"event": "step", "rank": 0, "t": 1.0, "step": 1, "loss": float("nan"), "samples": 1}]
    trace = chrome_trace(events, {"strategy": "x", "world_size": 1})
    json.dumps(trace, allow_nan=False)


# --------------------------------------------------------------------------- curves, accuracy


def test_loss_is_mean_over_reporting_ranks() -> None:
    events = [
        {"event": "step", "rank": r, "t": 1.0 + r, "step": 1, "loss": loss, "samples": 64}
        for r, loss in ((1, 1.0), (2, 3.0))
    ]
    (p,) = loss_curve(events)
    assert (p.loss, p.t, p.samples, p.ranks) == (2.0, 3.0, 64, 2)


def test_time_to_accuracy() -> None:
    events = [
        {"event": "eval", "rank": 0, "t": t, "step": s, "accuracy": a}
        for t, s, a in ((1.0, 1, 0.5), (2.5, 2, 0.91), (4.0, 3, 0.97))
    ]
    events.insert(0, {"event": "step", "rank": 0, "t": 0.5, "step": 1, "loss": 1.0})
    assert time_to_accuracy(events, 0.9) == 2.5
    assert time_to_accuracy(events, 0.97) == 4.0
    assert time_to_accuracy(events, 0.99) is None
    assert time_to_accuracy([], 0.5) is None
    with pytest.raises(ConfigError, match="fraction in"):
        time_to_accuracy(events, 95)
