"""Per-rank metrics: events in memory and streamed to ``ranks/rank{R}.jsonl`` as they happen.

The stream lets the launcher draw the progress bar and, when a rank dies, say at which step.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


class Recorder:
    """Collects one rank's events; thread-safe (DDP hooks finish on gloo's threads)."""

    def __init__(self, rank: int, path: Path | None = None) -> None:
        self.rank = rank
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._file: IO[str] | None = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a")
        self.t0 = time.perf_counter()
        self.last_step = 0

    def start_clock(self) -> None:
        """Set the clock origin (called right after a start barrier, so ranks share it)."""
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        rec = {"event": event, "rank": self.rank, "t": round(self.now(), 6), **fields}
        line = json.dumps(rec)
        with self._lock:
            self.events.append(rec)
            if self._file is not None:
                self._file.write(line + "\n")
                # Spans stay buffered; everything else is flushed at once, because the
                # launcher's progress bar and its failure report read this file while we run.
                if event != "span":
                    self._file.flush()
        return rec

    def step(self, step: int, loss: float, samples: int) -> None:
        self.last_step = step
        self.emit("step", step=step, loss=float(loss), samples=int(samples))

    def add_span(self, name: str, cat: str, start: float, end: float, **fields: Any) -> None:
        """A finished span with explicit times (for work that ends on another thread)."""
        self.emit("span", name=name, cat=cat, start=round(start, 6), end=round(end, 6), **fields)

    @contextmanager
    def span(self, name: str, cat: str = "compute", **fields: Any) -> Iterator[None]:
        start = self.now()
        try:
            yield
        finally:
            self.add_span(name, cat, start, self.now(), **fields)

    def busy_s(self) -> float:
        """Total time in compute spans (a rank's utilisation numerator)."""
        return sum(e["end"] - e["start"] for e in self.events
                   if e["event"] == "span" and e.get("cat") == "compute")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
