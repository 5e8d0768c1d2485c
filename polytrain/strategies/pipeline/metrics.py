"""What a pipeline run reports in ``strategy_metrics``, computed at rank 0 from every stage's record.

Bubble fraction, measured. Each stage records, per segment (one mini-batch for gpipe/1f1b, a run of
mini-batches for pipedream), a window: the start of its first compute span, the end of its last,
and its busy seconds (the sum of its forward/backward/optimizer spans inside). For segment w the
pipeline's wall is W_w = max end − min start over stages (clocks share an origin set after a
barrier), and

    bubble = Σ_w Σ_s (W_w − busy_{s,w}) / Σ_w (P · W_w)

(with replicated stages the sum runs over every rank, P being the number of ranks)

— idle stage-time over stage-time, the measured counterpart of (P−1)/(M+P−1). It includes what
the textbook formula leaves out: transfers, imbalance between stages, and the load of the host.

Bubble fraction, replayed (`schedule_bubble`). Each stage also records the compute seconds of
every action it ran. Replaying the same schedule with exactly those durations, free messages and
no runtime (`checks.simulate_times`) gives the bubble the schedule itself implies for the compute
this machine delivered — stage imbalance, micro-batch sizes and compute jitter included. The
textbook (P−1)/(M+P−1) is its special case for equal costs; the measured bubble minus the replayed
one is what the runtime and the transfers added (late messages, time between actions).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from polytrain.schedules.actions import Action
from polytrain.schedules.checks import simulate_times, timed_bubble


def bubble_fraction(windows: list[list[list[float]]]) -> float:
    """``windows[stage][segment] = [start, end, busy, wait]`` (or [] if idle) -> idle / (stages x wall)."""
    stages = len(windows)
    if stages == 0:
        return 0.0
    idle = total = 0.0
    for seg in zip(*windows, strict=True):
        ran = [w for w in seg if w]  # an empty window: the stage computed nothing this segment
        wall = max((w[1] for w in ran), default=0.0) - min((w[0] for w in ran), default=0.0)
        if wall <= 0:
            continue
        idle += sum(max(0.0, wall - (w[2] if w else 0.0)) for w in seg)
        total += stages * wall
    return idle / total if total else 0.0


def segment_bubbles(windows: list[list[list[float]]]) -> list[float]:
    """The bubble of each segment on its own (one mini-batch for gpipe/1f1b)."""
    return [bubble_fraction([[w] for w in seg]) for seg in zip(*windows, strict=True) if any(seg)]


def overhead_fraction(windows: list[list[list[float]]]) -> float:
    """The part of `bubble_fraction` that is the runtime's own time between actions (packing,
    posting receives, bookkeeping): inside a stage's window, neither compute nor waiting for a
    message. ``bubble_fraction − overhead_fraction`` is the idle time the schedule's dependencies
    cause — what (P−1)/(M+P−1) predicts."""
    stages = len(windows)
    gaps = total = 0.0
    for seg in zip(*windows, strict=True):
        ran = [w for w in seg if w]
        wall = max((w[1] for w in ran), default=0.0) - min((w[0] for w in ran), default=0.0)
        if wall <= 0:
            continue
        gaps += sum(max(0.0, (w[1] - w[0]) - w[2] - (w[3] if len(w) > 3 else 0.0)) for w in ran)
        total += stages * wall
    return gaps / total if total else 0.0


def schedule_bubble(ops: list[list[list[list[Any]]]], latency: float = 0.0) -> tuple[float, list[float]]:
    """``ops[stage][segment] = [[op, mb, seconds], ...]`` (the order each stage ran; with virtual
    stages each entry ends with its chunk, ``[op, mb, seconds, chunk]``) -> the bubble of the
    schedule replayed with those durations and ``latency`` seconds per message, over all segments
    as `bubble_fraction` aggregates them, and per segment."""
    stages = len(ops)
    idle = total = 0.0
    per_segment = []
    for seg in zip(*ops, strict=True):
        orders = {s: [_action(s, o) for o in seg[s]] for s in range(stages)}
        durations = {_action(s, o): float(o[2]) for s in range(stages) for o in seg[s]}
        timeline = simulate_times(orders, durations, latency)
        rows = [r for r in timeline.values() if r]
        if not rows:
            continue
        wall = max(r[-1][2] for r in rows) - min(r[0][1] for r in rows)
        if wall <= 0:
            continue
        gap = stages * wall - sum(end - start for r in rows for _, start, end in r)
        idle += gap
        total += stages * wall
        per_segment.append(gap / (stages * wall))
    return (idle / total if total else 0.0), per_segment


def _action(stage: int, entry: list[Any]) -> Action:
    """An ``ops`` entry as the action it timed (its chunk, where it names one)."""
    return Action(int(entry[3]) if len(entry) > 3 else stage, entry[0], int(entry[1]))


def uniform_bubble(orders: Mapping[int, list[Action]], costs: Mapping[str, float]) -> float:
    """The bubble of ``orders`` with every F, B, W taking ``costs[op]`` and free messages: each
    schedule's formula (per rank, B whole or the input gradient alone: 1F1B (P−1)(F+B),
    interleaved (P−1)(F+B+W) per chunk, ZB-H1 (P−1)(F+B−W), …, as `tests/test_schedule_virtual.py`
    checks) evaluated at these costs."""
    durations = {a: float(costs.get(a.op, 0.0)) for row in orders.values() for a in row}
    return timed_bubble(simulate_times(orders, durations))


def op_seconds(ops: list[list[list[Any]]]) -> dict[str, float]:
    """One stage's median compute seconds per forward (``F``), backward (``B``; the input gradient
    alone in a split backward) and weight-gradient (``W``) action."""
    out = {}
    for op in ("F", "B", "W"):
        secs = [float(o[2]) for seg in ops for o in seg if o[0] == op]
        if secs:
            out[op] = statistics.median(secs)
    return out


def theoretical_bubble(stages: int, microbatches: int) -> float:
    """GPipe's (P−1)/(M+P−1) for balanced stages and free transfers."""
    return (stages - 1) / (microbatches + stages - 1)


def summarise(records: list[dict[str, Any]], head: dict[str, Any]) -> dict[str, Any]:
    """Rank 0's ``strategy_metrics``: ``head`` (schedule, partition, ...) plus per-stage figures."""
    lanes = sorted(records, key=lambda r: (r["stage"], r.get("replica", 0)))
    records = [r for r in lanes if r.get("replica", 0) == 0]  # one per stage: replicas are alike
    out = dict(head)
    out["bubble_fraction"] = bubble_fraction([r["windows"] for r in lanes])  # over every rank
    out["overhead_fraction"] = overhead_fraction([r["windows"] for r in lanes])
    per_segment = segment_bubbles([r["windows"] for r in lanes])
    if per_segment:  # robust to a mini-batch that a busy host stalled
        out["bubble_fraction_median"] = statistics.median(per_segment)
    if head.get("flush"):
        if head.get("schedule") in ("gpipe", "1f1b"):  # the others: the replay below is their theory
            out["bubble_fraction_theory"] = theoretical_bubble(len(records), head["microbatches"])
        if len(lanes) == len(records) and all(r.get("ops") for r in lanes):  # one rank per stage
            replayed, per_seg = schedule_bubble([r["ops"] for r in lanes])
            out["bubble_fraction_schedule"] = replayed
            out["bubble_fraction_schedule_median"] = statistics.median(per_seg) if per_seg else 0.0
            out["op_s_per_stage"] = [op_seconds(r["ops"]) for r in lanes]
    if len(lanes) > len(records):
        out["busy_s_per_rank"] = [r["busy_s"] for r in lanes]
    per_stage = ("busy_s", "peak_memory_bytes", "peak_activation_bytes", "peak_in_flight",
                 "peak_outstanding_sends")
    for key in per_stage:
        out[f"{key}_per_stage"] = [r[key] for r in records]
    for key in (
        "stash_bytes_peak",
        "stashed_versions_peak",
        "prediction_bytes_peak",
        "predicted_versions_peak",
    ):
        if key in records[0]:
            out[f"{key}_per_stage"] = [r[key] for r in records]
    if "staleness" in records[0]:
        out["staleness"] = {str(r["stage"]): r["staleness"] for r in records}
        out["max_staleness"] = max(r["max_staleness"] for r in records)
    if "predicted_distance" in records[0]:
        out["predicted_distance"] = {str(r["stage"]): r["predicted_distance"] for r in records}
    out["layers_per_stage"] = [r["layers"] for r in records]
    return out
