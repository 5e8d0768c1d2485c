"""The run's ``metrics.jsonl``, merged from the ranks' event files while they are written.

Every rank appends its events to ``ranks/rank{R}.jsonl``; the run's record is all of them in
time order (``(t, rank)``, file order on ties). Built at the end, that costs a read, a sort and a
write of the whole run, which kept the stopped launcher of a long run busy for seconds
(benchmarks/stop_time.py). :class:`MergedEvents` does it as the files grow instead, from a
thread of the launcher (:class:`MergeThread`, every ``INTERVAL_S``): each poll reads only what
was appended,
and writes to ``ranks/merged.part`` the lines no later line can precede — those older than
``SLACK_S`` before the newest line of the slowest rank (a rank's lines are nearly in time order:
a span is recorded when it ends, some on another thread). :meth:`MergedEvents.finish` then reads
the unread tail, writes it and renames the file: a stop costs the same whatever the run's length.

It also keeps what the launcher's summary of a stopped run needs (:meth:`MergedEvents.summary`:
last step, samples, the losses of the last step, divergence warnings), so nothing is parsed again.

The result equals a merge of the whole files at the end (:func:`merge_all`): a line that arrives
out of the order already written (older than ``SLACK_S`` behind, or a rank that started late)
marks the merge unusable and :meth:`finish` then merges the whole files, as does a rank's file
rewritten by a resume (the merge starts over at once, in the thread).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from pathlib import Path
from typing import Any

SLACK_S = 5.0
INTERVAL_S = 0.5
PART = "merged.part"
_T = re.compile(r'"t": (-?[0-9.eE+-]+)')
_Key = tuple[float, int, int]  # (t, rank, arrival): the merge's order


def _time_of(line: str) -> float:
    """The ``"t"`` of an event line without parsing it (0 when it has none)."""
    at = line.find('"t": ')
    if at < 0:
        return 0.0
    end = line.find(",", at)
    if end > at:
        with contextlib.suppress(ValueError):
            return float(line[at + 5:end])
    m = _T.search(line)  # "t" the last key
    return float(m.group(1)) if m else 0.0


def _parses(line: str) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def _rank_of(path: Path) -> int:
    return int(path.stem[4:]) if path.stem[4:].isdigit() else 0


class MergedEvents:
    """The merge of ``ranks/rank*.jsonl`` into ``out`` (default ``RUN/metrics.jsonl``).

    ``world``: how many rank files the run has; lines are written before the end only once all
    exist (None: only at the end)."""

    def __init__(self, ranks: Path, out: Path | None = None, world: int | None = None,
                 slack_s: float = SLACK_S) -> None:
        self.ranks, self.world, self.slack_s = ranks, world, slack_s
        self.out = out or ranks.parent / "metrics.jsonl"
        self.part = ranks / PART
        self._lock = threading.Lock()
        self._start()

    def _start(self) -> None:
        self._files: dict[Path, tuple[int, int]] = {}  # path -> (inode, offset read)
        self._held: dict[Path, str] = {}  # each file's newest whole line, not merged yet
        self._newest: dict[int, float] = {}  # rank -> newest t read
        self._pending: list[tuple[_Key, str]] = []
        self._seq = 0
        self._last: _Key | None = None  # the last line written
        self._broken = False
        self._sink: Any = None
        self.last_step = 0
        self.samples = 0
        self._last_losses: list[tuple[_Key, float]] = []
        self.warned: set[int] = set()

    def poll(self) -> None:
        """Read what the ranks appended and write what can no longer be preceded."""
        with self._lock:
            if self._read(final=False):
                self._write(final=False)

    def finish(self) -> None:
        """Read the rest (each file's last line only if whole), write it and rename into place.
        When the merge went out of order, merge the whole files instead."""
        with self._lock:
            if self._read(final=True) and not self._broken:
                self._write(final=True)
                self._sink.close()
                self.part.replace(self.out)
                return
            self._restart()
            self._read(final=True)
            self._write(final=True)
            self._sink.close()
            self.part.replace(self.out)

    @property
    def in_order(self) -> bool:
        """Whether every line so far came in an order the merge could follow."""
        return not self._broken

    def summary(self) -> dict[str, Any]:
        """What the launcher's summary of a stopped run reads: the last step, the most samples,
        the losses of the last step (in the record's order) and the warned steps."""
        losses = [loss for _, loss in sorted(self._last_losses)]
        return {"steps_run": self.last_step, "samples": self.samples,
                "final_loss": sum(losses) / len(losses) if losses else None,
                "divergence_warnings": sorted(self.warned)}

    def _read(self, final: bool) -> bool:
        """Read the new lines of every file; False when a file was rewritten (a resume): then
        the merge started over (nothing read yet)."""
        for path in sorted(self.ranks.glob("rank*.jsonl")):
            try:
                f = path.open("rb")
            except OSError:
                continue
            with f:
                stat = os.fstat(f.fileno())
                known, offset = self._files.get(path, (stat.st_ino, 0))
                if known != stat.st_ino or stat.st_size < offset:
                    self._restart()
                    return False
                f.seek(offset)
                data = f.read()
            cut = data.rfind(b"\n") + 1
            self._files[path] = (stat.st_ino, offset + cut)
            whole, rest = data[:cut].decode(), data[cut:].decode(errors="replace")
            lines = whole.splitlines()
            if path in self._held:
                lines.insert(0, self._held.pop(path))
            if final and rest:
                lines.append(rest)
            if lines and not final:
                self._held[path] = lines.pop()  # perhaps cut by a kill: known only at the end
            elif lines and not _parses(lines[-1]):
                lines.pop()  # a line cut short by a kill
            self._add(_rank_of(path), lines)
        return True

    def _restart(self) -> None:
        if self._sink is not None:
            self._sink.close()
        self.part.unlink(missing_ok=True)
        self._start()

    def _add(self, rank: int, lines: list[str]) -> None:
        for line in lines:
            t = _time_of(line)
            key = (t, rank, self._seq)
            self._seq += 1
            if self._last is not None and key[:2] < self._last[:2]:
                self._broken = True  # it belongs before a line already written
            self._pending.append((key, line))
            self._newest[rank] = max(t, self._newest.get(rank, t))
            if '"event": "step"' in line or '"event": "divergence"' in line:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue  # two lines run together: a killed rank's cut line, then a restart's
                if ev.get("event") == "step":
                    self._step(key, ev)
                elif ev.get("event") == "divergence":
                    self.warned.add(int(ev["step"]))

    def _step(self, key: _Key, ev: dict[str, Any]) -> None:
        step = int(ev["step"])
        self.samples = max(self.samples, int(ev.get("samples") or 0))
        if step > self.last_step:
            self.last_step, self._last_losses = step, []
        if step == self.last_step and ev.get("loss") is not None:
            self._last_losses.append((key, ev["loss"]))

    def _write(self, final: bool) -> None:
        if final:
            upto = float("inf")
        elif self.world is None or len(self._newest) < self.world:
            return  # a rank not seen yet may have older lines
        else:
            upto = min(self._newest.values()) - self.slack_s
        ready = [p for p in self._pending if p[0][0] < upto]
        self._pending = [p for p in self._pending if p[0][0] >= upto]
        if self._sink is None and (ready or final):
            self._sink = self.part.open("w", encoding="utf-8", newline="\n")
        if ready:
            ready.sort(key=lambda p: p[0])
            self._sink.write("".join(line + "\n" for _, line in ready))
            self._sink.flush()
            self._last = ready[-1][0]


def merge_all(ranks: Path, out: Path | None = None) -> MergedEvents:
    """Merge the whole files at once (a run whose launcher did not follow them)."""
    merged = MergedEvents(ranks, out)
    merged.finish()
    return merged


class MergeThread:
    """``with MergeThread(merged):`` polls ``merged`` every ``INTERVAL_S`` seconds in a thread."""

    def __init__(self, merged: MergedEvents, interval_s: float = INTERVAL_S) -> None:
        self.merged, self.interval_s = merged, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="polytrain-merge", daemon=True)

    def __enter__(self) -> MergeThread:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            with contextlib.suppress(OSError, ValueError):
                self.merged.poll()
