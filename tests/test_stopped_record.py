"""Tier 1: the launcher's record of a stopped run (``write_stopped``) from the ranks' event files:
every whole line in time order (ties in file order), a last line cut by a kill left out."""

from __future__ import annotations

import json
from pathlib import Path

from polytrain.config import make_config
from polytrain.launch.rundir import write_stopped


def test_events_merged_in_time_order_and_a_cut_line_dropped(tmp_path: Path) -> None:
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    r0 = [{"event": "span", "rank": 0, "t": 0.1, "name": "a"},
          {"event": "step", "rank": 0, "t": 0.2, "step": 1, "loss": 1.0, "samples": 8},
          {"event": "span", "rank": 0, "t": 0.2, "name": "b"},
          {"event": "step", "rank": 0, "t": 0.4, "step": 2, "loss": 0.5, "samples": 16}]
    r1 = [{"event": "step", "rank": 1, "t": 0.2, "step": 1, "loss": 3.0, "samples": 8},
          {"event": "divergence", "rank": 1, "t": 0.3, "step": 2},
          {"event": "step", "rank": 1, "t": 0.35, "step": 2, "loss": 1.5, "samples": 16}]
    (ranks / "rank0.jsonl").write_text("".join(json.dumps(e) + "\n" for e in r0))
    (ranks / "rank1.jsonl").write_text("".join(json.dumps(e) + "\n" for e in r1)
                                       + '{"event": "span", "rank": 1, "t": 0.5, "na')
    cfg = make_config({"strategy": "allreduce", "procs": 2, "steps": 5, "out": str(tmp_path)})
    summary = write_stopped(tmp_path, cfg, {"reason": "interrupted"})
    merged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert merged == sorted(r0 + r1, key=lambda e: (e["t"], e["rank"]))  # stable: file order
    assert summary["steps_run"] == 2 and summary["final_loss"] == 1.0 and summary["samples"] == 16
    assert summary["divergence_warnings"] == [2] and summary["stopped"]["after_step"] == 2
