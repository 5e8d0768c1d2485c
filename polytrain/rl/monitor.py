"""What the (lead) learner watches: progress events, greedy evaluations, and when to stop.

Every ``eval_every_s`` seconds the current network plays ``screen_episodes`` greedy episodes;
only when their mean reaches the target does it play the full ``eval_episodes`` (100 for the
"solved" criterion). The run stops at the first full evaluation at or above the target, at
``max_seconds`` or at ``max_env_steps``. Evaluation time is part of the wall clock, for every
algorithm alike, and evaluation episodes are not counted as environment steps. The time to
target is when the winning network was taken (the start of its evaluation: learning pauses
while it plays); the evaluation's end is reported too (``target_confirmed_s``).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch import nn

from polytrain.metrics.recorder import Recorder
from polytrain.rl.config import RLConfig
from polytrain.rl.envs import greedy_returns
from polytrain.runtime import interrupt

PROGRESS_EVERY_S = 0.5


@dataclass
class Counters:
    """Figures the learner knows at a given moment (from itself or from the replay server)."""

    env_steps: int = 0
    episodes: int = 0
    updates: int = 0
    train_return: float | None = None  # mean of the last 100 training episodes (all actors)
    replay_size: int = 0
    alive_actors: int = 0


@dataclass
class Monitor:
    cfg: RLConfig
    recorder: Recorder
    evals: list[dict[str, Any]] = field(default_factory=list)
    time_to_target_s: float | None = None
    confirmed_s: float | None = None
    steps_to_target: int | None = None
    stop_reason: str = ""
    _next_eval: float = 0.0
    _next_progress: float = 0.0
    eval_index: int = 0
    _eval_s: float = 0.0

    def __post_init__(self) -> None:
        self._next_eval = self.cfg.eval_every_s

    def _evaluate(self, net: nn.Module, episodes: int, kind: str, c: Counters) -> float | None:
        """Mean greedy return; a screen gives up (None) once the target is out of reach."""
        start = time.perf_counter()
        self.eval_index += 1
        seed = self.cfg.seed * 1_000_003 + 7_919 * self.eval_index  # fresh start states each time
        give_up = self.cfg.target if kind == "screen" else None
        returns, gave_up = greedy_returns(net, self.cfg.env, episodes, seed, give_up)
        self._eval_s += time.perf_counter() - start
        mean = None if gave_up else float(np.mean(returns))
        rec = self.recorder.emit("eval", kind=kind, episodes=episodes, mean_return=mean,
                                 finished=len(returns), min_return=min(returns, default=None),
                                 env_steps=c.env_steps, updates=c.updates,
                                 eval_s=round(time.perf_counter() - start, 4))
        self.evals.append(rec)
        return mean

    def tick(self, net: nn.Module, c: Counters) -> bool:
        """Call often; returns True when the run should stop."""
        if interrupt.requested():  # SIGTERM / Ctrl-C: end as at any other stop, evaluating nothing
            self.stop_reason = "interrupted"
            return True
        now = self.recorder.now()
        if now >= self._next_progress:
            self._next_progress = now + PROGRESS_EVERY_S
            self.recorder.emit("progress", env_steps=c.env_steps, episodes=c.episodes, updates=c.updates,
                               train_return=c.train_return, replay_size=c.replay_size,
                               alive_actors=c.alive_actors)
        if now >= self._next_eval and c.updates > 0:
            target = self.cfg.target
            screen = self._evaluate(net, self.cfg.screen_episodes, "screen", c)
            full = None if screen is None or screen < target else \
                self._evaluate(net, self.cfg.eval_episodes, "full", c)
            if full is not None and full >= target:
                # the network that solved it existed at `now` (learning pauses while it plays);
                # knowing it took the evaluation too: target_confirmed_s
                self.time_to_target_s = now
                self.confirmed_s = self.recorder.now()
                self.steps_to_target = c.env_steps
                self.stop_reason = "target"
                return True
            self._next_eval = self.recorder.now() + self.cfg.eval_every_s
        if now >= self.cfg.max_seconds:
            self.stop_reason = "max_seconds"
            return True
        if self.cfg.max_env_steps and c.env_steps >= self.cfg.max_env_steps:
            self.stop_reason = "max_env_steps"
            return True
        return False

    def final(self, net: nn.Module, c: Counters) -> dict[str, Any]:
        """Figures for the summary; plays a final full evaluation unless the last one was it."""
        full = [e for e in self.evals if e["kind"] == "full"]
        if self.stop_reason not in ("target", "interrupted"):  # a stop on request ends quickly
            self._evaluate(net, self.cfg.eval_episodes, "final", c)
        final = self.evals[-1]["mean_return"] if self.evals else None
        means = [e["mean_return"] for e in self.evals if e["kind"] != "screen"] or [
            e["mean_return"] for e in self.evals if e["mean_return"] is not None]
        return {
            "target_return": self.cfg.target,
            "solved": self.stop_reason == "target",
            "stop_reason": self.stop_reason,
            "time_to_target_s": self.time_to_target_s,
            "target_confirmed_s": self.confirmed_s,
            "env_steps_to_target": self.steps_to_target,
            "final_mean_return": final,
            "final_eval_episodes": self.cfg.eval_episodes,
            "best_mean_return": max(means) if means else None,
            "evaluations": len(self.evals),
            "full_evaluations": len(full),
            "eval_s": self._eval_s,
        }


class ReturnWindow:
    """Mean of the last 100 training-episode returns (what the progress bar shows)."""

    def __init__(self, size: int = 100) -> None:
        self.values: deque[float] = deque(maxlen=size)

    def add(self, value: float) -> None:
        self.values.append(value)

    @property
    def mean(self) -> float | None:
        return float(np.mean(self.values)) if self.values else None
