"""Pipeline schedules as plain data: actions, orders of work, the time grid and their checks.

Vocabulary (no processes, no torch: everything here is pure and printable):

- ``Action(stage, op, microbatch)`` prints as ``{stage}{op}{microbatch}``, the format of
  ``torch.distributed.pipelining``: ``1F3`` = stage 1 runs the forward of micro-batch 3.
  Ops: ``F`` forward; ``B`` backward (input and weight gradients); ``W`` weight gradient alone, for
  split-backward schedules (no built-in schedule uses it yet). Micro-batches count from 0
  (the survey's Fig. 10 counts from 1).
- ``Orders = dict[stage, list[Action]]``: what each stage runs, in order, without timing. This is
  the primary data: the runtime executes it, the builders return it.
- ``Grid = dict[stage, list[Action | None]]``: the time grid derived from orders by `simulate`.
  A slot is one unit of compute; an op of cost c fills c consecutive slots; ``None`` is idle.
  Default cost F=1, B=1 draws the textbook pictures (survey Fig. 9 and 10); ``cost={"F": 1,
  "B": 2}`` is closer to reality (a backward computes two gradients).

GPipe with P=2 stages and M=4 micro-batches (F=B=1), bubble (P-1)/(M+P-1) = 20%::

    time     0  1  2  3  4  5  6  7  8  9
    stage 0  F0 F1 F2 F3 .  .  B3 B2 B1 B0
    stage 1  .  F0 F1 F2 F3 B3 B2 B1 B0 .
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, cast

from polytrain.errors import ConfigError, unknown

Op = Literal["F", "B", "W"]
OPS: tuple[Op, ...] = ("F", "B", "W")

_ACTION_RE = re.compile(r"^\s*(\d+)\s*([FBW])\s*(\d+)\s*$")
_DEPS_RULE = (
    "Rule: a stage runs its list in order, one action at a time; F(s,m) waits for F(s-1,m); "
    "B(s,m) waits for F(s,m) and B(s+1,m); W(s,m) waits for B(s,m)."
)


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


# --- costs -------------------------------------------------------------------------------------


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


# --- builders (orders) -------------------------------------------------------------------------


def _check_sizes(stages: int, count: int, unit: str = "microbatches") -> None:
    for label, value in (("stages", stages), (unit, count)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(
                f"{label} is {value!r}. Rule: {label} must be a whole number >= 1. "
                f"Fix: e.g. --stages 4 --microbatches 8."
            )


def gpipe_orders(stages: int, microbatches: int) -> Orders:
    """GPipe: every forward, then every backward, then one flush (update) per mini-batch.

    Backwards run last-in first-out, as in GPipe's own figure (survey Fig. 9): the micro-batch
    that just left the last stage is the first whose gradient can start, so no stage waits
    for it. Peak activations: all M micro-batches on every stage.
    """
    _check_sizes(stages, microbatches)
    fwd = range(microbatches)
    return {
        s: [Action(s, "F", m) for m in fwd] + [Action(s, "B", m) for m in reversed(fwd)]
        for s in range(stages)
    }


def one_f_one_b_orders(stages: int, microbatches: int) -> Orders:
    """1F1B with flush (PipeDream-Flush / DAPPLE): warm-up, alternate, drain, one update.

    Stage s first runs ``P-1-s`` warm-up forwards, then alternates one forward and one
    backward (oldest first), then drains the remaining backwards. At most ``P-s`` micro-batches
    are in flight on stage s, against M for GPipe; with F=B the bubble is the same as GPipe's.
    P=4, M=4, F=B=1 (stage 3 never idles once started)::

        stage 0  F0 F1 F2 F3 .  .  .  B0 .  B1 .  B2 .  B3
        stage 3  .  .  .  F0 B0 F1 B1 F2 B2 F3 B3 .  .  .
    """
    _check_sizes(stages, microbatches)
    orders: Orders = {}
    for s in range(stages):
        warmup = min(stages - 1 - s, microbatches)
        row = [Action(s, "F", m) for m in range(warmup)]
        for m in range(warmup, microbatches):  # steady state: one forward, one backward
            row += [Action(s, "F", m), Action(s, "B", m - warmup)]
        row += [Action(s, "B", m) for m in range(microbatches - warmup, microbatches)]
        orders[s] = row
    return orders


def pipedream_orders(stages: int, minibatches: int) -> Orders:
    """PipeDream's asynchronous 1F1B (survey Fig. 10): a stream of mini-batches, no flush.

    The unit is the mini-batch. The input stage admits P mini-batches (PipeDream's NOAM),
    stage s admits P-s, then every stage alternates B and F; each stage updates its weights
    after every backward, so with weight stashing it keeps P-s weight versions. The order of a
    finite stream equals 1F1B over the same count (both start and drain the same way); the
    difference is the update rule (`ScheduleSpec.flush`): 1F1B repeats warm-up and drain for
    every mini-batch, PipeDream pays them once for the whole stream. In 0-based numbering the
    survey's "worker 2 runs B2, F5, B3, F6" is stage 1 running ``1B1 1F4 1B2 1F5``.
    """
    _check_sizes(stages, minibatches, "minibatches")
    return one_f_one_b_orders(stages, minibatches)


# --- registry ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScheduleSpec:
    """A registered schedule: its order builder and what the runtime must do around it.

    ``flush=True``: each stage applies one optimizer step after its whole list (one mini-batch
    of ``microbatches``). ``flush=False``: each stage steps after every backward, and
    ``microbatches`` counts mini-batches of a stream (weight stashing keeps versions apart).
    """

    name: str
    description: str
    orders: Callable[[int, int], Orders] = field(repr=False)
    flush: bool = True
    unit: str = "micro-batch"

    def grid(self, stages: int, microbatches: int, cost: Mapping[str, int] | None = None) -> Grid:
        return simulate(self.orders(stages, microbatches), cost)


SCHEDULES: dict[str, ScheduleSpec] = {}


def register_schedule(spec: ScheduleSpec) -> ScheduleSpec:
    """Add a schedule under ``spec.name`` (a new schedule registers itself; no central switch)."""
    if spec.name in SCHEDULES:
        raise ConfigError(f"Schedule '{spec.name}' is registered twice. Fix: pick another name.")
    SCHEDULES[spec.name] = spec
    return spec


register_schedule(ScheduleSpec("gpipe", "GPipe: all forwards, then all backwards, one flush", gpipe_orders))
register_schedule(
    ScheduleSpec("1f1b", "1F1B with flush (PipeDream-Flush/DAPPLE): bounded activations", one_f_one_b_orders)
)
register_schedule(
    ScheduleSpec(
        "pipedream",
        "PipeDream async 1F1B over a stream of mini-batches, update after each backward",
        pipedream_orders,
        flush=False,
        unit="mini-batch",
    )
)


def schedule_names() -> list[str]:
    return list(SCHEDULES)


def get_schedule(name: str) -> ScheduleSpec:
    if name not in SCHEDULES:
        raise unknown("schedule", name, SCHEDULES, "Fix: polytrain schedule gpipe --stages 4.")
    return SCHEDULES[name]


def stage_orders(name: str, stages: int, microbatches: int) -> Orders:
    """The order of work per stage of a registered schedule: what the runtime executes."""
    return get_schedule(name).orders(stages, microbatches)


def gpipe(stages: int, microbatches: int, cost: Mapping[str, int] | None = None) -> Grid:
    return simulate(gpipe_orders(stages, microbatches), cost)


def one_f_one_b(stages: int, microbatches: int, cost: Mapping[str, int] | None = None) -> Grid:
    return simulate(one_f_one_b_orders(stages, microbatches), cost)


def pipedream_async(stages: int, minibatches: int, cost: Mapping[str, int] | None = None) -> Grid:
    return simulate(pipedream_orders(stages, minibatches), cost)


# --- checks ------------------------------------------------------------------------------------


def _show(order: list[Action], index: int, width: int = 4) -> str:
    """The stage's list around ``index`` with the failing step in brackets."""
    lo, hi = max(0, index - width), min(len(order), index + width + 1)
    cells = [f"[{a}]" if i == index else str(a) for i, a in enumerate(order[lo:hi], lo)]
    return f"step {index}: {'… ' if lo else ''}{' '.join(cells)}{' …' if hi < len(order) else ''}"


def _check_rows(orders: Mapping[int, list[Action]], stages: int | None = None) -> None:
    """Rows must be stages 0..P-1 and hold only their own stage's actions."""
    want = list(range(len(orders) if stages is None else stages))
    if sorted(orders) != want:
        raise ConfigError(
            f"Schedule rows are stages {sorted(orders)}. Rule: one row per stage "
            f"0..{len(want) - 1}. Fix: add the missing rows (an empty list for an idle stage) "
            "and drop the others."
        )
    for s, order in orders.items():
        for i, a in enumerate(order):
            if a.stage != s:
                raise ConfigError(
                    f"Stage {s} lists {a}, an action of stage {a.stage} ({_show(order, i)}). "
                    "Rule: a row holds only its own stage's actions. "
                    f"Fix: move {a} to row {a.stage}."
                )


def _count_problems(s: int, order: list[Action], microbatches: int) -> list[str]:
    counts = Counter((a.op, a.microbatch) for a in order)
    out = [
        f"stage {s}: {Action(s, op, m)} micro-batch {m} is outside 0..{microbatches - 1}"
        for op, m in sorted(counts)
        if not 0 <= m < microbatches
    ]
    for m in range(microbatches):
        for op in ("F", "B"):
            n = counts[(op, m)]
            if n != 1:
                what = "is missing" if n == 0 else f"appears {n} times"
                out.append(f"stage {s}: {Action(s, op, m)} {what} (need exactly one)")
        if counts[("W", m)] > 1:
            out.append(f"stage {s}: {Action(s, 'W', m)} appears {counts[('W', m)]} times")
    return out


def _precedence_problems(s: int, order: list[Action]) -> list[str]:
    """On its own stage a micro-batch goes F, then B, then (optionally) W."""
    first: dict[tuple[str, int], int] = {}
    for i, a in enumerate(order):
        first.setdefault((a.op, a.microbatch), i)
    out = []
    for (op, m), i in sorted(first.items(), key=lambda kv: kv[1]):
        before = {"B": "F", "W": "B"}.get(op)
        j = first.get((before, m)) if before else None
        if j is not None and j > i:
            out.append(
                f"stage {s}: {order[i]} runs before {order[j]} ({_show(order, i)}); "
                f"fix: move {order[j]} before {order[i]}"
            )
    return out


def _fifo_problems(orders: Mapping[int, list[Action]]) -> list[str]:
    """Neighbours see micro-batches in the same order, so channels between them stay FIFO.

    Why: the runtime can then post untagged, in-order sends and receives between stages.
    """
    out = []
    for s in range(1, len(orders)):
        for op, src, dst in (("F", s - 1, s), ("B", s, s - 1)):
            sent = [a.microbatch for a in orders[src] if a.op == op]
            got = [a.microbatch for a in orders[dst] if a.op == op]
            if sent != got:
                out.append(
                    f"stage {dst} runs {op} in micro-batch order {got} but stage {src} sends them "
                    f"in order {sent}; fix: use the same order on both"
                )
    return out


def validate(orders: Mapping[int, list[Action]], stages: int, microbatches: int) -> None:
    """Check the shape of a flush-style order list; raise ConfigError listing every problem.

    Rules: rows are stages 0..P-1 holding only their own actions; every (stage, micro-batch) has
    exactly one F and one B (at most one W); on a stage F(m) comes before B(m) before W(m);
    neighbouring stages process forwards (backwards) in the same micro-batch order.
    Deadlock freedom is `dry_run`'s job.
    """
    _check_sizes(stages, microbatches)
    _check_rows(orders, stages)
    problems = [p for s in range(stages) for p in _count_problems(s, orders[s], microbatches)]
    problems += [p for s in range(stages) for p in _precedence_problems(s, orders[s])]
    problems += _fifo_problems(orders) if not problems else []
    if problems:
        shown = "\n  ".join(problems[:10])
        more = f"\n  … and {len(problems) - 10} more" if len(problems) > 10 else ""
        raise ConfigError(
            f"Invalid pipeline schedule (P={stages}, M={microbatches}): {len(problems)} "
            f"problem(s):\n  {shown}{more}\nRule: every stage runs F then B of every micro-batch "
            "exactly once, in the same micro-batch order as its neighbours."
        )


# --- simulation --------------------------------------------------------------------------------


def _needs(a: Action, stages: int) -> list[Action]:
    """The actions that must have finished before ``a`` starts (cross-stage and own-stage)."""
    if a.op == "F":
        return [Action(a.stage - 1, "F", a.microbatch)] if a.stage > 0 else []
    if a.op == "W":
        return [Action(a.stage, "B", a.microbatch)]
    up = [Action(a.stage + 1, "B", a.microbatch)] if a.stage < stages - 1 else []
    return [Action(a.stage, "F", a.microbatch), *up]


def _deadlock(orders: Mapping[int, list[Action]], pos: dict[int, int], t: int) -> ConfigError:
    lines = []
    for s, order in orders.items():
        if pos[s] == len(order):
            continue
        a = order[pos[s]]
        for need in _needs(a, len(orders)):
            row = orders.get(need.stage, [])
            if need in row[: pos[need.stage]]:
                continue
            if need not in row:
                why = f"never scheduled on stage {need.stage}"
            elif need.stage == s:
                why = f"comes later on stage {s}, at step {row.index(need)}"
            else:
                k = pos[need.stage]
                why = f"stage {need.stage} is stuck at step {k}: {row[k]}"
            lines.append(f"stage {s} at step {pos[s]}: {a} waits for {need} ({why})")
    left = sum(len(o) - pos[s] for s, o in orders.items())
    return ConfigError(
        f"Deadlock at time {t}: no stage can make progress, {left} action(s) left.\n  "
        + "\n  ".join(lines)
        + f"\n{_DEPS_RULE} Fix: reorder the stage lists so each awaited action can run first "
        "(the '1f1b' builder gives a valid order)."
    )


def simulate(orders: Mapping[int, list[Action]], cost: Mapping[str, int] | None = None) -> Grid:
    """Time grid of ``orders``: each stage starts its next action as soon as its needs are met.

    Sends are free and buffered (a stage never waits for its receiver); deadlocks raise.
    """
    costs = check_cost(cost)
    _check_rows(orders)
    finish: dict[Action, int] = {}
    pos = dict.fromkeys(orders, 0)
    free_at = dict.fromkeys(orders, 0)
    grid: Grid = {s: [] for s in sorted(orders)}
    t = 0
    while any(pos[s] < len(orders[s]) for s in grid):
        for s in grid:
            if free_at[s] > t or pos[s] == len(orders[s]):
                continue
            a = orders[s][pos[s]]
            if all(finish.get(d, math.inf) <= t for d in _needs(a, len(orders))):
                grid[s] += [None] * (t - len(grid[s])) + [a] * costs[a.op]
                finish[a] = free_at[s] = t + costs[a.op]
                pos[s] += 1
        later = [u for u in free_at.values() if u > t]
        if not later and any(pos[s] < len(orders[s]) for s in grid):
            raise _deadlock(orders, pos, t)
        t = min(later, default=t)
    span = makespan(grid)
    return {s: row + [None] * (span - len(row)) for s, row in grid.items()}


def dry_run(orders: Mapping[int, list[Action]]) -> int:
    """Run ``orders`` with no processes; raise ConfigError naming stuck stages on deadlock.

    Whether an order deadlocks does not depend on the costs, so unit costs suffice. Returns the
    makespan in slots (F=B=W=1).
    """
    return makespan(simulate(orders))


# --- measures ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageLoad:
    busy: int
    idle: int


def makespan(grid: Mapping[int, list[Action | None]]) -> int:
    return max((len(row) for row in grid.values()), default=0)


def stage_load(grid: Mapping[int, list[Action | None]]) -> dict[int, StageLoad]:
    """Busy and idle slots per stage over the whole makespan."""
    span = makespan(grid)
    loads = {}
    for s, row in grid.items():
        busy = sum(a is not None for a in row)
        loads[s] = StageLoad(busy, span - busy)
    return loads


def bubble_fraction(grid: Mapping[int, list[Action | None]]) -> float:
    """Idle slots / (stages x makespan); GPipe gives (P-1)/(M+P-1) for any constant F and B costs."""
    total = len(grid) * makespan(grid)
    return sum(load.idle for load in stage_load(grid).values()) / total if total else 0.0


def in_flight(orders: Mapping[int, list[Action]]) -> dict[int, int]:
    """Peak micro-batches per stage whose forward is done and whose backward is not.

    That is the peak count of stored activations (and, for PipeDream, of stashed weight
    versions). A micro-batch's activations are freed by its last B or W on the stage.
    """
    peaks = {}
    for s, order in orders.items():
        last = {a.microbatch: i for i, a in enumerate(order) if a.op in ("B", "W")}
        live = peak = 0
        for i, a in enumerate(order):
            live += (a.op == "F") - (last.get(a.microbatch) == i)
            peak = max(peak, live)
        peaks[s] = peak
    return peaks
