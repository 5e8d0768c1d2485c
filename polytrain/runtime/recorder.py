"""Per-rank metrics: events in memory and streamed to ``ranks/rank{R}.jsonl`` as the run goes.

The stream lets the launcher draw the progress bar and, when a rank dies, say at which step. It
is written in batches: every event except ``step`` and ``span`` is written and flushed at once;
step and span events are written with the next flush, which happens at least every
``FLUSH_EVERY_S`` seconds — so a step of a few milliseconds does not pay a system call and a
JSON encoding per span (a timeline span is recorded as a tuple and encoded when it is written).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any

FLUSH_EVERY_S = 0.05

# A span as recorded on the hot path: (name, cat, start, end, fields).
_Span = tuple[str, str, float, float, dict[str, Any]]


class _SpanTimer:
    """``with recorder.span(...)``: a plain context manager (cheaper than a generator's)."""

    __slots__ = ("_cat", "_fields", "_name", "_rec", "_start")

    def __init__(self, rec: Recorder, name: str, cat: str, fields: dict[str, Any]) -> None:
        self._rec, self._name, self._cat, self._fields = rec, name, cat, fields
        self._start = 0.0

    def __enter__(self) -> None:
        self._start = time.perf_counter() - self._rec.t0

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        rec = self._rec
        rec.add_span(self._name, self._cat, self._start, time.perf_counter() - rec.t0, **self._fields)


class Recorder:
    """Collects one rank's events; thread-safe (DDP hooks finish on gloo's threads)."""

    def __init__(self, rank: int, path: Path | None = None) -> None:
        self.rank = rank
        self._log: list[dict[str, Any] | _Span] = []
        self._written = 0
        self._lock = threading.Lock()
        self._file: IO[str] | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a")
        self.t0 = time.perf_counter()
        self._flushed_at = self.t0
        self.last_step = 0

    def start_clock(self) -> None:
        """Set the clock origin (called right after a start barrier, so ranks share it)."""
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def _as_event(self, item: dict[str, Any] | _Span) -> dict[str, Any]:
        if isinstance(item, dict):
            return item
        name, cat, start, end, fields = item
        return {"event": "span", "rank": self.rank, "t": round(end, 6), "name": name, "cat": cat,
                "start": round(start, 6), "end": round(end, 6), **fields}

    @property
    def events(self) -> list[dict[str, Any]]:
        """Every event so far, in the order recorded, as JSON-able dicts."""
        with self._lock:
            log = list(self._log)
        return [self._as_event(item) for item in log]

    def _write_pending(self) -> None:
        """Write what is not yet in the file and flush (the caller holds the lock)."""
        if self._file is None:
            return
        pending = self._log[self._written:]
        self._written = len(self._log)
        if pending:
            self._file.write("".join(json.dumps(self._as_event(e)) + "\n" for e in pending))
        self._file.flush()
        self._flushed_at = time.perf_counter()

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        rec = {"event": event, "rank": self.rank, "t": round(self.now(), 6), **fields}
        with self._lock:
            self._log.append(rec)
            if event != "step" or time.perf_counter() - self._flushed_at >= FLUSH_EVERY_S:
                self._write_pending()
        return rec

    def flush(self) -> None:
        with self._lock:
            self._write_pending()

    def step(self, step: int, loss: float, samples: int) -> None:
        self.last_step = step
        self.emit("step", step=step, loss=float(loss), samples=int(samples))

    def add_span(self, name: str, cat: str, start: float, end: float, **fields: Any) -> None:
        """A finished span with explicit times (for work that ends on another thread)."""
        with self._lock:
            self._log.append((name, cat, start, end, fields))

    def span(self, name: str, cat: str = "compute", **fields: Any) -> _SpanTimer:
        return _SpanTimer(self, name, cat, fields)

    def busy_s(self) -> float:
        """Total time in compute spans (a rank's utilisation numerator)."""
        with self._lock:
            log = list(self._log)
        total = 0.0
        for item in log:
            if isinstance(item, tuple):
                if item[1] == "compute":
                    total += item[3] - item[2]
            elif item["event"] == "span" and item.get("cat") == "compute":
                total += item["end"] - item["start"]
        return total

    def close(self) -> None:
        with self._lock:
            self._write_pending()
            if self._file is not None:
                self._file.close()
                self._file = None
