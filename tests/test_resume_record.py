"""A rewound record (resume, restart) holds each step once and continues the run's clock."""

from __future__ import annotations

import json
from pathlib import Path

from polytrain.metrics.recorder import Recorder


def _events(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_rewind_drops_later_steps_and_continues_the_clock(tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    first = Recorder(0, path, fresh=True)
    first.emit("process", pid=1)
    for step in range(1, 7):
        first.step(step, 1.0 / step, samples=step * 8)
        with first.span("forward", step=step):
            pass
    first.emit("checkpoint", step=3)
    first.close()
    again = Recorder(0, path)  # the resumed process appends to the same file
    again.emit("process", pid=2)
    again.rewind(3, t=100.0)
    again.rewind(3, t=100.0)  # a second restore of the same checkpoint changes nothing
    again.start_clock()
    assert again.now() >= 100.0
    for step in range(4, 6):
        again.step(step, 0.5, samples=step * 8)
    evs = again.events
    again.close()
    assert evs == _events(path)
    assert [e["step"] for e in evs if e["event"] == "step"] == [1, 2, 3, 4, 5]
    assert [e["step"] for e in evs if e["event"] == "span"] == [1, 2, 3]
    assert [e["pid"] for e in evs if e["event"] == "process"] == [1, 2]
    assert [e["from_step"] for e in evs if e["event"] == "resume"] == [3]
    assert all(e["t"] >= 100.0 for e in evs if e["event"] == "step" and e["step"] > 3)
    assert again.resumed == {"from_step": 3, "t": 100.0, "samples": 24, "bytes_sent": 0}


def test_a_fresh_record_starts_empty_and_a_half_line_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "rank1.jsonl"
    path.write_text('{"event": "step", "rank": 1, "t": 0.1, "step": 1, "loss": 1.0, "samples": 4}\n'
                    '{"event": "step", "rank": 1, "t": 0.2, "st')  # a killed process's last write
    rec = Recorder(1, path)
    rec.rewind(1)
    assert rec.t_base == 0.1
    rec.close()
    assert [e["event"] for e in _events(path)] == ["step", "resume"]
    Recorder(1, path, fresh=True).close()
    assert path.read_text() == ""
