"""What `polytrain plan` shows: the ranked table, predicted timelines (the report's Gantt code), the
sweep table and plot."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.table import Table

from polytrain.cost.scene import Span
from polytrain.plan.recommend import Candidate
from polytrain.report.timeline import LANES, Box, RankRow
from polytrain.report.units import human_bytes, human_seconds

MAX_RANK_ROWS = 8


def ranking_table(ranked: Sequence[Candidate], top: int, title: str) -> Table:
    table = Table(title=title)
    for col in (
        "#",
        "strategy",
        "options",
        "step",
        "samples/s",
        "peak mem/rank",
        "sent/step",
        "busiest NIC/step",
        "exact",
        "accuracy evidence",
        "fits",
    ):
        table.add_column(col, justify="right" if col not in ("strategy", "options", "accuracy evidence")
                         else "left")
    for i, c in enumerate(ranked[:top], 1):
        e = c.estimate
        opts = " ".join(f"{k}={v}" for k, v in c.options.items())
        table.add_row(
            str(i),
            c.strategy,
            opts,
            human_seconds(e.step_s),
            f"{c.samples_per_s:,.0f}",
            human_bytes(e.peak_memory_bytes),
            human_bytes(e.bytes_per_step),
            human_bytes(e.nic_bytes_per_step),
            "yes" if c.exact else "no",
            "-" if c.exact else ", ".join(c.evidence) or "unmeasured",
            "yes" if c.fits else "NO",
        )
    return table


def not_fitting(ranked: Sequence[Candidate]) -> list[str]:
    """One line per strategy that never fits: what it would need."""
    best: dict[str, Candidate] = {}
    for c in ranked:
        if not c.fits and (
            c.strategy not in best
            or c.estimate.peak_memory_bytes < best[c.strategy].estimate.peak_memory_bytes
        ):
            best[c.strategy] = c
    fitting = {c.strategy for c in ranked if c.fits}
    return [
        f"{name}: does not fit; needs {human_bytes(c.estimate.peak_memory_bytes)} per rank ({c.label})"
        for name, c in sorted(best.items())
        if name not in fitting
    ]


def rows_of(spans: Sequence[Span]) -> list[RankRow]:
    """Predicted spans as the report's timeline rows (at most MAX_RANK_ROWS ranks)."""
    rows: dict[int, RankRow] = {}
    for sp in sorted(spans, key=lambda s: (s.rank, s.start)):
        if sp.rank not in rows:
            if len(rows) >= MAX_RANK_ROWS:
                continue
            rows[sp.rank] = RankRow(sp.rank, "predicted", {lane: [] for lane in LANES})
        rows[sp.rank].lanes[sp.lane].append(Box(sp.start, sp.end - sp.start, sp.kind, sp.kind, sp.label))
    return [rows[r] for r in sorted(rows)]


def draw_predicted(c: Candidate, out: Path) -> Path:
    from polytrain.report.gantt import draw_timeline

    title = f"predicted step: {c.label} ({human_seconds(c.estimate.step_s)})"
    return draw_timeline(rows_of(c.estimate.spans), title, out)


def sweep_table(rows: list[dict[str, Any]], strategies: Sequence[str]) -> Table:
    table = Table(title="predicted samples/s against hosts (best options per strategy)")
    table.add_column("hosts", justify="right")
    table.add_column("ranks", justify="right")
    for s in strategies:
        table.add_column(s, justify="right")
    table.add_column("best")
    for row in rows:
        cells = [f"{row['samples_per_s'][s]:,.0f}" if s in row["samples_per_s"] else "-" for s in strategies]
        table.add_row(str(row["hosts"]), str(row["ranks"]), *cells, row["best"])
    return table


def draw_sweep(
    rows: list[dict[str, Any]], strategies: Sequence[str], crossover: int | None, out: Path
) -> Path:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5))
    ax = fig.add_subplot()
    for s in strategies:
        pts = [(r["ranks"], r["samples_per_s"][s]) for r in rows if s in r["samples_per_s"]]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=s)
    if crossover is not None:
        ax.axvline(crossover, color="grey", linestyle="--", label=f"hybrid overtakes DP at {crossover} ranks")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("ranks (workers)")
    ax.set_ylabel("predicted samples/s")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return out
