"""The RL progress bar: the launcher tails the lead learner's events (``ranks/rank0.jsonl``).

The bar fills with the mean training return (last 100 episodes, all actors) between the
lowest possible return and the target; the text beside it gives episodes, env steps, learner
updates, live actors and the last greedy evaluation.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from polytrain.rl.config import RLConfig


def _short(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e4 else str(n)


class FollowRL:
    def __init__(self, path: Path, cfg: RLConfig, console: Console) -> None:
        self.path = path
        self.cfg = cfg
        self.console = console
        info = cfg.info
        # returns lie in [low, target]: CartPole 0..475, Acrobot/MountainCar −max_steps..target
        self.low = min(0.0, -float(info.max_steps) if info.max_reward <= 0 else 0.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.fields: dict[str, Any] = {"episodes": 0, "steps": 0, "updates": 0, "ret": "-", "ev": "-",
                                       "alive": "-"}

    def __enter__(self) -> FollowRL:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _progress(self) -> Progress:
        # compact: it must fit an 80-column terminal next to the bar
        return Progress(
            TextColumn("[bold]{task.description}"), BarColumn(bar_width=16),
            TextColumn("return {task.fields[ret]}/{task.fields[target]} · ep {task.fields[episodes]} "
                       "· steps {task.fields[steps]} · upd {task.fields[updates]} "
                       "· actors {task.fields[alive]} · greedy {task.fields[ev]}"),
            TimeElapsedColumn(), console=self.console, transient=False)

    def _run(self) -> None:
        label = self.cfg.algo
        with self._progress() as progress:
            task = progress.add_task(label, total=100.0, target=f"{self.cfg.target:g}", **self.fields)
            offset = 0
            while True:
                stopping = self._stop.is_set()
                offset = self._read(progress, task, offset)
                if stopping:
                    break
                self._stop.wait(0.25)

    def _apply(self, ev: dict[str, Any]) -> float | None:
        if ev.get("event") == "progress":
            self.fields.update(episodes=_short(ev["episodes"]), steps=_short(ev["env_steps"]),
                               updates=_short(ev["updates"]), alive=ev["alive_actors"])
            if ev["train_return"] is not None:
                self.fields["ret"] = f"{ev['train_return']:.0f}"
                span = self.cfg.target - self.low
                if span > 0:
                    return max(0.0, min(100.0, 100 * (ev["train_return"] - self.low) / span))
        elif ev.get("event") == "eval" and ev.get("mean_return") is not None:
            self.fields["ev"] = f"{ev['mean_return']:.0f}"
        return None

    def _read(self, progress: Progress, task: Any, offset: int) -> int:
        if not self.path.is_file():
            return offset
        with self.path.open() as f:
            f.seek(offset)
            for line in f:
                if not line.endswith("\n"):
                    break
                offset += len(line)
                try:
                    done = self._apply(json.loads(line))
                except (ValueError, KeyError):
                    continue
                progress.update(task, **self.fields)
                if done is not None:
                    progress.update(task, completed=done)
        return offset
