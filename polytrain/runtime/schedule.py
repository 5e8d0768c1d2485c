"""Learning-rate schedules: ``--lr-schedule constant|linear|cosine`` with ``--warmup-steps N`` and
``--min-lr``, stepping with the optimizer.

The schedule is a pure function of the optimizer's own step count ``n`` (1 for its first
update)::

    n <= warmup:           lr * n / warmup                      (linear warm-up from ~0)
    after warm-up, t = (n - warmup) / (horizon - warmup) in [0, 1]:
      constant             lr
      linear               min_lr + (lr - min_lr) * (1 - t)
      cosine               min_lr + (lr - min_lr) * (1 + cos(pi * t)) / 2

A pre-step hook on the optimizer sets every group's ``lr`` from ``n`` just before each
``optimizer.step()``, wherever a strategy calls it, so there is one scheduler and it advances
exactly when the optimizer does. The count lives in the optimizer's own param groups
(``group["sched_step"]``), so ``optimizer.state_dict()`` carries it and a checkpoint resumes the
schedule exactly with no extra state.

Whose steps count: each optimizer's own. A synchronous strategy takes one update per job step on
every rank (or stage), so the schedule follows the job's steps. Where an optimizer updates more
or less often than once per job step (a parameter server applying every worker's push), the
strategy passes the ``horizon`` its optimizer will reach.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

SCHEDULES = ("constant", "linear", "cosine")
COUNT_KEY = "sched_step"  # the optimizer's own update count, kept in each param group


@dataclass(frozen=True)
class LrSchedule:
    """``kind`` from ``lr`` (after ``warmup`` steps) down to ``min_lr`` at step ``horizon``."""

    kind: str
    lr: float
    horizon: int
    warmup: int = 0
    min_lr: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ValueError(f"unknown lr schedule '{self.kind}'; valid: {', '.join(SCHEDULES)}")

    @property
    def active(self) -> bool:
        """False when every step uses ``lr`` (no hook needed)."""
        return self.kind != "constant" or self.warmup > 0

    def at(self, n: int) -> float:
        """The learning rate of update ``n`` (1-based)."""
        if self.warmup and n <= self.warmup:
            return self.lr * n / self.warmup
        if self.kind == "constant":
            return self.lr
        span = max(self.horizon - self.warmup, 1)
        t = min(max((n - self.warmup) / span, 0.0), 1.0)
        shape = 1.0 - t if self.kind == "linear" else (1.0 + math.cos(math.pi * t)) / 2.0
        return self.min_lr + (self.lr - self.min_lr) * shape


def from_config(cfg: Any, horizon: int) -> LrSchedule:
    """The schedule a job config asks for, reaching its end at update ``horizon``."""
    return LrSchedule(cfg.lr_schedule, cfg.lr, horizon, cfg.warmup_steps, cfg.min_lr)


def attach(optimizer: torch.optim.Optimizer, schedule: LrSchedule) -> torch.optim.Optimizer:
    """Make ``optimizer`` follow ``schedule``: before each step, every group's lr is the
    schedule's value at that update. A constant schedule without warm-up attaches nothing."""
    if not schedule.active:
        return optimizer
    for group in optimizer.param_groups:
        group.setdefault(COUNT_KEY, 0)

    def before_step(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        for group in opt.param_groups:
            group[COUNT_KEY] = int(group.get(COUNT_KEY, 0)) + 1
            group["lr"] = schedule.at(group[COUNT_KEY])

    optimizer.register_step_pre_hook(before_step)
    return optimizer


def updates_taken(optimizer: torch.optim.Optimizer) -> int:
    """How many updates the schedule has counted (0 when none is attached)."""
    return int(optimizer.param_groups[0].get(COUNT_KEY, 0))
