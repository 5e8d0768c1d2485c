"""Progress bars on long work.

Launched locally, the launcher draws the bar in the user's terminal by following rank 0's event
stream (``ranks/rank0.jsonl``), so worker output stays in the rank logs. Under plain ``torchrun``
there is no such parent: rank 0 draws the bar itself on stderr.

When the launcher's output is not a terminal (CI, nohup, a cluster scheduler's log) a bar would
print nothing useful until the end, so the follower prints one plain line every
``POLYTRAIN_PROGRESS_S`` seconds (default 10) and one at the end::

    gpipe ×2 step 120/300 loss 0.4321 samples/s 1234.5 elapsed 12.3s

The loss is the mean over the ranks that report a loss of their latest step's loss, the quantity
the summary's ``final_loss`` averages too; samples/s is rank 0's samples over its elapsed time.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Self

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

import polytrain.env as env

PARENT_PROGRESS_ENV = env.PARENT_PROGRESS
PLAIN_EVERY_ENV = env.PROGRESS_S


def make_progress(console: Console | None = None) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TimeElapsedColumn(),
        console=console or Console(stderr=True),
        transient=False,
    )


class RankProgress:
    """Rank 0's own bar (torchrun); a no-op on other ranks or when the launcher draws it.

    Updated by time, not by step: a bar redraws a few times a second, so handing it every step
    of a 1 ms step was work (a lock, a task lookup, a format) that nobody could see."""

    every_s = 0.1

    def __init__(self, enabled: bool, total: int, description: str) -> None:
        self._progress: Progress | None = None
        self._total = total
        self._shown_at = float("-inf")
        if enabled:
            self._progress = make_progress()
            self._task = self._progress.add_task(description, total=total, loss="-")
            self._progress.start()

    def update(self, step: int, loss: float) -> None:
        if self._progress is None:
            return
        now = time.perf_counter()
        if now - self._shown_at >= self.every_s or step >= self._total:
            self._shown_at = now
            self._progress.update(self._task, completed=step, loss=f"{loss:.4f}")

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


class TailJSONL:
    """Tails a JSON-lines file in a thread, handing each complete object to :meth:`_handle`,
    until stopped (the lines written before the stop are read too). :meth:`_wants` skips lines
    cheaply before they are parsed; :meth:`_open`/:meth:`_close` run in the thread around it.
    `train`'s and RL's bars (:class:`FollowEvents`) and `polytrain aco`'s follow rank 0 so."""

    interval_s = 0.2

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _open(self) -> None:
        pass

    def _close(self) -> None:
        pass

    def _wants(self, line: str) -> bool:
        return True

    def _handle(self, ev: dict[str, Any]) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        self._open()
        try:
            offset = 0
            while True:
                stopping = self._stop.is_set()
                offset = self._read(offset)
                if stopping:
                    break
                self._stop.wait(self.interval_s)
        finally:
            self._close()

    def _read(self, offset: int) -> int:
        if not self.path.is_file():
            return offset
        with self.path.open() as f:
            f.seek(offset)
            for line in f:
                if not line.endswith("\n"):
                    break  # a line still being written: read it whole next time
                offset += len(line)
                if not self._wants(line):
                    continue
                try:
                    self._handle(json.loads(line))
                except (ValueError, KeyError, TypeError):
                    continue
        return offset


class FollowEvents(TailJSONL):
    """Draws a rich bar from a rank's event file. Subclasses say which bar (:meth:`_progress`,
    :meth:`_add_task`) and what an event changes (:meth:`_apply`)."""

    def __init__(self, path: Path, console: Console) -> None:
        super().__init__(path)
        self.console = console

    def _progress(self) -> Progress:
        raise NotImplementedError

    def _add_task(self, progress: Progress) -> TaskID:
        raise NotImplementedError

    def _apply(self, progress: Progress, task: TaskID, ev: dict[str, Any]) -> None:
        raise NotImplementedError

    def _open(self) -> None:
        self._bar = self._progress()
        self._bar.start()
        self._task = self._add_task(self._bar)

    def _close(self) -> None:
        self._final()
        self._bar.stop()

    def _final(self) -> None:
        """Last words before the bar stops (e.g. the last step's loss once every rank is in)."""

    def _handle(self, ev: dict[str, Any]) -> None:
        self._apply(self._bar, self._task, ev)


class FollowProgress(FollowEvents):
    """The launcher's bar for `train`: steps done of ``total``, and the last step's loss — the
    mean over the ranks that reported it, as the summary's final loss and the piped lines."""

    def __init__(self, path: Path, total: int, description: str, console: Console) -> None:
        super().__init__(path, console)
        self.total = total
        self.description = description
        self.ranks = PlainLines(path.parent, total, description)

    def _progress(self) -> Progress:
        return make_progress(self.console)

    def _add_task(self, progress: Progress) -> TaskID:
        return progress.add_task(self.description, total=self.total, loss="-")

    def _wants(self, line: str) -> bool:
        return '"event": "step"' in line or '"event": "start"' in line  # spans etc.: nothing to draw

    def _apply(self, progress: Progress, task: TaskID, ev: dict[str, Any]) -> None:
        if ev.get("event") == "step":
            self.ranks.read()
            progress.update(task, completed=ev["step"], loss=self.ranks.mean_loss(int(ev["step"])))
        elif ev.get("event") == "start":
            progress.update(task, completed=ev.get("first_step", 1) - 1)

    def _final(self) -> None:
        self.ranks.read()
        if 0 in self.ranks.latest:
            step = int(self.ranks.latest[0]["step"])
            self._bar.update(self._task, loss=self.ranks.mean_loss(step))

    def _run(self) -> None:
        if self.console.is_terminal:
            super()._run()
            return
        plain = PlainLines(self.path.parent, self.total, self.description)
        every = float(os.environ.get(PLAIN_EVERY_ENV, "10"))
        last = time.monotonic()
        while True:
            stopping = self._stop.is_set()
            plain.read()
            if stopping or time.monotonic() - last >= every:
                line = plain.line()
                if line:
                    self.console.print(line, highlight=False, markup=False, soft_wrap=True)
                last = time.monotonic()
            if stopping:
                break
            self._stop.wait(min(self.interval_s * 5, every))


class PlainLines:
    """Every rank's step events (``rank*.jsonl`` in ``ranks``) folded into one plain line."""

    def __init__(self, ranks: Path, total: int, description: str) -> None:
        self.ranks, self.total, self.description = ranks, total, description
        self.offsets: dict[Path, int] = {}
        self.latest: dict[int, dict[str, Any]] = {}  # rank -> its newest step event
        self.eval: dict[str, Any] | None = None  # the newest evaluation (any rank's)
        # (step, eval step, ranks that reported the step) of the last line printed: a line is
        # printed again when a late rank's loss of the same step changes the mean
        self.shown: tuple[int, int, int] = (-1, -1, 0)

    def read(self) -> None:
        for path in sorted(self.ranks.glob("rank*.jsonl")):
            with path.open() as f:
                f.seek(self.offsets.get(path, 0))
                for line in f:
                    if not line.endswith("\n"):
                        break
                    self.offsets[path] = self.offsets.get(path, 0) + len(line)
                    if '"event": "step"' in line or '"event": "eval"' in line:
                        try:
                            ev = json.loads(line)
                            if ev["event"] == "eval":
                                self.eval = ev
                            else:
                                self.latest[int(ev.get("rank", path.stem[len("rank"):]))] = ev
                        except (ValueError, KeyError, TypeError):
                            continue

    def mean_loss(self, step: int) -> str:
        """The mean over ranks of their losses of ``step`` (those that reported it so far)."""
        losses = [float(e["loss"]) for e in self.latest.values()
                  if e.get("step") == step and e.get("loss") is not None]
        return f"{sum(losses) / len(losses):.4f}" if losses else "-"

    def line(self) -> str | None:
        """The current line, or None when no step or evaluation is newer than the last line
        printed; the newest evaluation's figures end the line."""
        if 0 not in self.latest:
            return None
        head = self.latest[0]
        step = int(head["step"])
        reported = sum(1 for e in self.latest.values() if e.get("step") == step)
        at = (step, int(self.eval["step"]) if self.eval else -1, reported)
        if at == self.shown:
            return None
        self.shown = at
        loss = self.mean_loss(step)
        t = float(head.get("t", 0.0))
        rate = f"{head['samples'] / t:.1f}" if t > 0 and head.get("samples") else "-"
        tested = "".join(f" test {k} {self.eval[k]:.4f}" for k in ("accuracy", "loss")
                         if self.eval and isinstance(self.eval.get(k), int | float))
        return (f"{self.description} step {step}/{self.total} loss {loss} samples/s {rate} "
                f"elapsed {t:.1f}s" + (f" (eval at step {at[1]}:{tested})" if tested else ""))
