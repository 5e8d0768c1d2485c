"""Checks of pipeline schedules without any process: validation, simulation and dry-run.

`validate` checks the shape of an order list (every F and B once, F before B, neighbours in the
same micro-batch order); `simulate` derives the time grid and raises on deadlock, naming the stuck
stages; `dry_run` is `simulate` for its verdict and makespan.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping

from polytrain.errors import ConfigError
from polytrain.schedules.actions import Action, Grid, check_cost, check_sizes, makespan

_DEPS_RULE = (
    "Rule: a stage runs its list in order, one action at a time; F(s,m) waits for F(s-1,m); "
    "B(s,m) waits for F(s,m) and B(s+1,m); W(s,m) waits for B(s,m)."
)


def _show(order: list[Action], index: int, width: int = 4) -> str:
    """The stage's list around ``index`` with the failing step in brackets."""
    lo, hi = max(0, index - width), min(len(order), index + width + 1)
    cells = [f"[{a}]" if i == index else str(a) for i, a in enumerate(order[lo:hi], lo)]
    return f"step {index}: {'… ' if lo else ''}{' '.join(cells)}{' …' if hi < len(order) else ''}"


def chunk_count(orders: Mapping[int, list[Action]]) -> int:
    """Model chunks (stages of the model) the orders run: the rows' count, or more with virtual
    stages, where a row (a rank) runs several chunks and ``Action.stage`` names the chunk."""
    return max([len(orders)] + [a.stage + 1 for row in orders.values() for a in row])


def chunk_rows(orders: Mapping[int, list[Action]]) -> dict[int, int]:
    """Chunk -> the row (rank) that runs it; with one chunk per row, chunk s is row s."""
    if chunk_count(orders) == len(orders):
        return {s: s for s in orders}
    return {a.stage: r for r, row in orders.items() for a in row}


def check_rows(orders: Mapping[int, list[Action]], stages: int | None = None) -> None:
    """Rows must be stages (ranks) 0..P-1; with one chunk per row, row s holds only stage s's
    actions; with virtual stages (more chunks than rows), each chunk lives on one row."""
    want = list(range(len(orders) if stages is None else stages))
    if sorted(orders) != want:
        raise ConfigError(
            f"Schedule rows are stages {sorted(orders)}. Rule: one row per stage "
            f"0..{len(want) - 1}. Fix: add the missing rows (an empty list for an idle stage) "
            "and drop the others."
        )
    if chunk_count(orders) > len(orders):
        _check_chunk_homes(orders)
        return
    for s, order in orders.items():
        for i, a in enumerate(order):
            if a.stage != s:
                raise ConfigError(
                    f"Stage {s} lists {a}, an action of stage {a.stage} ({_show(order, i)}). "
                    "Rule: a row holds only its own stage's actions. "
                    f"Fix: move {a} to row {a.stage}."
                )


def _check_chunk_homes(orders: Mapping[int, list[Action]]) -> None:
    homes: dict[int, set[int]] = {}
    for r, row in orders.items():
        for a in row:
            homes.setdefault(a.stage, set()).add(r)
    split = {c: sorted(rs) for c, rs in homes.items() if len(rs) > 1}
    if split:
        c, rs = min(split.items())
        raise ConfigError(
            f"Chunk {c} has actions on rows {rs}. Rule: with virtual stages each model chunk lives "
            f"on one rank. Fix: move every action of chunk {c} to one row."
        )


def _count_problems(s: int, order: list[Action], microbatches: int) -> list[str]:
    """Every chunk of the row runs F and B of every micro-batch once (W at most once)."""
    chunks = sorted({a.stage for a in order}) or [s]
    counts = Counter((a.stage, a.op, a.microbatch) for a in order)
    out = [
        f"stage {s}: {Action(c, op, m)} micro-batch {m} is outside 0..{microbatches - 1}"
        for c, op, m in sorted(counts)
        if not 0 <= m < microbatches
    ]
    for c in chunks:
        for m in range(microbatches):
            for op in ("F", "B"):
                n = counts[(c, op, m)]
                if n != 1:
                    what = "is missing" if n == 0 else f"appears {n} times"
                    out.append(f"stage {s}: {Action(c, op, m)} {what} (need exactly one)")
            if counts[(c, "W", m)] > 1:
                out.append(f"stage {s}: {Action(c, 'W', m)} appears {counts[(c, 'W', m)]} times")
    return out


def _precedence_problems(s: int, order: list[Action]) -> list[str]:
    """On its own stage a micro-batch goes F, then B, then (optionally) W."""
    first: dict[tuple[int, str, int], int] = {}
    for i, a in enumerate(order):
        first.setdefault((a.stage, a.op, a.microbatch), i)
    out = []
    for (c, op, m), i in sorted(first.items(), key=lambda kv: kv[1]):
        before = {"B": "F", "W": "B"}.get(op)
        j = first.get((c, before, m)) if before else None
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
    home = chunk_rows(orders)
    for s in range(1, chunk_count(orders)):
        for op, src, dst in (("F", s - 1, s), ("B", s, s - 1)):
            sent = [a.microbatch for a in orders[home[src]] if a.op == op and a.stage == src]
            got = [a.microbatch for a in orders[home[dst]] if a.op == op and a.stage == dst]
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
    check_sizes(stages, microbatches)
    check_rows(orders, stages)
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


def needs(a: Action, stages: int) -> list[Action]:
    """The actions that must have finished before ``a`` starts (cross-stage and own-stage)."""
    if a.op == "F":
        return [Action(a.stage - 1, "F", a.microbatch)] if a.stage > 0 else []
    if a.op == "W":
        return [Action(a.stage, "B", a.microbatch)]
    up = [Action(a.stage + 1, "B", a.microbatch)] if a.stage < stages - 1 else []
    return [Action(a.stage, "F", a.microbatch), *up]


def _deadlock(orders: Mapping[int, list[Action]], pos: dict[int, int], t: int) -> ConfigError:
    lines = []
    home, chunks = chunk_rows(orders), chunk_count(orders)
    for s, order in orders.items():
        if pos[s] == len(order):
            continue
        a = order[pos[s]]
        for need in needs(a, chunks):
            r = home.get(need.stage, need.stage)
            row = orders.get(r, [])
            if need in row[: pos.get(r, 0)]:
                continue
            if need not in row:
                why = f"never scheduled on stage {r}"
            elif r == s:
                why = f"comes later on stage {s}, at step {row.index(need)}"
            else:
                k = pos[r]
                why = f"stage {r} is stuck at step {k}: {row[k]}"
            lines.append(f"stage {s} at step {pos[s]}: {a} waits for {need} ({why})")
    left = sum(len(o) - pos[s] for s, o in orders.items())
    return ConfigError(
        f"Deadlock at time {t}: no stage can make progress, {left} action(s) left.\n  "
        + "\n  ".join(lines)
        + f"\n{_DEPS_RULE} Fix: reorder the stage lists so each awaited action can run first "
        "(the '1f1b' builder gives a valid order)."
    )


def full_backwards(orders: Mapping[int, list[Action]]) -> set[Action]:
    """The B actions that compute both gradients in a schedule that splits others (DualPipeV runs
    some backwards whole): in an order with W actions, a B without its W. In an order with no W
    at all, B is the whole backward by definition and this set is empty."""
    ws = {(a.stage, a.microbatch) for row in orders.values() for a in row if a.op == "W"}
    if not ws:
        return set()
    return {a for row in orders.values() for a in row if a.op == "B" and (a.stage, a.microbatch) not in ws}


def simulate(orders: Mapping[int, list[Action]], cost: Mapping[str, int] | None = None) -> Grid:
    """Time grid of ``orders``: each stage starts its next action as soon as its needs are met.

    Costs: ``B`` is the input gradient where the order has W actions (a B without its W then costs
    B + W: the whole backward, `full_backwards`), and the whole backward where it has none.

    Sends are free and buffered (a stage never waits for its receiver); deadlocks raise.
    """
    costs = check_cost(cost)
    check_rows(orders)
    finish: dict[Action, int] = {}
    pos = dict.fromkeys(orders, 0)
    free_at = dict.fromkeys(orders, 0)
    grid: Grid = {s: [] for s in sorted(orders)}
    chunks, full = chunk_count(orders), full_backwards(orders)
    t = 0
    while any(pos[s] < len(orders[s]) for s in grid):
        for s in grid:
            if free_at[s] > t or pos[s] == len(orders[s]):
                continue
            a = orders[s][pos[s]]
            if all(finish.get(d, math.inf) <= t for d in needs(a, chunks)):
                slots = costs[a.op] + (costs["W"] if a in full else 0)
                grid[s] += [None] * (t - len(grid[s])) + [a] * slots
                finish[a] = free_at[s] = t + slots
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


# --- timed replay ------------------------------------------------------------------------------

Durations = Mapping[Action, float]
Latency = float | Callable[[Action, Action], float]  # (need, action) -> seconds of its message


def simulate_times(
    orders: Mapping[int, list[Action]],
    durations: Durations,
    latency: Latency = 0.0,
    queue: bool = False,
) -> dict[int, list[tuple[Action, float, float]]]:
    """Start and end time of every action when each takes ``durations[action]`` seconds.

    The continuous-time counterpart of `simulate`: each stage runs its list in order and starts an
    action as soon as the stage is free and its needs have finished; a need on another stage
    arrives ``latency`` seconds after it finishes (one message; a callable ``latency(need, action)``
    gives each message its own time, e.g. per stage boundary). No other cost exists, so the
    result is what the schedule alone implies for these compute times — compare it with a
    measured timeline to tell the schedule's idle time from the runtime's. ``queue``: the messages
    between two neighbouring stages in one direction share one link, so a message leaves only once
    the previous one has arrived (the planner's model of a slow link). Deadlocks raise.
    """
    check_rows(orders)
    finish: dict[Action, float] = {}
    pos = dict.fromkeys(orders, 0)
    free_at = dict.fromkeys(orders, 0.0)
    out: dict[int, list[tuple[Action, float, float]]] = {s: [] for s in sorted(orders)}
    delay = latency if callable(latency) else (lambda _need, _a: float(latency))  # type: ignore[misc]
    link_free: dict[tuple[int, int], float] = {}  # (from stage, to stage) -> last arrival (queue)
    home, chunks = chunk_rows(orders), chunk_count(orders)

    def arrival(d: Action, a: Action) -> float:
        if not queue:
            return finish[d] + delay(d, a)
        key = (home[d.stage], home[a.stage])  # one link per pair of ranks, whatever the chunks
        link_free[key] = max(finish[d], link_free.get(key, 0.0)) + delay(d, a)
        return link_free[key]

    progress = True
    while progress:
        progress = False
        for s, order in orders.items():
            while pos[s] < len(order):
                a = order[pos[s]]
                deps = needs(a, chunks)
                if any(d not in finish for d in deps):
                    break
                ready = max((arrival(d, a) if home[d.stage] != s else finish[d] for d in deps),
                            default=0.0)
                start = max(free_at[s], ready)
                end = start + durations[a]
                out[s].append((a, start, end))
                finish[a] = free_at[s] = end
                pos[s] += 1
                progress = True
    if any(pos[s] < len(o) for s, o in orders.items()):
        raise _deadlock(orders, pos, 0)
    return out


def timed_bubble(timeline: Mapping[int, list[tuple[Action, float, float]]]) -> float:
    """Idle / (stages x wall) of a `simulate_times` result, the wall running from the first start to
    the last end over stages (the definition `metrics.bubble_fraction` applies to a measured run)."""
    rows = [r for r in timeline.values() if r]
    if not rows:
        return 0.0
    wall = max(r[-1][2] for r in rows) - min(r[0][1] for r in rows)
    busy = sum(end - start for r in rows for _, start, end in r)
    total = len(timeline) * wall
    return (total - busy) / total if total > 0 else 0.0
