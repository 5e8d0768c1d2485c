"""Tier 1: the launcher's record of a stopped run (``write_stopped``) from the ranks' event files:
every whole line in time order (ties in file order), a last line cut by a kill left out; the
same record when merged as the files grow (``MergedEvents``); and rank 0's summary figures from
the few events each rank keeps for it (``Recorder.summary_events``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polytrain.config import make_config
from polytrain.launch.merge import MergedEvents, merge_all
from polytrain.launch.rundir import from_events, write_stopped
from polytrain.metrics.recorder import Recorder


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


def _lines(events: list[dict]) -> str:
    return "".join(json.dumps(e) + "\n" for e in events)


def _rank_events(rank: int, n: int, jitter: float) -> list[dict]:
    """Steps and spans of one rank, a span now and then recorded after a later event (as a
    span that ends on another thread is), ``jitter`` seconds out of order."""
    out: list[dict] = [{"event": "process", "rank": rank, "t": 0.0, "pid": 1}]
    for i in range(1, n + 1):
        t = i * 0.01 + rank * 0.001
        out.append({"event": "span", "rank": rank, "t": round(t - 0.004, 6), "name": "fwd"})
        out.append({"event": "step", "rank": rank, "t": round(t, 6), "step": i,
                    "loss": 1.0 / i + rank, "samples": 8 * i})
        if i % 50 == 0:
            out.append({"event": "span", "rank": rank, "t": round(t - jitter, 6), "name": "hook"})
        if i == 77:
            out.append({"event": "divergence", "rank": rank, "t": round(t, 6), "step": i})
    return out


def _grow(ranks: Path, events: dict[int, list[dict]], merged: MergedEvents, chunks: int,
          rewrite_at: int | None = None) -> None:
    """Append each rank's events in ``chunks`` parts, polling after each (a part may end in
    the middle of a line); ``rewrite_at``: rank 1's file replaced after that part (a resume)."""
    texts = {r: _lines(evs) for r, evs in events.items()}
    for c in range(1, chunks + 1):
        for r, text in texts.items():
            path = ranks / f"rank{r}.jsonl"
            lo, hi = len(text) * (c - 1) // chunks, len(text) * c // chunks
            with path.open("a") as f:
                f.write(text[lo:hi])
        if c == rewrite_at:
            tmp = ranks / "rank1.rewind"
            tmp.write_text((ranks / "rank1.jsonl").read_text())
            tmp.replace(ranks / "rank1.jsonl")
        merged.poll()


@pytest.mark.parametrize("case", ["in order", "a line older than the slack", "a file rewritten"])
def test_merging_as_the_files_grow_equals_merging_at_the_end(tmp_path: Path, case: str) -> None:
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    jitter = 5.0 if case == "a line older than the slack" else 0.1
    events = {r: _rank_events(r, 600, jitter) for r in range(3)}
    merged = MergedEvents(ranks, world=3, slack_s=0.2)
    _grow(ranks, events, merged, 20, rewrite_at=10 if case == "a file rewritten" else None)
    with (ranks / "rank2.jsonl").open("a") as f:
        f.write('{"event": "span", "rank": 2, "t": 99.0, "na')  # cut by a kill
    assert case != "in order" or merged.part.stat().st_size > 0  # written while growing
    assert merged.in_order == (case != "a line older than the slack")
    merged.finish()
    whole = merge_all(ranks, tmp_path / "whole.jsonl")
    assert (tmp_path / "metrics.jsonl").read_text() == (tmp_path / "whole.jsonl").read_text()
    assert merged.summary() == whole.summary()
    cfg = make_config({"strategy": "allreduce", "procs": 3, "steps": 5, "out": str(tmp_path)})
    summary = write_stopped(tmp_path, cfg, {"reason": "interrupted"})  # the old way: from files
    assert (summary["steps_run"], summary["samples"], summary["final_loss"],
            summary["divergence_warnings"]) == tuple(merged.summary().values())
    assert summary["steps_run"] == 600 and summary["divergence_warnings"] == [77]


def test_summary_events_give_the_figures_of_every_event(tmp_path: Path) -> None:
    """A rank's few kept events (``Recorder.summary_events``) give the summary the figures that
    all its events give: a run of 2 ranks, resumed once from step 20."""

    def run(rank: int, first: int, last: int, resume: int | None) -> Recorder:
        rec = Recorder(rank, tmp_path / f"rank{rank}.jsonl", fresh=resume is None)
        if resume is not None:
            rec.rewind(resume)
        for i in range(first, last + 1):
            with rec.span("fwd", step=i):
                pass
            if i == 5:
                rec.emit("skipped", step=i, reason="non-finite gradient")
            if i == 7:
                rec.emit("divergence", step=i, loss=9.0, bound=1.0)
            rec.step(i, 1.0 / i, samples=8 * i)
            if i % 10 == 0:
                rec.tally(i, 1000 * i)
        return rec

    for rank in range(2):
        run(rank, 1, 30, None).close()
    recs = [run(rank, 21, 40, 20) for rank in range(2)]
    records = [{"steps": 20, "samples": 160, "wall_s": 1.0, "bytes_sent": 5,
                "bytes_sent_run": 7, "resumed": rec.resumed} for rec in recs]
    every = [e for rec in recs for e in rec.events]
    kept = [e for rec in recs for e in rec.summary_events()]
    assert len(kept) < len(every) / 5
    assert from_events(records, kept) == from_events(records, every)
    assert from_events(records, kept)["skipped_steps"] == [5]
