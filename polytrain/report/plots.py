"""Curves and bar charts of one run or a compare (PNG, matplotlib without pyplot).

We build `Figure` objects directly instead of using pyplot: no global backend or figure
registry is touched, so reports can be written from any thread or a headless machine.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MultipleLocator

from polytrain.report.curves import eval_curve, loss_curve, moving_average
from polytrain.report.load import Run
from polytrain.report.units import MISSING, human_bytes, human_number, is_number

PALETTE = (
    "#4C72B0",
    "#DD8452",
    "#55A868",
    "#C44E52",
    "#8172B3",
    "#937860",
    "#DA8BC3",
    "#8C8C8C",
    "#CCB974",
    "#64B5CD",
)
SMOOTH_FROM = 60  # steps; longer curves get a moving average over the faint raw line
Summary = dict[str, Any]


def colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _figure(size: tuple[float, float] = (7.0, 4.5)) -> tuple[Figure, Axes]:
    fig = Figure(figsize=size, layout="constrained")
    return fig, fig.add_subplot()


def plot_loss(runs: Sequence[Run], x: str, out: Path) -> Path:
    """Training loss against wall-clock seconds (`x="t"`) or samples (`x="samples"`)."""
    fig, ax = _figure()
    smoothed = 0
    losses: list[float] = []
    for i, run in enumerate(runs):
        curve = loss_curve(run.events)
        xs = [p.t if x == "t" else p.samples for p in curve]
        ys = [p.loss for p in curve]
        losses += ys
        if len(ys) >= SMOOTH_FROM:
            smoothed = max(smoothed, len(ys) // 30)
            ax.plot(xs, ys, color=colour(i), alpha=0.25, linewidth=0.8)
            ys = moving_average(ys, len(ys) // 30)
        ax.plot(
            xs,
            ys,
            color=colour(i),
            linewidth=1.8,
            label=run.strategy,
            marker="o" if len(ys) < 30 else None,
            markersize=3,
        )
    ax.set_xlim(left=0)
    if losses and min(losses) > 0 and max(losses) / min(losses) > 20:
        ax.set_yscale("log")
    ax.set_xlabel("wall-clock time since training start (s)" if x == "t" else "samples processed (all ranks)")
    ax.set_ylabel("training loss (mean over ranks)")
    title = "Training loss vs " + ("time" if x == "t" else "samples")
    if smoothed:
        title += "\nfaint: every step; solid: moving average"
    ax.set_title(title)
    _finish(fig, ax, out, legend=len(runs) > 1, empty=not losses, what="step events")
    return out


def plot_accuracy(runs: Sequence[Run], target: float | None, out: Path) -> Path:
    """Evaluation accuracy against wall-clock seconds, with the target as a dashed line.

    The axes always start at 0 s and span 0-100 %, so one evaluation (the default: at the
    end of training) is still read in context; up to 12 points per run carry their value.
    """
    fig, ax = _figure()
    for i, run in enumerate(runs):
        curve = eval_curve(run.events)
        xs, ys = [p.t for p in curve], [100 * p.accuracy for p in curve]
        ax.plot(xs, ys, color=colour(i), marker="o", markersize=5, linewidth=1.8, label=run.strategy)
        if len(curve) <= 12:
            for x, y in zip(xs, ys, strict=True):
                ax.annotate(
                    f"{y:.1f} %",
                    (x, y),
                    textcoords="offset points",
                    xytext=(0, 7),
                    ha="center",
                    fontsize=8,
                    color=colour(i),
                )
    if target is not None:
        ax.axhline(
            100 * target, color="black", linestyle="--", linewidth=1, label=f"target {100 * target:g} %"
        )
    ax.set_xlim(left=0)
    ax.set_ylim(0, 112)  # headroom for the labels of points near 100 %
    ax.set_yticks(range(0, 101, 20))
    ax.set_xlabel("wall-clock time since training start (s)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("Evaluation accuracy vs time")
    series = len(runs) + (target is not None)
    _finish(fig, ax, out, legend=series > 1, empty=False, what="eval events")
    return out


def plot_bars(
    summaries: Sequence[Summary],
    key: str,
    out: Path,
    *,
    title: str,
    ylabel: str,
    fmt: Callable[[float], str],
    in_bytes: bool = False,
) -> Path:
    """One bar per strategy for `summary[key]`, each labelled with its value in `fmt`."""
    fig, ax = _figure()
    names = [str(s.get("strategy", MISSING)) for s in summaries]
    values = [float(s[key]) if is_number(s.get(key)) else 0.0 for s in summaries]
    bars = ax.bar(range(len(names)), values, color=[colour(i) for i in range(len(names))])
    labels = [fmt(v) if is_number(s.get(key)) else "n/a" for v, s in zip(values, summaries, strict=True)]
    ax.bar_label(bars, labels, padding=3)
    ax.set_xticks(
        range(len(names)),
        names,
        rotation=30 if len(names) > 4 else 0,
        ha="right" if len(names) > 4 else "center",
    )
    ax.set_xlabel("strategy")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    top = max([*values, 0.0]) * 1.15 or 1.0
    if in_bytes:
        bytes_axis(ax, top)
    else:
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: fmt(v)))
    ax.set_ylim(0, top)
    _finish(fig, ax, out, legend=False, empty=False, what="")
    return out


def plot_throughput(summaries: Sequence[Summary], out: Path) -> Path:
    return plot_bars(
        summaries,
        "throughput_samples_per_s",
        out,
        title="Throughput",
        ylabel="samples/s (all ranks)",
        fmt=human_number_short,
    )


def plot_bytes_per_sample(summaries: Sequence[Summary], out: Path) -> Path:
    return plot_bars(
        summaries,
        "bytes_sent_per_sample",
        out,
        title="Bytes sent per training sample (all ranks)",
        ylabel="bytes sent / sample",
        fmt=human_bytes,
        in_bytes=True,
    )


def plot_memory(summaries: Sequence[Summary], out: Path) -> Path:
    """Peak RSS per rank, grouped by strategy, coloured by role."""
    fig, ax = _figure((max(7.0, 0.35 * _bar_count(summaries) + 2), 4.5))
    roles: dict[str, str] = {}
    x, centres, names = 0.0, [], []
    labelled = _bar_count(summaries) <= 16
    top = 0.0
    for s in summaries:
        ranks = _per_rank_memory(s)
        start = x
        for rank, role, rss in ranks:
            c = roles.setdefault(role, colour(len(roles)))
            bar = ax.bar(x, rss, color=c, width=0.8)
            top = max(top, rss)
            if labelled:
                name = f"r{rank}" if rank >= 0 else "all"
                ax.bar_label(bar, [f"{name}\n{human_bytes(rss)}"], padding=2, fontsize=8)
            x += 1
        centres.append((start + x - 1) / 2)
        names.append(str(s.get("strategy", MISSING)))
        x += 0.8  # gap between strategies
    ax.set_xticks(centres, names)
    ax.set_xlabel("strategy (one bar per rank, r = rank)")
    ax.set_ylabel("peak resident memory (RSS)")
    bytes_axis(ax, top * 1.18 or 1.0)
    ax.set_ylim(0, top * 1.18 or 1.0)
    ax.set_title("Peak memory per rank")
    if len(roles) > 1:
        fig.legend(
            handles=[Patch(color=c, label=r) for r, c in roles.items()],
            title="role",
            loc="outside right upper",
        )
    _finish(fig, ax, out, legend=False, empty=x == 0, what="memory figures")
    return out


def bytes_axis(ax: Axes, top: float) -> None:
    """Y ticks at round binary amounts (0, 64 MiB, 128 MiB, ...), labelled in one unit."""
    unit, name = 1.0, "B"
    for k, n in enumerate(("KiB", "MiB", "GiB", "TiB"), start=1):
        if top >= 1024**k:
            unit, name = 1024.0**k, n
    raw = max(top / unit / 5, 1e-9)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    ax.yaxis.set_major_locator(MultipleLocator(step * unit))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v / unit:g} {name}"))


def _per_rank_memory(summary: Summary) -> list[tuple[int, str, float]]:
    """(rank, role, peak RSS bytes) per rank; the run's peak as rank -1 when per_rank is absent."""
    rows = [
        (int(r.get("rank", i)), str(r.get("role", "rank")), float(r["peak_rss_bytes"]))
        for i, r in enumerate(summary.get("per_rank") or [])
        if isinstance(r, dict) and is_number(r.get("peak_rss_bytes"))
    ]
    if not rows and is_number(summary.get("peak_rss_bytes")):
        rows = [(-1, "all ranks", float(summary["peak_rss_bytes"]))]
    return rows


def _bar_count(summaries: Sequence[Summary]) -> int:
    return sum(len(_per_rank_memory(s)) for s in summaries)


def human_number_short(value: float) -> str:
    """Axis and bar labels for rates: 1,234 / 12.3 / 0.123."""
    return f"{value:,.0f}" if abs(value) >= 100 else human_number(float(f"{value:.3g}"))


def _finish(fig: Figure, ax: Axes, out: Path, *, legend: bool, empty: bool, what: str) -> None:
    if legend:
        ax.legend()
    if empty:
        ax.text(
            0.5, 0.5, f"no {what} recorded", transform=ax.transAxes, ha="center", va="center", color="#555555"
        )
    ax.grid(axis="y", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    fig.savefig(out, dpi=110)
