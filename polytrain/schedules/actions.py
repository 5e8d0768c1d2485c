"""The vocabulary of pipeline schedules: actions, orders, grids, costs (pure data, no torch).

``Action(stage, op, microbatch)`` prints as ``{stage}{op}{microbatch}``, the format of
``torch.distributed.pipelining``: ``1F3`` = stage 1 runs the forward of micro-batch 3. Ops: ``F``
forward; ``B`` backward (input and weight gradients); ``W`` weight gradient alone, for
split-backward schedules. ``Orders`` (stage -> its actions in order) is what the runtime executes;
``Grid`` (stage -> action per time slot, None = idle) is what `checks.simulate` derives from it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, cast

from polytrain.errors import ConfigError

Op = Literal["F", "B", "W"]
OPS: tuple[Op, ...] = ("F", "B", "W")

_ACTION_RE = re.compile(r"^\s*(\d+)\s*([FBW])\s*(\d+)\s*$")


@dataclass(frozen=True, order=True, repr=False)
class Action:
    """One unit of work of one stage; prints and parses as ``1F3`` (stage, op, micro-batch)."""

    stage: int
    op: Op
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.op}{self.microbatch}"

    __repr__ = __str__  # lists of actions print compactly, e.g. [0F0, 0F1, 0B0]

    @property
    def cell(self) -> str:
        """The label inside a grid row, where the row already says the stage: ``F3``."""
        return f"{self.op}{self.microbatch}"

    @classmethod
    def parse(cls, text: str) -> Action:
        """``Action.parse("0F3") == Action(0, "F", 3)``."""
        match = _ACTION_RE.match(text)
        if match is None:
            raise ConfigError(
                f"Cannot read action '{text}'. Rule: an action is <stage><op><micro-batch>, op one"
                f" of {', '.join(OPS)}. Fix: write e.g. '0F3' (stage 0, forward, micro-batch 3)."
            )
        return cls(int(match[1]), cast(Op, match[2]), int(match[3]))


Orders = dict[int, list[Action]]  # stage -> its actions in order (what the runtime executes)
Grid = dict[int, list[Action | None]]  # stage -> action per time slot, None = idle


def check_cost(cost: Mapping[str, int] | None = None) -> dict[str, int]:
    """Slots per op, defaults F=1, B=1, W=1, overridden by ``cost``; bad values raise."""
    costs: dict[str, int] = dict.fromkeys(OPS, 1)
    for op, value in (cost or {}).items():
        if op not in costs:
            raise ConfigError(f"Unknown op '{op}' in cost. Valid ops: {', '.join(OPS)}.")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(
                f"Cost of '{op}' is {value!r}. Rule: a cost is a whole number of slots >= 1. "
                "Fix: e.g. cost={'F': 1, 'B': 2}."
            )
        costs[op] = value
    return costs


def check_sizes(stages: int, count: int, unit: str = "microbatches") -> None:
    for label, value in (("stages", stages), (unit, count)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(
                f"{label} is {value!r}. Rule: {label} must be a whole number >= 1. "
                f"Fix: e.g. --stages 4 --microbatches 8."
            )


def makespan(grid: Mapping[int, list[Action | None]]) -> int:
    return max((len(row) for row in grid.values()), default=0)
