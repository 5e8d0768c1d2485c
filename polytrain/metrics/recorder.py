"""Per-rank metrics: events streamed to ``ranks/rank{R}.jsonl`` as the run goes.

The stream lets the launcher draw the progress bar and, when a rank dies, say at which step. It
is written in batches: every event except ``step`` and ``span`` is written and flushed at once;
step and span events are written with the next flush, which happens at least every
``FLUSH_EVERY_S`` seconds or once ``BUFFER`` of them wait — so a step of a few milliseconds does
not pay a system call and a JSON encoding per span (a timeline span is recorded as a tuple and
encoded when it is written). What is written leaves memory: a recorder with a file holds at most
``BUFFER`` events, however long the run (:attr:`Recorder.events` reads them back from the file).
A recorder without a file (tests, in-process benchmarks) keeps every event in memory.

``sample_resources`` adds a ``resources`` event (current RSS, plus what the caller passes, e.g. a
server's replies in flight) at most every ``RESOURCES_EVERY_S`` seconds: the memory of a long run
over time, which the soak tests fit a slope to.

A resumed or restarted rank calls :meth:`Recorder.rewind` with its checkpoint's step and time:
the events of later steps (which it will run again) leave the file and the clock continues from
the checkpoint's, so the file, and the run's ``metrics.jsonl`` built from every rank's file,
hold each step once and cover the whole run.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from polytrain.metrics.jsonsafe import json_safe

FLUSH_EVERY_S = 0.05
BUFFER = 4096  # events held before a write, whatever the time
RESOURCES_EVERY_S = 0.5
# Events a rewind keeps whatever their time: what happened to the processes, not to the steps.
_HISTORY = frozenset({"process", "note", "start", "resume", "interrupted"})
# Events a run's summary reads besides steps (polytrain.launch.rundir.build_summary).
_SUMMARY = frozenset({"resume", "tally", "skipped", "divergence"})


def current_rss_bytes() -> int:
    """This process's resident set now (Linux: /proc/self/statm), else its peak so far."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        scale = 1 if sys.platform == "darwin" else 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def _line(event: dict[str, Any]) -> str:
    """One event as a JSON line, NaN/inf as null: encoded by the C encoder alone, and only an
    event that holds a non-finite float (a NaN loss) also walks through :func:`json_safe`."""
    try:
        return json.dumps(event, allow_nan=False) + "\n"
    except ValueError:
        return json.dumps(json_safe(event)) + "\n"


# A span as recorded on the hot path: (name, cat, start, end, fields).
_Span = tuple[str, str, float, float, dict[str, Any]]
_QUOTED: dict[str, str] = {}  # span names and categories as JSON strings (a few distinct ones)


def _quoted(text: str) -> str:
    q = _QUOTED.get(text)
    if q is None:
        q = _QUOTED[text] = json.dumps(text)
    return q


def _span_line(rank: int, span: _Span) -> str:
    """One span as the JSON line :func:`_line` would write for its event, formatted directly:
    spans are most of a run's events, and a dict built and encoded per span was most of the
    recorder's cost per step (30 of 41 us for 3 spans and a step, measured on the loaded
    2-vCPU machine). Same keys in the same order; floats as ``repr`` writes them, as json does."""
    name, cat, start, end, fields = span
    t = round(end, 6)
    head = (f'{{"event": "span", "rank": {rank}, "t": {t!r}, "name": {_quoted(name)}, '
            f'"cat": {_quoted(cat)}, "start": {round(start, 6)!r}, "end": {t!r}')
    if not fields:
        return head + "}\n"
    step = fields.get("step")
    if len(fields) == 1 and type(step) is int:
        return f'{head}, "step": {step}}}\n'
    try:
        return f"{head}, {json.dumps(fields, allow_nan=False)[1:]}\n"
    except (TypeError, ValueError):  # a non-finite float or a value json cannot encode alone
        return head + ", " + json.dumps(json_safe(fields))[1:] + "\n"


class _SpanTimer:
    """``with recorder.span(...)``: a plain context manager (cheaper than a generator's)."""

    __slots__ = ("_cat", "_fields", "_name", "_rec", "_start")

    def __init__(self, rec: Recorder, name: str, cat: str, fields: dict[str, Any]) -> None:
        self._rec, self._name, self._cat, self._fields = rec, name, cat, fields
        self._start = 0.0

    def __enter__(self) -> None:
        step = self._fields.get("step")
        if step is not None:
            self._rec.current_step = step  # the step a span without one (a DDP hook's) belongs to
        self._start = time.perf_counter() - self._rec.t0

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        rec = self._rec
        rec._add((self._name, self._cat, self._start, time.perf_counter() - rec.t0, self._fields))


class Recorder:
    """Collects one rank's events; thread-safe (DDP hooks finish on gloo's threads)."""

    def __init__(self, rank: int, path: Path | None = None, *, fresh: bool = False) -> None:
        """``fresh``: the file starts empty (a new run), else this process appends to it."""
        self.rank = rank
        self._pending: list[dict[str, Any] | _Span] = []  # not yet in the file (all, without one)
        self._lock = threading.Lock()
        self._file: IO[str] | None = None
        self._path = path
        self._offset = 0  # where this process's events start in the file (it may be appended to)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("w" if fresh else "a")
            self._offset = self._file.tell()
        self.t0 = time.perf_counter()
        self.t_base = 0.0  # the whole run's clock when this process's clock started (a resume)
        self.resumed: dict[str, Any] | None = None
        self.base_bytes = 0  # bytes this rank sent in the run's earlier launches (its last tally)
        self._earlier: list[float] = []  # this rank's losses of the steps kept by a resume, in order
        self._flushed_at = self.t0
        self._sampled_at = float("-inf")
        self._busy = 0.0
        self.last_step = 0
        self.current_step: int | None = None  # the step of the last span opened with one
        self._digest: list[dict[str, Any]] = []  # the events a summary reads (summary_events)
        self._top: dict[str, dict[str, Any]] = {}  # "step"/"samples": the step event of the most

    def start_clock(self) -> None:
        """Set the clock origin (called right after a start barrier, so ranks share it)."""
        self.t0 = time.perf_counter() - self.t_base

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
        """Every event this process recorded, in order, as JSON-able dicts (read back from the
        file when there is one: only the unwritten tail is in memory)."""
        with self._lock:
            self._write_pending()
            log = list(self._pending) if self._file is None else []
        if self._path is None:
            return [self._as_event(item) for item in log]
        with self._path.open() as f:
            f.seek(self._offset)
            return [json.loads(line) for line in f if line.strip()]

    def summary_events(self) -> list[dict[str, Any]]:
        """The few events of this rank that the run's summary reads, kept as they are recorded
        (a long run's file need not be read back): resumes, tallies, skipped steps, divergence
        warnings, and of the steps: the last, the one with the most samples and those a resume
        started from. A summary built from them equals one built from every event."""
        with self._lock:
            kept = {id(e): e for e in [*self._digest, *self._top.values()]}
        return sorted(kept.values(), key=lambda e: e["t"])

    def _note(self, rec: dict[str, Any]) -> None:
        """Keep ``rec`` for :meth:`summary_events` if the summary reads it."""
        event = rec.get("event")
        if event in _SUMMARY:
            self._digest.append(rec)
        elif event == "step":
            for key, value in (("step", rec["step"]), ("samples", rec.get("samples") or 0)):
                top = self._top.get(key)
                if top is None or value > (top.get(key) or 0):
                    self._top[key] = rec

    def _write_pending(self) -> None:
        """Write what is not yet in the file, flush and forget it (the caller holds the lock)."""
        if self._file is None:
            return
        pending, self._pending = self._pending, []
        if pending:
            rank = self.rank
            self._file.write("".join(_line(e) if isinstance(e, dict) else _span_line(rank, e)
                                     for e in pending))
        self._file.flush()
        self._flushed_at = time.perf_counter()

    def _due(self) -> bool:
        return (len(self._pending) >= BUFFER
                or time.perf_counter() - self._flushed_at >= FLUSH_EVERY_S)

    def emit(self, event: str, **fields: Any) -> dict[str, Any]:
        rec = {"event": event, "rank": self.rank, "t": round(self.now(), 6), **fields}
        with self._lock:
            self._pending.append(rec)
            self._note(rec)
            if event != "step" or self._due():
                self._write_pending()
        return rec

    def rewind(self, step: int, t: float | None = None, **fields: Any) -> None:
        """Resume the record at ``step``: drop what was recorded of later steps (they run again),
        continue the clock from ``t`` (the checkpoint's time; default: the newest kept step's),
        and note a ``resume`` event. A second call for the same step does nothing."""
        if self.resumed is not None and self.resumed["from_step"] == step:
            return
        with self._lock:
            self._write_pending()
            old = self._read_all()
            kept = [e for e in old if self._keeps(e, step, t)]
            if self._file is not None and self._path is not None:
                self._file.close()
                tmp = self._path.with_suffix(".rewind")
                tmp.write_text("".join(json.dumps(e) + "\n" for e in kept))
                tmp.replace(self._path)
                self._file = self._path.open("a")
                self._offset = 0
            else:
                self._pending = list(kept)
            steps = [e for e in kept if e.get("event") == "step"]
            self._digest, self._top = [], {}
            for e in kept:
                self._note(e)
            starts = {int(e["from_step"]) for e in kept if e.get("event") == "resume"} | {step}
            self._digest += [e for e in steps if int(e["step"]) in starts]
            self._earlier = [float(e["loss"]) for e in sorted(steps, key=lambda e: e["step"])
                            if e.get("rank") == self.rank and isinstance(e.get("loss"), (int, float))]
            base = t if t is not None else max((float(e["t"]) for e in steps), default=0.0)
            self.t0 -= base - self.t_base
            self.t_base = base
            tallies = [e for e in kept if e.get("event") == "tally"]
            self.base_bytes = int(tallies[-1]["bytes_sent"]) if tallies else 0
            self.resumed = {"from_step": step, "t": base, "bytes_sent": self.base_bytes,
                            "samples": max((int(e.get("samples") or 0) for e in steps), default=0)}
        self.emit("resume", from_step=step, t_base=base, **fields)

    def earlier_losses(self) -> list[float]:
        """This rank's losses of the steps before the resume (none in a fresh run)."""
        return self._earlier

    def _read_all(self) -> list[dict[str, Any]]:
        """Every event recorded so far, in the file or in memory (the caller holds the lock)."""
        if self._path is None:
            return [self._as_event(item) for item in self._pending]
        out = []
        for line in self._path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue  # a line cut short by a killed process
        return out

    @staticmethod
    def _keeps(ev: dict[str, Any], step: int, t: float | None) -> bool:
        if ev.get("event") in _HISTORY:
            return True
        s = ev.get("step")
        if isinstance(s, int):
            return s <= step
        return t is None or float(ev.get("t", 0.0)) <= t

    def sample_resources(self, **fields: Any) -> None:
        """A ``resources`` event (rss_bytes and ``fields``), at most every RESOURCES_EVERY_S."""
        now = time.perf_counter()
        if now - self._sampled_at < RESOURCES_EVERY_S:
            return
        self._sampled_at = now
        self.emit("resources", rss_bytes=current_rss_bytes(), **fields)

    def flush(self) -> None:
        with self._lock:
            self._write_pending()

    def step(self, step: int, loss: float, samples: int) -> None:
        self.last_step = step
        # cpu_s: the process's CPU time so far, all its threads (a collective library's included):
        # beside the wall clock, what a step cost the machine's cores
        cpu = round(time.process_time(), 6)
        self.emit("step", step=step, loss=float(loss), samples=int(samples), cpu_s=cpu)

    def tally(self, step: int, bytes_sent: int) -> None:
        """A ``tally`` event at checkpoint ``step``: the bytes this rank has sent in the whole run
        so far (earlier launches' included), so that a resumed run's summary covers every
        launch: the next launch starts its count from the tally of the step it resumes at."""
        self.emit("tally", step=step, bytes_sent=self.base_bytes + int(bytes_sent))

    def add_span(self, name: str, cat: str, start: float, end: float, **fields: Any) -> None:
        """A finished span with explicit times (for work that ends on another thread)."""
        self._add((name, cat, start, end, fields))

    def _add(self, span: _Span) -> None:
        with self._lock:
            self._pending.append(span)
            if span[1] == "compute":
                self._busy += span[3] - span[2]
            if self._file is not None and len(self._pending) >= BUFFER:
                self._write_pending()

    def span(self, name: str, cat: str = "compute", **fields: Any) -> _SpanTimer:
        return _SpanTimer(self, name, cat, fields)

    def busy_s(self) -> float:
        """Total time in compute spans (a rank's utilisation numerator)."""
        with self._lock:
            return self._busy

    def close(self) -> None:
        with self._lock:
            self._write_pending()
            if self._file is not None:
                self._file.close()
                self._file = None
