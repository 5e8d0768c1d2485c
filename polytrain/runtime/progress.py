"""Progress bars on long work.

Launched locally, the launcher draws the bar in the user's terminal by following rank 0's event
stream (``ranks/rank0.jsonl``), so worker output stays in the rank logs. Under plain ``torchrun``
there is no such parent: rank 0 draws the bar itself on stderr.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

PARENT_PROGRESS_ENV = "POLYTRAIN_PARENT_PROGRESS"


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
    """Rank 0's own bar (torchrun); a no-op on other ranks or when the launcher draws it."""

    def __init__(self, enabled: bool, total: int, description: str) -> None:
        self._progress: Progress | None = None
        if enabled:
            self._progress = make_progress()
            self._task = self._progress.add_task(description, total=total, loss="-")
            self._progress.start()

    def update(self, step: int, loss: float) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=step, loss=f"{loss:.4f}")

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


class FollowProgress:
    """The launcher's bar: tails a rank's event file in a thread until stopped."""

    def __init__(self, path: Path, total: int, description: str, console: Console) -> None:
        self.path = path
        self.total = total
        self.description = description
        self.console = console
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> FollowProgress:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        with make_progress(self.console) as progress:
            task = progress.add_task(self.description, total=self.total, loss="-")
            offset = 0
            while True:
                stopping = self._stop.is_set()
                offset = self._read(progress, task, offset)
                if stopping:
                    break
                self._stop.wait(0.2)

    def _read(self, progress: Progress, task: Any, offset: int) -> int:
        if not self.path.is_file():
            return offset
        with self.path.open() as f:
            f.seek(offset)
            for line in f:
                if not line.endswith("\n"):
                    break
                offset += len(line)
                if '"event": "step"' not in line and '"event": "start"' not in line:
                    continue  # spans and other events: nothing to draw
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if ev.get("event") == "step":
                    progress.update(task, completed=ev["step"], loss=f"{ev['loss']:.4f}")
                elif ev.get("event") == "start":
                    progress.update(task, completed=ev.get("first_step", 1) - 1)
        return offset


def wait_for(path: Path, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists():
            return True
        time.sleep(0.1)
    return False
