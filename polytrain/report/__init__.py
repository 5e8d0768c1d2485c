"""Reports of runs and compares: tables (rich, markdown), plots and timelines (PNG, Chrome trace).

`write_report(RUN_DIR)` writes everything next to the run's files; `summary_table` and
`format_summary` are the terminal views the CLI prints. Matplotlib is imported only when a
report is written, so `polytrain train` does not pay for it at start-up.
"""

from __future__ import annotations

from pathlib import Path

from polytrain.report.console import format_summary, summary_table
from polytrain.report.curves import EvalPoint, LossPoint, eval_curve, loss_curve
from polytrain.report.load import Run, Source, load_run, load_source, read_events, time_to_accuracy
from polytrain.report.timeline import Box, RankRow, chrome_trace, flatten_lane, timeline_rows

__all__ = [
    "Box",
    "EvalPoint",
    "LossPoint",
    "RankRow",
    "Run",
    "Source",
    "chrome_trace",
    "eval_curve",
    "flatten_lane",
    "format_summary",
    "load_run",
    "load_source",
    "loss_curve",
    "read_events",
    "summary_table",
    "time_to_accuracy",
    "timeline_rows",
    "write_report",
]


def write_report(path: Path) -> list[Path]:
    """Write report.md, the PNGs and timeline.json into a run or compare directory.

    See `polytrain.report.write.write_report`; imported here on first use (matplotlib is slow
    to import).
    """
    from polytrain.report.write import write_report as _write_report

    return _write_report(path)
