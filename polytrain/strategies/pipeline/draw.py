"""Text and picture forms of pipeline schedules: ASCII grid, order lists, PNG, CLI report.

The PNG uses matplotlib's object API with the Agg canvas (no pyplot, no global backend switch),
imported only when a picture is asked for, so importing this module stays cheap.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import groupby
from pathlib import Path

from polytrain.errors import ConfigError
from polytrain.schedules.registry import (
    Action,
    Orders,
    bubble_fraction,
    check_cost,
    dry_run,
    get_schedule,
    in_flight,
    makespan,
    simulate,
    stage_load,
    validate,
)


def parse_cost(text: str) -> dict[str, int]:
    """``"F=1,B=2"`` -> ``{"F": 1, "B": 2}`` (the CLI form of ``cost``)."""
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        op, _, value = part.partition("=")
        if not value.strip().isdigit():
            raise ConfigError(f"Cannot read cost '{part}'. Fix: write e.g. 'F=1,B=2'.")
        out[op.strip()] = int(value)
    check_cost(out)
    return out


# --- text forms --------------------------------------------------------------------------------


def format_grid(grid: Mapping[int, list[Action | None]]) -> str:
    """ASCII table: a row per stage (stage 0 on top), a column per slot, ``.`` for idle. With virtual
    stages (a row runs several chunks) each cell names its chunk too: ``4F1``."""
    span = makespan(grid)
    virtual = _virtual(grid)
    rows = {
        s: [(str(a) if virtual else a.cell) if a else "." for a in row] + ["."] * (span - len(row))
        for s, row in sorted(grid.items())
    }
    width = max([len(str(span - 1)), *(len(c) for row in rows.values() for c in row)])
    label = max((len(f"stage {s}") for s in rows), default=5)
    lines = ["time".ljust(label) + "  " + " ".join(str(t).ljust(width) for t in range(span))]
    lines += [
        f"stage {s}".ljust(label) + "  " + " ".join(c.ljust(width) for c in row) for s, row in rows.items()
    ]
    return "\n".join(line.rstrip() for line in lines) + "\n"


def _virtual(grid: Mapping[int, list[Action | None]]) -> bool:
    """Whether some row runs a chunk other than its own index (virtual stages)."""
    return any(a is not None and a.stage != s for s, row in grid.items() for a in row)


def format_orders(orders: Mapping[int, list[Action]]) -> str:
    """One line per stage, ``0: 0F0 0F1 0B0 0B1``; `parse_orders` reads it back."""
    return "".join(f"{s}: {' '.join(map(str, row))}\n" for s, row in sorted(orders.items()))


def parse_orders(text: str) -> Orders:
    """Read `format_orders` text (``#`` starts a comment) into orders."""
    orders: Orders = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        head, sep, body = line.partition(":")
        if not sep or not head.strip().isdigit() or int(head) in orders:
            raise ConfigError(
                f"Line {n} '{raw}': Rule: each line is '<stage>: <action> ...', one per stage. "
                "Fix: e.g. '0: 0F0 0F1 0B0 0B1'."
            )
        orders[int(head)] = [Action.parse(tok) for tok in body.split()]
    return orders


# --- picture -----------------------------------------------------------------------------------

_COLOURS = {"F": "#8ecae6", "B": "#fb8500", "W": "#ffb703"}
_OP_NAMES = {"F": "forward", "B": "backward", "W": "weight gradient"}
_IDLE = "#e6e6e6"


def _runs(row: list[Action | None]) -> list[tuple[int, int, Action | None]]:
    """(start, length, action) for each run of equal cells: a B of cost 2 is one box."""
    out, t = [], 0
    for action, group in groupby(row):
        n = len(list(group))
        out.append((t, n, action))
        t += n
    return out


def draw_grid(
    grid: Mapping[int, list[Action | None]],
    path: Path | str,
    title: str,
    unit: str = "micro-batch",
) -> Path:
    """Write the grid as a PNG: a row per stage (0 on top), boxes coloured by op, idle grey.

    The title gets P, M (the count of ``unit``, read off the grid) and the bubble fraction.
    """
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch, Rectangle

    span, stages = makespan(grid), len(grid)
    if span == 0:
        raise ConfigError("Nothing to draw: the schedule has no actions. Fix: use stages >= 1.")
    mbs = 1 + max(a.microbatch for row in grid.values() for a in row if a is not None)
    slot_in = min(0.45, 24 / span)  # inches per slot: wide enough for two digits, capped width
    fig = Figure(figsize=(1.8 + slot_in * span, 1.7 + 0.55 * stages))
    ax = fig.add_subplot()
    font = max(5.0, min(10.0, slot_in * 48))
    virtual = _virtual(grid)
    for s, row in grid.items():
        chunks = sorted({a.stage for a in row if a is not None})
        for t, n, a in _runs(row):
            if a is None:
                ax.add_patch(Rectangle((t, s - 0.4), n, 0.8, color=_IDLE, hatch="///", fill=False))
                continue
            dash = "-" if a.op == "F" else "--"  # survey Fig. 9: forward full, backward dotted
            ax.add_patch(
                Rectangle(
                    (t, s - 0.4),
                    n,
                    0.8,
                    facecolor=_COLOURS[a.op],
                    alpha=1.0 - 0.45 * chunks.index(a.stage) / max(1, len(chunks) - 1),  # later chunk: paler
                    edgecolor="black",
                    linewidth=0.8,
                    linestyle=dash,
                )
            )
            if n * slot_in >= 0.12:
                text = f"{a.stage}:{a.microbatch}" if virtual else str(a.microbatch)
                size = font * (0.75 if virtual else 1)
                ax.text(t + n / 2, s, text, ha="center", va="center", fontsize=size)
    ax.set_xlim(0, span)
    ax.set_ylim(stages - 0.5, -0.5)  # stage 0 on top, as in the survey's figures
    ax.set_yticks(range(stages))
    if span <= 48:
        ax.set_xticks(range(0, span + 1, 1 if span <= 24 else 2))
    ax.set_xlabel("time (slots)")
    ax.set_ylabel("rank (boxes: chunk:micro-batch)" if virtual else "stage")
    ops = sorted({a.op for row in grid.values() for a in row if a}, key="FBW".index)
    handles = [Patch(facecolor=_COLOURS[o], edgecolor="black", label=_OP_NAMES[o]) for o in ops]
    handles.append(Patch(facecolor="white", edgecolor=_IDLE, hatch="///", label="idle (bubble)"))
    ax.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.5 / (1 + stages / 2)),
        ncol=len(handles),
        frameon=False,
        fontsize=9,
    )
    ax.set_title(f"{title}: P={stages}, M={mbs} {unit}es, bubble {bubble_fraction(grid):.1%}")
    out = Path(path)
    fig.savefig(out, dpi=150, bbox_inches="tight")
    return out


# --- CLI report --------------------------------------------------------------------------------


def schedule_cli(
    name: str,
    stages: int,
    microbatches: int,
    out_png: Path | None = None,
    cost: Mapping[str, int] | None = None,
    virtual: int | None = None,
) -> str:
    """The text ``polytrain schedule NAME --stages P --microbatches M [--virtual-stages V]
    [--png FILE]`` prints."""
    spec = get_schedule(name)
    orders = spec.build(stages, microbatches, virtual)
    validate(orders, stages, microbatches)
    dry_run(orders)
    costs = check_cost(cost)
    grid = simulate(orders, costs)
    span, loads = makespan(grid), stage_load(grid)
    idle = sum(load.idle for load in loads.values())
    textbook = (stages - 1) / (microbatches + stages - 1)
    update = (
        "one optimizer step per stage after the flush"
        if spec.flush
        else "each stage steps after every backward (weight stashing)"
    )
    chunks = "" if spec.placement == "none" else f", V={virtual or spec.default_virtual} chunks per rank"
    split = f" W={costs['W']} (B = input gradient; a B without W costs B+W)" if spec.split else ""
    lines = [
        f"{name}: {spec.description}",
        f"P={stages} stages{chunks}, M={microbatches} {spec.unit}es,"
        f" cost F={costs['F']} B={costs['B']}{split},"
        f" makespan {span} slots; {update}",
        "",
        format_grid(grid),
        f"bubble fraction: {bubble_fraction(grid):.1%} ({idle} idle of {stages * span} "
        f"stage-slots; (P-1)/(M+P-1) = {textbook:.1%})",
        "peak in flight (activations held) per stage: " + _per_stage(in_flight(orders)),
        "busy/idle slots per stage: "
        + ", ".join(f"{s}: {load.busy}/{load.idle}" for s, load in loads.items()),
    ]
    if out_png is not None:
        lines.append(f"wrote {draw_grid(grid, out_png, name, spec.unit)}")
    return "\n".join(lines) + "\n"


def _per_stage(values: Mapping[int, int]) -> str:
    return ", ".join(f"{s}: {v}" for s, v in sorted(values.items()))
