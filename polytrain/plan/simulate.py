"""Pipeline step time by simulation: the runtime's own schedule objects on a model clock.

Nothing here describes a schedule. `pipeline_timeline` asks the schedule registry
(`strategies.pipeline.schedule.get_schedule`) for the very ``Orders`` the executor runs, gives each
action the duration the profile predicts for its stage (forward or backward of one micro-batch),
each message between neighbouring stages its α + S/β (a boundary's messages in one direction
queue on its link: one leaves when the previous has arrived), and replays them with
`strategies.pipeline.checks.simulate_times` — the continuous-time clock the pipeline metrics use to
replay measured runs. So a new registered schedule is priced without a line of planner code, and
what the planner prices is, action for action, what the runtime will execute.

- flush schedules (gpipe, 1f1b): one mini-batch of M micro-batches is one step; its makespan plus
  the optimizer step is the step time;
- stream schedules (pipedream): the steady-state time per mini-batch, the slope of the makespan
  between two stream lengths (warm-up and drain paid once, as the runtime pays them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from polytrain.strategies.pipeline.actions import Action, Orders
from polytrain.strategies.pipeline.checks import simulate_times, timed_bubble
from polytrain.strategies.pipeline.schedule import get_schedule

Timeline = dict[int, list[tuple[Action, float, float]]]


@dataclass(frozen=True)
class StageTimes:
    """Per stage: forward and backward seconds of one micro-batch; per boundary s→s+1: the seconds
    of one message (activation forward, its gradient backward; same size)."""

    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    message_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        p = len(self.forward_s)
        message = tuple(self.message_s) or (0.0,) * max(0, p - 1)
        object.__setattr__(self, "message_s", message)
        if len(self.backward_s) != p or len(message) != max(0, p - 1):
            raise ValueError(
                f"StageTimes: {p} forwards, {len(self.backward_s)} backwards, "
                f"{len(message)} boundaries; need P, P and P-1"
            )

    @property
    def stages(self) -> int:
        return len(self.forward_s)

    @classmethod
    def uniform(cls, stages: int, forward_s: float, backward_s: float, message_s: float = 0.0) -> StageTimes:
        return cls((forward_s,) * stages, (backward_s,) * stages, (message_s,) * (stages - 1))


def schedule_orders(schedule: str, stages: int, microbatches: int) -> Orders:
    """The orders the runtime executes (the registry's builder; never re-described here)."""
    return get_schedule(schedule).orders(stages, microbatches)


def pipeline_timeline(schedule: str, times: StageTimes, microbatches: int) -> Timeline:
    """(action, start, end) per stage for one run of ``schedule`` over ``microbatches``."""
    orders = schedule_orders(schedule, times.stages, microbatches)
    durations = {
        a: (times.forward_s if a.op == "F" else times.backward_s)[a.stage]
        for row in orders.values()
        for a in row
    }

    def message(need: Action, action: Action) -> float:
        return times.message_s[min(need.stage, action.stage)]

    return simulate_times(orders, durations, message, queue=True)


def makespan_s(timeline: Timeline) -> float:
    rows = [r for r in timeline.values() if r]
    return max(r[-1][2] for r in rows) - min(r[0][1] for r in rows) if rows else 0.0


@dataclass(frozen=True)
class PipelineEstimate:
    """Predicted seconds per step (mini-batch), bubble fraction, the simulated timeline."""

    step_s: float
    bubble: float
    timeline: Timeline


def pipeline_step(schedule: str, times: StageTimes, microbatches: int) -> PipelineEstimate:
    """Flush schedules: one mini-batch's makespan. Stream schedules: the steady-state slope."""
    spec = get_schedule(schedule)
    if spec.flush:
        timeline = pipeline_timeline(schedule, times, microbatches)
        return PipelineEstimate(makespan_s(timeline), timed_bubble(timeline), timeline)
    short, long = 2 * times.stages, 4 * times.stages
    first = pipeline_timeline(schedule, times, short)
    second = pipeline_timeline(schedule, times, long)
    slope = (makespan_s(second) - makespan_s(first)) / (long - short)
    return PipelineEstimate(slope, timed_bubble(second), first)


def stage_sums(values: Sequence[float], bounds: Sequence[tuple[int, int]]) -> tuple[float, ...]:
    """Per stage, the sum of per-layer ``values`` over its layers ``[a, b)``."""
    return tuple(sum(values[a:b]) for a, b in bounds)
