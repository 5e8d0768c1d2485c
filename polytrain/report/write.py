"""`write_report`: every picture, trace and report.md for a run or a compare directory."""

from __future__ import annotations

import json
import re
from pathlib import Path

from polytrain.report.gantt import draw_timeline
from polytrain.report.load import Run, Source, load_source, time_to_accuracy
from polytrain.report.markdown import render_report
from polytrain.report.plots import (
    plot_accuracy,
    plot_bytes_per_sample,
    plot_loss,
    plot_memory,
    plot_throughput,
)
from polytrain.report.timeline import chrome_trace, roles_of, timeline_rows


def write_report(path: Path) -> list[Path]:
    """Write the report of a run (summary.json) or compare (compare.json) directory into it.

    Returns the files written: loss_time.png, loss_samples.png, accuracy_time.png (when there
    are eval events), throughput.png, bytes_per_sample.png, memory.png, timeline.png and
    timeline.json (compare: timeline_<strategy>.png/.json per strategy), and report.md.
    Raises ConfigError for a missing or malformed directory.
    """
    source = load_source(Path(path))
    _fill_time_to_accuracy(source)
    out = source.path
    runs, summaries = source.runs, [r.summary for r in source.runs]
    images = {
        "loss_time": plot_loss(runs, "t", out / "loss_time.png"),
        "loss_samples": plot_loss(runs, "samples", out / "loss_samples.png"),
    }
    if any(e.get("event") == "eval" for r in runs for e in r.events):
        images["accuracy_time"] = plot_accuracy(runs, source.target_accuracy, out / "accuracy_time.png")
    images["throughput"] = plot_throughput(summaries, out / "throughput.png")
    images["bytes_per_sample"] = plot_bytes_per_sample(summaries, out / "bytes_per_sample.png")
    images["memory"] = plot_memory(summaries, out / "memory.png")
    traces: dict[str, Path] = {}
    for run in runs:
        stem = f"timeline_{safe_name(run.strategy)}" if source.is_compare else "timeline"
        images[f"timeline:{run.strategy}"] = _timeline_png(run, out / f"{stem}.png")
        traces[f"timeline:{run.strategy}"] = _timeline_json(run, out / f"{stem}.json")
    report = out / "report.md"
    report.write_text(render_report(source, images, traces), encoding="utf-8")
    return [*images.values(), *traces.values(), report]


def safe_name(name: str) -> str:
    """A strategy id as a file-name part: anything but letters, digits, `-`, `_`, `.` -> `_`."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "strategy"


def _fill_time_to_accuracy(source: Source) -> None:
    """Compute time_to_accuracy_s from the events when a target is set and a summary lacks it."""
    target = source.target_accuracy
    if target is None:
        return
    for run in source.runs:
        if "time_to_accuracy_s" not in run.summary:
            run.summary["time_to_accuracy_s"] = time_to_accuracy(run.events, target)


def _timeline_png(run: Run, out: Path) -> Path:
    world = int(run.summary.get("world_size") or 0)
    rows = timeline_rows(run.events, world, roles_of(run.summary))
    title = f"Timeline of {run.strategy} ({len(rows)} ranks)"
    return draw_timeline(rows, title, out)


def _timeline_json(run: Run, out: Path) -> Path:
    trace = chrome_trace(run.events, run.summary)
    out.write_text(json.dumps(trace, separators=(",", ":")), encoding="utf-8")
    return out
