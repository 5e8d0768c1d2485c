"""The timeline picture: one row per rank (compute lane above comm lane), one box per span.

Drawn with one `broken_barh` per (rank, lane, colour class), so thousands of spans render in
about a second; beyond `MAX_BOXES` boxes only the beginning of the run is drawn and the title
says so (timeline.json always holds every span).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from polytrain.report.timeline import KINDS, LANES, Box, RankRow, window
from polytrain.report.units import human_seconds

COLOURS = {
    "forward": "#4C72B0",
    "backward": "#DD8452",
    "optimizer": "#55A868",
    "other compute": "#937860",
    "comm": "#C44E52",
}
MAX_BOXES = 20_000
EDGES_UP_TO = 2_000  # white box outlines (to tell adjacent boxes apart) below this many boxes
LABELS_UP_TO = 400  # `F3`-style labels inside wide boxes below this many boxes
LANE_H = 0.42  # a rank's row is 1 high: compute lane at the top, comm lane below it


def draw_timeline(rows: Sequence[RankRow], title: str, out: Path, max_boxes: int = MAX_BOXES) -> Path:
    """Write the Gantt PNG for `rows` (from `timeline_rows`) to `out`."""
    total = sum(len(r.boxes()) for r in rows)
    shown, cut = window(rows, max_boxes)
    end = max((b.end for r in shown for b in r.boxes()), default=1.0)
    if cut is not None:
        full_end = max(b.end for r in rows for b in r.boxes())
        title += (
            f"\nfirst {human_seconds(cut)} of {human_seconds(full_end)} shown "
            f"({max_boxes:,} of {total:,} spans); every span is in timeline.json"
        )
        end = cut
    height = min(1.6 + 0.75 * len(rows), 16.0)
    fig = Figure(figsize=(11, height), layout="constrained")
    ax = fig.add_subplot()
    n_boxes = min(total, max_boxes)
    for i, row in enumerate(shown):
        _draw_row(ax, i, row, end, n_boxes)
    _decorate(fig, ax, shown, rows, end, title)
    if total == 0:
        ax.text(end / 2, len(rows) / 2, "no span events recorded", ha="center", va="center")
    fig.savefig(out, dpi=110)
    return out


def _lane_y(i: int, lane: str) -> float:
    """Bottom of a lane's bar; the y axis is inverted so rank 0 is on top."""
    return i + 0.06 + LANES.index(lane) * (LANE_H + 0.04)


def _draw_row(ax: Axes, i: int, row: RankRow, end: float, n_boxes: int) -> None:
    if i % 2 == 0:  # a faint band marks the row, so idle gaps read as gaps in it
        ax.axhspan(i, i + 1, color="#f2f2f2", zorder=0)
    edge = {"edgecolor": "white", "linewidth": 0.6} if n_boxes <= EDGES_UP_TO else {}
    for lane in LANES:
        by_kind: dict[str, list[Box]] = {}
        for b in row.lanes[lane]:
            by_kind.setdefault(b.kind, []).append(b)
        for kind, boxes in by_kind.items():
            ax.broken_barh(
                [(b.start, b.duration) for b in boxes],
                (_lane_y(i, lane), LANE_H),
                facecolors=COLOURS[kind],
                zorder=2,
                **edge,
            )
            if n_boxes <= LABELS_UP_TO:
                _label_boxes(ax, i, lane, boxes, end)


def _label_boxes(ax: Axes, i: int, lane: str, boxes: list[Box], end: float) -> None:
    for b in boxes:
        if b.label and b.duration >= 0.025 * end:
            ax.text(
                b.start + b.duration / 2, _lane_y(i, lane) + LANE_H / 2, b.label,
                ha="center", va="center", fontsize=7, color="white", zorder=3,
            )


def _decorate(fig: Figure, ax: Axes, shown: Sequence[RankRow], rows: Sequence[RankRow], end: float,
              title: str) -> None:
    run_end = max((b.end for r in rows for b in r.boxes()), default=0.0)
    labels = [
        f"rank {r.rank} ({r.role})\nbusy {_busy_percent(full, run_end)}"
        for r, full in zip(shown, rows, strict=True)
    ]
    ax.set_yticks([i + 0.5 for i in range(len(shown))], labels)
    ax.set_ylim(len(shown), 0)
    ax.set_xlim(0, end * 1.01)
    ax.set_xlabel(
        "time since training start (s)   ·   each row: compute lane above comm lane; "
        "gaps are idle"
    )
    ax.set_title(title)
    ax.grid(axis="x", color="#cccccc", linewidth=0.5, zorder=1)
    present = {b.kind for r in shown for b in r.boxes()}
    handles = [Patch(color=COLOURS[k], label=k) for k in KINDS if k in present]
    if handles:
        handles.append(Patch(facecolor="white", edgecolor="#999999", label="idle (gap)"))
        fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), frameon=False)


def _busy_percent(row: RankRow, run_end: float) -> str:
    """Share of the run (time 0 to the last span of any rank) this rank spent in spans."""
    return f"{100 * row.busy_s() / run_end:.0f} %" if run_end > 0 else "0 %"
