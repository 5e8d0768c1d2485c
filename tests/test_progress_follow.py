"""Tier 1: one JSON-lines follower (runtime/progress.TailJSONL) serves `train`'s bar and `polytrain
aco`'s: complete lines are handed over once, a line still being written waits, stop reads the rest."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from polytrain.aco.progress import FollowIterations
from polytrain.runtime.progress import FollowProgress


class _Bar:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.closed = False

    def __call__(self, row: dict[str, Any]) -> None:
        self.rows.append(row)

    def close(self) -> None:
        self.closed = True


def test_aco_follower_hands_each_complete_row_once_and_closes_the_bar(tmp_path: Path) -> None:
    path = tmp_path / "iterations.jsonl"
    bar = _Bar()
    with FollowIterations(path, bar), path.open("w") as f:  # type: ignore[arg-type]
        f.write(json.dumps({"iteration": 1}) + "\n" + '{"iteration": ')
        f.flush()
        time.sleep(0.5)
        assert [r["iteration"] for r in bar.rows] == [1]  # the half-written row waits
        f.write("2}\n" + json.dumps({"iteration": 3}) + "\n")
    assert [r["iteration"] for r in bar.rows] == [1, 2, 3] and bar.closed


def test_train_bar_follows_step_events(tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in (
        {"event": "start", "first_step": 1}, {"event": "span", "name": "x"},
        {"event": "step", "step": 3, "loss": 0.5})))
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    with FollowProgress(path, 5, "gpipe", console):
        pass
    assert "3/5" in out.getvalue() and "0.5000" in out.getvalue()
