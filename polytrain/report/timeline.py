"""Span events as timeline data: rows of boxes for the Gantt picture, and a Chrome trace.

Overlapping spans. A rank's spans may overlap: communication running inside a compute span
(DDP all-reduces during backward), or an outer span around inner ones (a `step` around
`forward`). We do not reject such input. Each rank's row has two lanes — `compute` above `comm` —
so compute and communication that overlap in time are both visible. Within one lane, overlaps
are resolved by *innermost wins*: at every instant the lane shows the active span that started
last (ties: the one ending first), and the outer span is split around it. So every lane is a
sequence of non-overlapping boxes, gaps are idle time, and nothing is drawn twice. The Chrome
trace (`chrome_trace`) keeps the raw spans; Perfetto nests them itself.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from polytrain.report.units import is_number

Event = Mapping[str, Any]

LANES = ("compute", "comm")
_SPAN_KEYS = frozenset({"event", "rank", "t", "name", "cat", "start", "end"})
KINDS = ("forward", "backward", "weight", "optimizer", "other compute", "comm")
"""Colour classes of boxes, in legend order."""


@dataclass(frozen=True)
class Box:
    """One drawn piece of a span: [start, start + duration) seconds, of a colour class."""

    start: float
    duration: float
    kind: str
    name: str
    label: str = ""  # short text for wide boxes, e.g. `F3` for forward of micro-batch 3

    @property
    def end(self) -> float:
        return self.start + self.duration


@dataclass
class RankRow:
    """The timeline row of one rank: per lane, boxes sorted by start that never overlap."""

    rank: int
    role: str
    lanes: dict[str, list[Box]] = field(default_factory=lambda: {lane: [] for lane in LANES})

    def boxes(self) -> list[Box]:
        return [b for lane in LANES for b in self.lanes[lane]]

    def busy_s(self) -> float:
        """Seconds with at least one span running (the union of both lanes)."""
        total, reach = 0.0, float("-inf")
        for b in sorted(self.boxes(), key=lambda b: b.start):
            if b.end > reach:
                total += b.end - max(b.start, reach)
                reach = b.end
        return total


def kind_of(span: Event) -> str:
    """Colour class of a span: forward, backward, weight (the W of a split backward), optimizer,
    comm or other compute."""
    if span.get("cat") == "comm":
        return "comm"
    name = str(span.get("name", "")).lower()
    for kind in ("forward", "backward", "weight", "optimizer"):
        if name.startswith(kind):
            return kind
    return "other compute"


def lane_of(span: Event) -> str:
    return "comm" if span.get("cat") == "comm" else "compute"


def box_label(span: Event) -> str:
    """`F3`, `B3`: the op's initial and micro-batch, for pipeline pictures; else empty."""
    mb = span.get("mb")
    if mb is None:
        return ""
    return f"{str(span.get('name', '?'))[:1].upper()}{mb}"


def roles_of(summary: Mapping[str, Any]) -> dict[int, str]:
    """Rank -> role from summary['per_rank'] (missing roles are absent)."""
    roles = {}
    for r in summary.get("per_rank") or []:
        if isinstance(r, Mapping) and isinstance(r.get("rank"), int):
            roles[r["rank"]] = str(r.get("role", "?"))
    return roles


def timeline_rows(
    events: Iterable[Event], world_size: int = 0, roles: Mapping[int, str] | None = None
) -> list[RankRow]:
    """One row per rank (0..world_size-1 and every rank seen), lanes flattened, sorted by rank."""
    roles = roles or {}
    spans: dict[tuple[int, str], list[Event]] = {}
    ranks = set(range(world_size)) | set(roles)
    for e in events:
        ranks.add(int(e["rank"]))
        if e.get("event") == "span":
            spans.setdefault((int(e["rank"]), lane_of(e)), []).append(e)
    rows = []
    for rank in sorted(ranks):
        row = RankRow(rank=rank, role=roles.get(rank, "?"))
        for lane in LANES:
            row.lanes[lane] = flatten_lane(spans.get((rank, lane), []))
        rows.append(row)
    return rows


def flatten_lane(spans: Sequence[Event]) -> list[Box]:
    """Non-overlapping boxes for one lane: at each instant the innermost active span wins.

    A sweep over the span boundaries with a heap of active spans keyed by
    (latest start, earliest end, latest in input); O(n log n), so 10^5 spans are fine.
    """
    order = sorted(range(len(spans)), key=lambda i: float(spans[i]["start"]))
    points = sorted({float(s["start"]) for s in spans} | {float(s["end"]) for s in spans})
    active: list[tuple[float, float, int]] = []
    boxes: list[Box] = []
    current, piece_start, nxt = -1, 0.0, 0
    for p, q in itertools.pairwise(points):
        while nxt < len(order) and float(spans[order[nxt]]["start"]) <= p:
            i = order[nxt]
            heapq.heappush(active, (-float(spans[i]["start"]), float(spans[i]["end"]), -i))
            nxt += 1
        while active and active[0][1] <= p:
            heapq.heappop(active)
        winner = -active[0][2] if active else -1
        if winner != current:
            _close(boxes, spans, current, piece_start, p)
            current, piece_start = winner, p
        if q == points[-1]:
            _close(boxes, spans, current, piece_start, q)
    return boxes


def _close(boxes: list[Box], spans: Sequence[Event], index: int, start: float, end: float) -> None:
    if index < 0 or end <= start:
        return
    span = spans[index]
    boxes.append(Box(start, end - start, kind_of(span), str(span["name"]), box_label(span)))


def window(rows: Sequence[RankRow], max_boxes: int) -> tuple[list[RankRow], float | None]:
    """Keep the earliest `max_boxes` boxes (all rows together); the cut time, or None if all fit.

    A picture of 10^5 boxes takes long to draw and shows nothing readable; the full run stays
    in timeline.json.
    """
    starts = sorted(b.start for row in rows for b in row.boxes())
    if len(starts) <= max_boxes:
        return list(rows), None
    cut = starts[max_boxes]
    kept = []
    for row in rows:
        lanes = {lane: [b for b in boxes if b.start < cut] for lane, boxes in row.lanes.items()}
        kept.append(RankRow(rank=row.rank, role=row.role, lanes=lanes))
    return kept, cut


def chrome_trace(
    events: Iterable[Event], summary: Mapping[str, Any], roles: Mapping[int, str] | None = None
) -> dict[str, Any]:
    """Chrome trace / Perfetto JSON: pid = rank ("rank R (role)"), tid 0 compute, 1 comm.

    Spans are `ph: "X"` with `ts`/`dur` in microseconds on the run's shared clock; step losses
    are a `loss` counter track, evaluations instant markers. Open at https://ui.perfetto.dev.
    """
    roles = dict(roles if roles is not None else roles_of(summary))
    trace: list[dict[str, Any]] = []
    ranks: set[int] = set(range(int(summary.get("world_size") or 0))) | set(roles)
    for e in events:
        rank = int(e["rank"])
        ranks.add(rank)
        item = _trace_event(e, rank)
        if item is not None:
            trace.append(item)
    meta = [m for rank in sorted(ranks) for m in _process_meta(rank, roles.get(rank, "?"))]
    other = {"strategy": summary.get("strategy"), "world_size": summary.get("world_size")}
    return {"traceEvents": meta + trace, "displayTimeUnit": "ms", "otherData": other}


def _trace_event(e: Event, rank: int) -> dict[str, Any] | None:
    us = 1e6
    kind = e.get("event")
    if kind == "span":
        args = {k: v for k, v in e.items() if k not in _SPAN_KEYS}  # step, mb, stage, bucket...
        return {
            "name": str(e["name"]),
            "cat": str(e.get("cat", "compute")),
            "ph": "X",
            "ts": round(float(e["start"]) * us, 3),
            "dur": round((float(e["end"]) - float(e["start"])) * us, 3),
            "pid": rank,
            "tid": LANES.index(lane_of(e)),
            "args": args,
        }
    if kind == "step":
        if not is_number(e["loss"]):  # NaN is not valid JSON for Perfetto
            return None
        ts = round(float(e["t"]) * us, 3)
        return {"name": "loss", "ph": "C", "ts": ts, "pid": rank, "args": {"loss": e["loss"]}}
    if kind == "eval":
        args = {k: e[k] for k in ("step", "accuracy", "loss") if k in e}
        ts = round(float(e["t"]) * us, 3)
        return {"name": "eval", "ph": "i", "s": "p", "ts": ts, "pid": rank, "tid": 0, "args": args}
    return None


def _process_meta(rank: int, role: str) -> list[dict[str, Any]]:
    meta: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": f"rank {rank} ({role})"}},
        {"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0, "args": {"sort_index": rank}},
    ]
    for tid, lane in enumerate(LANES):
        meta.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": lane}})
    return meta
