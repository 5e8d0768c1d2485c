"""Pipeline step time by simulation: the runtime's own schedule objects on a model clock.

Nothing here describes a schedule. `pipeline_timeline` asks the schedule registry
(`schedules.registry.get_schedule`) for the very ``Orders`` the executor runs, gives each
action the duration the profile predicts for its stage (forward or backward of one micro-batch),
each message between neighbouring stages its α + S/β (a boundary's messages in one direction
queue on its link: one leaves when the previous has arrived), and replays them with
`schedules.checks.simulate_times` — the continuous-time clock the pipeline metrics use to
replay measured runs. So a new registered schedule is priced without a line of planner code, and
what the planner prices is, action for action, what the runtime will execute.

- flush schedules (gpipe, 1f1b): one mini-batch of M micro-batches is one step; its makespan plus
  the optimizer step is the step time;
- stream schedules (pipedream): the steady-state time per mini-batch, the slope of the makespan
  between two stream lengths (warm-up and drain paid once, as the runtime pays them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from polytrain.schedules.actions import Action, Orders
from polytrain.schedules.checks import (
    _deadlock,
    check_rows,
    chunk_count,
    chunk_rows,
    full_backwards,
    needs,
    simulate_times,
    timed_bubble,
)
from polytrain.schedules.registry import get_schedule

Timeline = dict[int, list[tuple[Action, float, float]]]


@dataclass(frozen=True)
class StageTimes:
    """Per stage (model chunk, with virtual stages): forward and backward seconds of one
    micro-batch; per boundary s→s+1: the seconds of one message (activation forward, its gradient
    backward; same size). ``weight_s``: the weight-gradient part of each backward, for schedules
    that split it (B = backward − weight, W = weight); empty: half of each backward (a linear
    layer's two gradients are two matrix products of the same size)."""

    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    message_s: tuple[float, ...] = ()
    weight_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        p = len(self.forward_s)
        message = tuple(self.message_s) or (0.0,) * max(0, p - 1)
        object.__setattr__(self, "message_s", message)
        weight = tuple(self.weight_s) or tuple(b / 2 for b in self.backward_s)
        object.__setattr__(self, "weight_s", weight)
        if len(self.backward_s) != p or len(message) != max(0, p - 1) or len(weight) != p:
            raise ValueError(
                f"StageTimes: {p} forwards, {len(self.backward_s)} backwards, {len(weight)} weight "
                f"parts, {len(message)} boundaries; need P, P, P and P-1"
            )

    @property
    def stages(self) -> int:
        return len(self.forward_s)

    @classmethod
    def uniform(cls, stages: int, forward_s: float, backward_s: float, message_s: float = 0.0) -> StageTimes:
        return cls((forward_s,) * stages, (backward_s,) * stages, (message_s,) * (stages - 1))


def schedule_orders(schedule: str, stages: int, microbatches: int, virtual: int | None = None) -> Orders:
    """The orders the runtime executes (the registry's builder; never re-described here)."""
    return get_schedule(schedule).build(stages, microbatches, virtual)


def schedule_ranks(schedule: str, chunks: int, virtual: int | None = None) -> int:
    """Ranks that run ``chunks`` model chunks under ``schedule`` with ``virtual`` chunks per rank
    (None: the schedule's default)."""
    virtual = virtual or get_schedule(schedule).default_virtual
    if chunks % virtual:
        raise ValueError(f"{schedule} places {virtual} chunks per rank; {chunks} chunks do not divide")
    return chunks // virtual


def action_seconds(orders: Orders, times: StageTimes) -> dict[Action, float]:
    """Each action's seconds: F the chunk's forward; W its weight part; B the input part where the
    order splits that backward, else the whole backward."""
    full = full_backwards(orders)
    split = any(a.op == "W" for row in orders.values() for a in row)
    out = {}
    for row in orders.values():
        for a in row:
            c = a.stage
            if a.op == "F":
                out[a] = times.forward_s[c]
            elif a.op == "W":
                out[a] = times.weight_s[c]
            else:
                out[a] = times.backward_s[c] - (times.weight_s[c] if split and a not in full else 0.0)
    return out


def pipeline_timeline(
    schedule: str, times: StageTimes, microbatches: int, cores: float | None = None, wake_s: float = 0.0,
    virtual: int | None = None,
) -> Timeline:
    """(action, start, end) per stage (rank) for one run of ``schedule`` over ``microbatches``;
    ``times`` per model chunk (P·V of them with V = ``virtual`` chunks per rank, None: the
    schedule's default); ``cores``: the ranks share that many cores (`shared_times`, with
    ``wake_s``), None: each has its own."""
    ranks = schedule_ranks(schedule, times.stages, virtual)
    orders = schedule_orders(schedule, ranks, microbatches, times.stages // ranks)
    durations = action_seconds(orders, times)

    def message(need: Action, action: Action) -> float:
        return times.message_s[min(need.stage, action.stage)]

    if cores is None:
        return simulate_times(orders, durations, message, queue=True)
    return shared_times(orders, durations, message, cores, wake_s)


def shared_times(
    orders: Orders,
    durations: dict[Action, float],
    message: Callable[[Action, Action], float],
    cores: float,
    wake_s: float = 0.0,
) -> Timeline:
    """`simulate_times` (with queued links) when the stages share ``cores`` cores: an event clock
    on which the n actions computing at once each progress at min(1, cores/n) of full speed
    (processor sharing, as the OS shares cores among busy ranks); a message takes no core. A stage
    already waiting when its message arrives starts ``wake_s`` later if another message was on the
    wire with it (a blocked receiver is woken late while other ranks' messages are handled:
    `Cluster.wake_s`); one still busy, or woken by a message alone in flight, pays nothing. With
    ``cores`` ≥ the number of stages and no ``wake_s`` this is `simulate_times(..., queue=True)`."""
    check_rows(orders)
    stages, home = chunk_count(orders), chunk_rows(orders)
    consumers: dict[Action, list[Action]] = {}
    for row in orders.values():
        for a in row:
            for d in needs(a, stages):
                consumers.setdefault(d, []).append(a)
    pos = dict.fromkeys(orders, 0)
    arrived: dict[tuple[Action, Action], float] = {}  # (need, consumer) -> arrival time
    sent: dict[tuple[Action, Action], float] = {}  # (need, consumer) -> when it left
    done: dict[Action, float] = {}
    link_free: dict[tuple[int, int], float] = {}
    running: dict[int, tuple[Action, float, float]] = {}  # stage -> (action, start, work left)
    out: Timeline = {s: [] for s in sorted(orders)}
    idle_since = dict.fromkeys(orders, 0.0)  # when each stage's last action ended
    now = 0.0

    def ready_at(s: int) -> float | None:
        a = orders[s][pos[s]]
        local = [0.0]
        messages: list[tuple[float, tuple[Action, Action] | None]] = [(0.0, None)]
        for d in needs(a, stages):
            if d not in done:
                return None
            if home[d.stage] == s:
                local.append(done[d])
            else:
                messages.append((arrived[(d, a)], (d, a)))
        last, key = max(messages, key=lambda m: m[0])
        if wake_s and key and last >= max(local) and last > idle_since[s] and crowded(key):
            return last + wake_s  # the stage sat blocked on this message: it is woken late
        return max(last, max(local))

    def crowded(key: tuple[Action, Action]) -> bool:
        """Whether message ``key`` shared the wire (from its send to its arrival) with another."""
        start, end = sent[key], arrived[key]
        return any(k != key and t0 < end and start < arrived[k] for k, t0 in sent.items())

    while True:
        waiting = {
            s: t
            for s in orders
            if s not in running and pos[s] < len(orders[s]) and (t := ready_at(s)) is not None
        }
        for s, t in waiting.items():
            if t <= now:
                a = orders[s][pos[s]]
                running[s] = (a, now, durations[a])
        later = [t for t in waiting.values() if t > now]  # the ready times not yet reached
        if not running:
            if not later:
                break
            now = min(later)
            continue
        rate = min(1.0, cores / len(running))
        end = now + min(left for _, _, left in running.values()) / rate
        start = min(later, default=end)
        step = min(end, start)
        for s, (a, t0, left) in list(running.items()):
            left -= (step - now) * rate
            if left > 1e-12:
                running[s] = (a, t0, left)
                continue
            del running[s]
            out[s].append((a, t0, step))
            done[a] = idle_since[s] = step
            pos[s] += 1
            for c in consumers.get(a, []):
                if home[c.stage] != s:
                    key = (s, home[c.stage])
                    link_free[key] = max(step, link_free.get(key, 0.0)) + message(a, c)
                    arrived[(a, c)] = link_free[key]
                    sent[(a, c)] = step
        now = step
    if any(pos[s] < len(o) for s, o in orders.items()):
        raise _deadlock(orders, pos, 0)
    return out


def makespan_s(timeline: Timeline) -> float:
    rows = [r for r in timeline.values() if r]
    return max(r[-1][2] for r in rows) - min(r[0][1] for r in rows) if rows else 0.0


@dataclass(frozen=True)
class PipelineEstimate:
    """Predicted seconds per step (mini-batch), bubble fraction, the simulated timeline."""

    step_s: float
    bubble: float
    timeline: Timeline


def pipeline_step(
    schedule: str, times: StageTimes, microbatches: int, cores: float | None = None, wake_s: float = 0.0,
    virtual: int | None = None,
) -> PipelineEstimate:
    """Flush schedules: one mini-batch's makespan. Stream schedules: the steady-state slope.
    ``cores``, ``wake_s``, ``virtual``: as `pipeline_timeline`."""
    spec = get_schedule(schedule)
    if spec.flush:
        timeline = pipeline_timeline(schedule, times, microbatches, cores, wake_s, virtual)
        return PipelineEstimate(makespan_s(timeline), timed_bubble(timeline), timeline)
    short, long = 2 * times.stages, 4 * times.stages
    first = pipeline_timeline(schedule, times, short, cores, wake_s)
    second = pipeline_timeline(schedule, times, long, cores, wake_s)
    slope = (makespan_s(second) - makespan_s(first)) / (long - short)
    return PipelineEstimate(slope, timed_bubble(second), first)
