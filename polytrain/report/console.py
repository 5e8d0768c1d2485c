"""Rich renderables for the terminal: the compare table and the end-of-train summary."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from polytrain.report.table import summary_cells, testbed_line
from polytrain.report.units import (
    MISSING,
    human_bytes,
    human_rate,
    human_seconds,
    is_number,
    percent,
)

Summary = Mapping[str, Any]


def summary_table(
    summaries: Sequence[Summary], target_accuracy: float | None = None, title: str | None = None
) -> Table:
    """One row per strategy: world, steps, throughput, loss, accuracy, bytes/sample, memory..."""
    columns, rows = summary_cells(summaries, target_accuracy)
    table = Table(title=title, header_style="bold")
    for c in columns:
        table.add_column(
            c.header,
            justify="right" if c.numeric else "left",
            style=None if c.numeric else "cyan",
            no_wrap=not c.numeric,
        )
    for row in rows:
        table.add_row(*row)
    return table


def format_summary(summary: Summary, run_dir: Path | str | None = None) -> RenderableType:
    """A one-screen panel for the end of `polytrain train`."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    for label, value in _summary_lines(summary, run_dir):
        grid.add_row(label, value)
    title = f"polytrain · {summary.get('strategy', MISSING)} · {summary.get('world_size', '?')} ranks"
    testbed = testbed_line(summary)
    parts: list[RenderableType] = [grid]
    metrics = summary.get("strategy_metrics")
    table = metrics.get("console_table") if isinstance(metrics, Mapping) else None
    if isinstance(table, str):  # a strategy's own table (e.g. hybrid-ps-ar's parameter paths)
        parts.append(Text("\n" + table))
    if testbed:
        parts.append(Text(testbed, style="dim"))
    body: RenderableType = Group(*parts) if len(parts) > 1 else grid
    return Panel(body, title=title, title_align="left", expand=False)


def _summary_lines(summary: Summary, run_dir: Path | str | None) -> list[tuple[str, str]]:
    raw_eval = summary.get("eval")
    ev: Mapping[str, Any] = raw_eval if isinstance(raw_eval, Mapping) else {}
    accuracy = percent(ev.get("accuracy"))
    if is_number(ev.get("loss")):
        accuracy += f"  (test loss {ev['loss']:.4f})"
    steps = summary.get("steps")
    samples = summary.get("samples")
    lines = [
        ("Accuracy", accuracy),
        ("Final loss (mean over ranks, last step)",
         f"{summary['final_loss']:.4f}" if is_number(summary.get("final_loss")) else MISSING),
        ("Throughput", human_rate(summary.get("throughput_samples_per_s"))),
        (
            "Steps",
            f"{steps:,} steps, {samples:,} samples" if is_number(steps) and is_number(samples) else MISSING,
        ),
        ("Bytes sent", _bytes_sent(summary)),
        (
            "Peak memory",
            human_bytes(summary.get("peak_rss_bytes")) + " RSS"
            if is_number(summary.get("peak_rss_bytes"))
            else MISSING,
        ),
        ("Wall time", human_seconds(summary.get("wall_s"))),
    ]
    if "time_to_accuracy_s" in summary:
        tta = summary["time_to_accuracy_s"]
        lines.append(("Time to accuracy", "not reached" if tta is None else human_seconds(tta)))
    if run_dir is not None:
        lines.append(("Run directory", str(run_dir)))
    return lines


def _bytes_sent(summary: Summary) -> str:
    total = summary.get("bytes_sent")
    if not is_number(total):
        return MISSING
    text = human_bytes(total)
    if is_number(summary.get("bytes_sent_per_sample")):
        text += f"  ({human_bytes(summary['bytes_sent_per_sample'])}/sample)"
    return text
