"""Reports from bad input (malformed run directories, missing paths: one ConfigError each), the
console views, units, and the TensorBoard export; the run-directory generator: tests/test_report.py."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from polytrain.errors import ConfigError
from polytrain.report import format_summary, load_run, loss_curve, summary_table, write_report
from polytrain.report.table import flatten_metrics
from polytrain.report.units import human_bytes, human_rate, human_seconds
from tests.test_report import allreduce_events, make_summary, ps_events, write_compare, write_run

# --------------------------------------------------------------------------- bad input


def _no_summary(run: Path) -> None:
    (run / "summary.json").unlink()


def _bad_json(run: Path) -> None:
    (run / "summary.json").write_text("{not json")


def _summary_not_object(run: Path) -> None:
    (run / "summary.json").write_text("[1, 2]")


def _summary_without_strategy(run: Path) -> None:
    (run / "summary.json").write_text('{"world_size": 2}')


def _bad_event_line(run: Path) -> None:
    with (run / "metrics.jsonl").open("a") as f:
        f.write("garbage\n")


def _span_without_end(run: Path) -> None:
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"event": "span", "rank": 0, "t": 1, "name": "f", "cat": "compute", "start": 0}\n')


def _no_events(run: Path) -> None:
    (run / "metrics.jsonl").unlink()
    for f in (run / "ranks").iterdir():
        f.unlink()


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (_no_summary, "no summary.json or compare.json"),
        (_bad_json, "not valid JSON"),
        (_summary_not_object, "must be a JSON object"),
        (_summary_without_strategy, "lacks required key"),
        (_bad_event_line, r"metrics.jsonl:\d+ is not a JSON event"),
        (_span_without_end, "needs field"),
        (_no_events, "no metrics.jsonl and no ranks"),
    ],
)
def test_malformed_run_dir_raises_config_error(tmp_path: Path, breakage: Any, message: str) -> None:
    run = tmp_path / "run"
    write_run(run, "allreduce", ["worker"], allreduce_events(1, 2, random.Random(0)))
    breakage(run)
    with pytest.raises(ConfigError, match=message):
        write_report(run)


def test_missing_paths_raise_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        write_report(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        write_report(tmp_path / "file")


def test_compare_missing_strategy_dir(tmp_path: Path) -> None:
    root = write_compare(tmp_path, steps=2)
    for f in sorted((root / "ps").rglob("*"), reverse=True):
        f.rmdir() if f.is_dir() else f.unlink()
    (root / "ps").rmdir()
    with pytest.raises(ConfigError, match="no subdirectory 'ps/'"):
        write_report(root)


# --------------------------------------------------------------------------- console, units


def render(renderable: Any) -> str:
    console = Console(record=True, width=160, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_console_views() -> None:
    summary = make_summary("ps", ["server", "worker"], ps_events(3, random.Random(0)))
    text = render(summary_table([summary, {**summary, "strategy": "allreduce"}]))
    assert "allreduce" in text and "samples/s" in text and "MiB" in text
    panel = render(format_summary(summary, run_dir="runs/x"))
    for piece in ("93.8 %", "samples/s", "KiB", "340 MiB", "runs/x", "ms"):
        assert piece in panel


def test_units_and_flatten() -> None:
    assert human_bytes(1536) == "1.50 KiB" and human_bytes(5 << 20) == "5.00 MiB"
    assert human_bytes(12) == "12 B" and human_bytes(None) == "—"
    assert human_seconds(0.0123) == "12.3 ms" and human_seconds(200) == "3 min 20 s"
    assert human_rate(1234.5) == "1,234 samples/s"
    assert flatten_metrics({"a": {"b": 1, "c": [1, 2]}, "d": 0.5}) == [
        ("a.b", "1"),
        ("a.c", "[1, 2]"),
        ("d", "0.5"),
    ]


def test_moving_average_is_centred() -> None:
    from polytrain.report.curves import moving_average

    assert moving_average([0.0, 3.0, 9.0, 9.0, 12.0], 5) == [0.0, 4.0, 6.6, 10.0, 12.0]


def test_tensorboard_export_holds_the_loss_curve(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="the optional tensorboard package is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from polytrain.report.tensorboard import export_tensorboard

    events = allreduce_events(2, 12, random.Random(0))
    write_run(tmp_path / "run", "allreduce", ["worker", "worker"], events)
    logdir = export_tensorboard(tmp_path / "run")
    acc = EventAccumulator(str(logdir))
    acc.Reload()
    losses = acc.Scalars("allreduce/train_loss")
    assert [s.step for s in losses] == list(range(1, 13))
    expected = {p.step: p.loss for p in loss_curve(load_run(tmp_path / "run").events)}
    assert all(abs(s.value - expected[s.step]) < 1e-5 for s in losses)
