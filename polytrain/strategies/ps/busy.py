"""A server's busy time: the union of the intervals during which it received a push or handled a
message, in bounded memory.

Intervals come from several threads (a receiver per worker, the serving thread) and overlap, so
busy time is the length of their union, not their sum. Keeping every interval of a long run grows
without bound (two per message), so once ``COMPACT_AT`` wait, the older half (by start) is merged
into a running total and a frontier (the end of what was merged); a later interval that starts
before the frontier counts only from it. Intervals are recorded when they end, at most one
message late, so the only error is a later interval that fell wholly into a gap before the
frontier (none when the older half has no gaps wider than one message's receive).
"""

from __future__ import annotations

import threading

COMPACT_AT = 4096


class BusyClock:
    def __init__(self) -> None:
        self._open: list[tuple[float, float]] = []
        self._total = 0.0
        self._frontier = float("-inf")
        self._lock = threading.Lock()

    def add(self, start: float, end: float) -> None:
        with self._lock:
            self._open.append((start, end))
            if len(self._open) >= COMPACT_AT:
                self._open.sort()
                old, self._open = self._open[: COMPACT_AT // 2], self._open[COMPACT_AT // 2:]
                self._total, self._frontier = _union(old, self._total, self._frontier)

    def __len__(self) -> int:
        return len(self._open)

    def seconds(self) -> float:
        with self._lock:
            return _union(sorted(self._open), self._total, self._frontier)[0]


def _union(spans: list[tuple[float, float]], total: float, end: float) -> tuple[float, float]:
    """Add the union of ``spans`` (sorted by start) beyond ``end`` to ``total``: (total, end)."""
    for a, b in spans:
        if b > end:
            total += b - max(a, end)
            end = b
    return total, end
