"""A long ``pipedream`` run keeps its send buffers and its RSS bounded (issue 16 item 3).

On gloo a send reports itself complete only once waited on, so before the outbox honoured the
acks that travel with every message, a stream schedule kept every send buffer of its segment
(the whole run without checkpoints). Here a few thousand tiny steps: the outstanding sends stay
at the schedule's messages in flight and the slope of RSS against steps after warm-up is ~0.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.test_bounded_state import after_warm_up, resources, slope


@pytest.mark.slow
def test_long_pipedream_run_keeps_outstanding_sends_and_rss_flat(tmp_path: Path) -> None:
    run = tmp_path / "pipedream"
    steps = 2000
    r = run_cli("train", "--strategy", "pipedream", "--procs", "2", "--model", "mlp",
                "--set", "model.hidden=16", "--batch-size", "8", "--optimizer", "sgd",
                "--lr", "0.01", "--steps", str(steps), "--out", str(run), "--no-report")
    assert r.returncode == 0, r.stderr
    by_rank = resources(run)
    assert sorted(by_rank) == [0, 1]
    for rank, samples in by_rank.items():
        points = after_warm_up(samples, "step")
        assert len(points) >= 3, f"rank {rank}: too few samples {samples}"
        per_step = slope(points)
        # one buffer kept per message: ≥ 2 · (8·16·4 + 24) bytes a step (the exact check: outstanding)
        assert per_step < 400, f"rank {rank}: RSS grows {per_step:.0f} bytes per step: {points}"
        assert max(s["outstanding_sends"] for s in samples) <= 4
    summary = json.loads((run / "summary.json").read_text())
    peaks = summary["strategy_metrics"]["peak_outstanding_sends_per_stage"]
    assert len(peaks) == 2 and max(peaks) <= 4, peaks
