"""The ``polytrain aco`` progress bar: iterations (or seconds under --time-limit), best length
and the gap to the optimum when known. Drawn in-process for one process; for several, the
launcher tails rank 0's ``iterations.jsonl`` as ``train``'s bar tails rank 0's events."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from polytrain.aco.config import ACOConfig
from polytrain.runtime.progress import TailJSONL


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


class FollowIterations(TailJSONL):
    """Tail ``iterations.jsonl`` in a thread and feed each row to a bar."""

    def __init__(self, path: Path, bar: ACOProgress) -> None:
        super().__init__(path)
        self.bar = bar

    def _handle(self, ev: dict[str, Any]) -> None:
        self.bar(ev)

    def _close(self) -> None:
        self.bar.close()
