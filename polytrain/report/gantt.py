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
    "weight": "#CCB974",
    "optimizer": "#55A868",
    "other compute": "#937860",
    "comm": "#C44E52",
}
MAX_BOXES = 10_000
EDGES_UP_TO = 2_000  # white box outlines (to tell adjacent boxes apart) below this many boxes
LABELS_UP_TO = 400  # `F3`-style labels inside wide boxes below this many boxes
MIN_WIDTH = 0.0015  # of the x range: about 1.5 pixels, the narrowest box drawn
LANE_H = 0.42  # a rank's row is 1 high: compute lane at the top, comm lane below it


def draw_timeline(rows: Sequence[RankRow], title: str, out: Path, max_boxes: int = MAX_BOXES) -> Path:
    """Write the Gantt PNG for `rows` (from `timeline_rows`) to `out`."""
    total = sum(len(r.boxes()) for r in rows)
    run_end = _last_end(rows)
    shown, cut = window(rows, max_boxes)
    end = run_end if cut is None else cut
    if cut is not None:
        title += (
            f"\nfirst {human_seconds(cut)} of {human_seconds(run_end)} shown "
            f"({max_boxes:,} of {total:,} spans); every span is in timeline.json"
        )
    height = min(1.6 + 0.75 * len(rows), 16.0)
    fig = Figure(figsize=(11, height), layout="constrained")
    ax = fig.add_subplot()
    for i, row in enumerate(shown):
        _draw_row(ax, i, row, end or 1.0, min(total, max_boxes))
    start = min([0.0, *(lane[0].start for r in shown for lane in r.lanes.values() if lane)])
    ax.set_xlim(start, (end or 1.0) * 1.01)
    labels = [f"rank {r.rank} ({r.role})\nbusy {_busy_percent(r, run_end)}" for r in rows]
    _decorate(fig, ax, shown, labels, title)
    if total == 0:
        ax.text(
            0.5,
            0.5,
            "no span events recorded",
            transform=ax.transAxes,
            ha="center",
            va="center",
            bbox={"facecolor": "white", "edgecolor": "#888888"},
        )
    fig.savefig(out, dpi=110)
    return out


def _last_end(rows: Sequence[RankRow]) -> float:
    """End of the last span of any rank (lanes are sorted and never overlap)."""
    return max((lane[-1].end for r in rows for lane in r.lanes.values() if lane), default=0.0)


def _lane_y(i: int, lane: str) -> float:
    """Bottom of a lane's bar; the y axis is inverted so rank 0 is on top."""
    return i + 0.06 + LANES.index(lane) * (LANE_H + 0.04)


def _draw_row(ax: Axes, i: int, row: RankRow, end: float, n_boxes: int) -> None:
    if i > 0:  # a line between ranks; within a row, white gaps are idle time
        ax.axhline(i, color="#888888", linewidth=0.8, zorder=1)
    thin = end * MIN_WIDTH  # narrower boxes are widened to this, else they vanish when drawn
    for lane in LANES:
        by_kind: dict[tuple[str, bool], list[tuple[float, float]]] = {}
        for b in row.lanes[lane]:
            # white outlines tell adjacent boxes apart, but would swallow narrow ones
            outlined = n_boxes <= EDGES_UP_TO and b.duration > 4 * thin
            by_kind.setdefault((b.kind, outlined), []).append((b.start, max(b.duration, thin)))
        for (kind, outlined), ranges in by_kind.items():
            edge = {"edgecolor": "white", "linewidth": 0.6} if outlined else {"linewidth": 0}
            ax.broken_barh(ranges, (_lane_y(i, lane), LANE_H), facecolors=COLOURS[kind], zorder=2, **edge)
        if n_boxes <= LABELS_UP_TO:
            _label_boxes(ax, i, lane, row.lanes[lane], end)


def _label_boxes(ax: Axes, i: int, lane: str, boxes: list[Box], end: float) -> None:
    for b in boxes:
        if b.label and b.duration >= 0.02 * end:
            ax.text(
                b.start + b.duration / 2,
                _lane_y(i, lane) + LANE_H / 2,
                b.label,
                ha="center",
                va="center",
                fontsize=6.5,
                color="white",
                zorder=3,
            )


def _decorate(fig: Figure, ax: Axes, shown: Sequence[RankRow], labels: list[str], title: str) -> None:
    ax.set_yticks([i + 0.5 for i in range(len(shown))], labels)
    ax.set_ylim(len(shown), 0)
    ax.set_xlabel("time since training start (s)")
    lanes = ax.secondary_yaxis("right")
    lanes.set_yticks(
        [_lane_y(i, lane) + LANE_H / 2 for i in range(len(shown)) for lane in LANES],
        [lane for _ in shown for lane in LANES],
        fontsize=8,
        color="#555555",
    )
    lanes.tick_params(length=0)
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
