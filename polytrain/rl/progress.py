"""The RL progress bar: the launcher tails the lead learner's events (``ranks/rank0.jsonl``).

The bar fills with the mean training return (last 100 episodes, all actors) between the
lowest possible return and the target; the text beside it gives episodes, env steps, learner
updates, live actors and the last greedy evaluation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from polytrain.rl.config import RLConfig
from polytrain.runtime.progress import FollowEvents


def _short(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e4 else str(n)


class FollowRL(FollowEvents):
    interval_s = 0.25

    def __init__(self, path: Path, cfg: RLConfig, console: Console) -> None:
        super().__init__(path, console)
        self.cfg = cfg
        info = cfg.info
        # returns lie in [low, target]: CartPole 0..475, Acrobot/MountainCar −max_steps..target
        self.low = min(0.0, -float(info.max_steps) if info.max_reward <= 0 else 0.0)
        self.fields: dict[str, Any] = {"episodes": 0, "steps": 0, "updates": 0, "ret": "-", "ev": "-",
                                       "alive": "-"}

    def _progress(self) -> Progress:
        # compact: it must fit an 80-column terminal next to the bar
        return Progress(
            TextColumn("[bold]{task.description}"), BarColumn(bar_width=16),
            TextColumn("return {task.fields[ret]}/{task.fields[target]} · ep {task.fields[episodes]} "
                       "· steps {task.fields[steps]} · upd {task.fields[updates]} "
                       "· actors {task.fields[alive]} · greedy {task.fields[ev]}"),
            TimeElapsedColumn(), console=self.console, transient=False)

    def _add_task(self, progress: Progress) -> TaskID:
        return progress.add_task(self.cfg.algo, total=100.0, target=f"{self.cfg.target:g}", **self.fields)

    def _apply(self, progress: Progress, task: TaskID, ev: dict[str, Any]) -> None:
        done = self._fill(ev)
        progress.update(task, **self.fields)
        if done is not None:
            progress.update(task, completed=done)

    def _fill(self, ev: dict[str, Any]) -> float | None:
        """Update the text fields from one event; the bar's new fill (percent) if it changed."""
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
