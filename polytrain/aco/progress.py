"""The ``polytrain aco`` progress bar: iterations (or seconds under --time-limit), best length
and the gap to the optimum when known. Drawn in-process for one process; for several, the
launcher tails rank 0's ``iterations.jsonl`` as ``train``'s bar tails rank 0's events."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from polytrain.aco.config import ACOConfig


class ACOProgress:
    def __init__(self, cfg: ACOConfig, label: str, console: Console | None, enabled: bool = True) -> None:
        self.by_time = cfg.iterations is None and cfg.time_limit is not None
        total = cfg.time_limit if self.by_time else cfg.max_iterations
        self._p: Progress | None = None
        if enabled:
            self._p = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                               TextColumn("it {task.fields[it]}"), TextColumn("{task.fields[best]}"),
                               TimeElapsedColumn(), console=console or Console(stderr=True))
            self._task = self._p.add_task(label, total=total, it=0, best="best -")
            self._p.start()

    def __call__(self, row: dict[str, Any]) -> None:
        if self._p is None:
            return
        best = f"best {row['best']:,.0f}"
        if row.get("gap") is not None:
            best += f"  gap {100 * row['gap']:.2f} %"
        self._p.update(self._task, completed=row["t"] if self.by_time else row["iteration"],
                       it=row["iteration"], best=best)

    def close(self) -> None:
        if self._p is not None:
            self._p.stop()
            self._p = None


class FollowIterations:
    """Tail ``iterations.jsonl`` in a thread and feed each row to a bar."""

    def __init__(self, path: Path, bar: ACOProgress) -> None:
        self.path, self.bar = path, bar
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> FollowIterations:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.bar.close()

    def _run(self) -> None:
        offset = 0
        while True:
            stopping = self._stop.is_set()
            offset = self._read(offset)
            if stopping:
                return
            self._stop.wait(0.2)

    def _read(self, offset: int) -> int:
        if not self.path.is_file():
            return offset
        with self.path.open() as f:
            f.seek(offset)
            last = None
            for line in f:
                if not line.endswith("\n"):
                    break
                offset += len(line)
                last = line
        if last is not None:
            self.bar(json.loads(last))
        return offset
