"""What the terminal shows at the end of a run: a one-screen summary and comparison tables."""

from __future__ import annotations

from typing import Any

from rich.panel import Panel
from rich.table import Table


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _acc(summary: dict[str, Any]) -> str:
    ev = summary.get("eval") or {}
    return f"{ev['accuracy']:.4f}" if "accuracy" in ev else "-"


def summary_panel(summary: dict[str, Any], run_dir: str) -> Panel:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    loss = summary.get("final_loss")
    rows = [
        ("strategy", f"{summary['strategy']} on {summary['world_size']} process(es)"),
        ("test accuracy", _acc(summary)),
        ("final loss", f"{loss:.4f}" if loss is not None else "-"),
        ("steps", f"{summary['steps_run']} x batch {summary['config']['batch_size']}"),
        ("wall time", f"{summary['wall_s']:.2f} s"),
        ("throughput", f"{summary['throughput_samples_per_s']:,.0f} samples/s"),
        ("bytes sent", f"{human_bytes(summary['bytes_sent'])} "
                       f"({human_bytes(summary['bytes_sent_per_sample'])}/sample)"),
        ("peak memory", f"{human_bytes(summary['peak_rss_bytes'])} RSS (largest rank)"),
        ("run directory", run_dir),
    ]
    for k, v in rows:
        grid.add_row(k, v)
    return Panel(grid, title="polytrain", expand=False)


def compare_table(summaries: list[dict[str, Any]]) -> Table:
    table = Table(title="comparison (same model, data and global batch)")
    cols = ["strategy", "procs", "samples/s", "final loss", "accuracy", "bytes/sample",
            "peak memory"]
    with_tta = any("time_to_accuracy_s" in s for s in summaries)
    if with_tta:
        cols.append("time to accuracy")
    for c in cols:
        table.add_column(c, justify="left" if c == "strategy" else "right")
    for s in summaries:
        loss = s.get("final_loss")
        row = [s["strategy"], str(s["world_size"]), f"{s['throughput_samples_per_s']:,.0f}",
               f"{loss:.4f}" if loss is not None else "-", _acc(s),
               human_bytes(s["bytes_sent_per_sample"]), human_bytes(s["peak_rss_bytes"])]
        if with_tta:
            tta = s.get("time_to_accuracy_s")
            row.append(f"{tta:.2f} s" if tta is not None else "not reached")
        table.add_row(*row)
    return table
