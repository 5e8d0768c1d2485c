"""Loss and accuracy curves from events (pure data; the plots draw these).

A step's loss is the mean over the ranks that reported that step: ranks of some strategies
(parameter servers, actors) report no steps, and asynchronous workers report different step
numbers at different times. The step counts as done when the last of those ranks finished it,
so its time and its sample count are the largest reported.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

Event = Mapping[str, Any]


@dataclass(frozen=True)
class LossPoint:
    step: int
    t: float  # seconds since training start
    samples: float  # global samples processed so far
    loss: float  # mean over the ranks that reported this step
    ranks: int  # how many ranks reported it


@dataclass(frozen=True)
class EvalPoint:
    step: int
    t: float
    accuracy: float


def loss_curve(events: Iterable[Event]) -> list[LossPoint]:
    """One point per step number, sorted by step; non-finite losses are left out."""
    by_step: dict[int, list[Event]] = {}
    for e in events:
        if e.get("event") == "step" and math.isfinite(float(e["loss"])):
            by_step.setdefault(int(e["step"]), []).append(e)
    return [
        LossPoint(
            step=step,
            t=max(float(e["t"]) for e in group),
            samples=max(float(e["samples"]) for e in group),
            loss=sum(float(e["loss"]) for e in group) / len(group),
            ranks=len({e["rank"] for e in group}),
        )
        for step, group in sorted(by_step.items())
    ]


def eval_curve(events: Iterable[Event]) -> list[EvalPoint]:
    """Evaluation accuracy over time, sorted by time (evaluations without one — a regression's
    loss-only evaluation — have no point)."""
    points = [
        EvalPoint(step=int(e["step"]), t=float(e["t"]), accuracy=float(e["accuracy"]))
        for e in events
        if e.get("event") == "eval" and e.get("accuracy") is not None
    ]
    return sorted(points, key=lambda p: p.t)


def moving_average(values: list[float], window: int) -> list[float]:
    """Centred mean over up to `window` values; same length as the input.

    Centred rather than trailing, so the smooth line does not lag behind the raw one; the
    window shrinks symmetrically near the ends, so the line starts and ends on the data.
    """
    half = max(window, 1) // 2
    prefix = [0.0]
    for v in values:
        prefix.append(prefix[-1] + v)
    out = []
    for i in range(len(values)):
        h = min(half, i, len(values) - 1 - i)
        lo, hi = i - h, i + h + 1
        out.append((prefix[hi] - prefix[lo]) / (hi - lo))
    return out
