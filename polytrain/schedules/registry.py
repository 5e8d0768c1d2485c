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

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from polytrain.errors import ConfigError, unknown
from polytrain.schedules import virtual as schedule_virtual
from polytrain.schedules.actions import (
    OPS,
    Action,
    Grid,
    Op,
    Orders,
    check_cost,
    check_sizes,
    makespan,
)
from polytrain.schedules.checks import dry_run, simulate, validate

__all__ = [
    "OPS",
    "SCHEDULES",
    "Action",
    "Grid",
    "Op",
    "Orders",
    "ScheduleSpec",
    "StageLoad",
    "bubble_fraction",
    "check_cost",
    "dry_run",
    "get_schedule",
    "gpipe",
    "gpipe_orders",
    "in_flight",
    "makespan",
    "one_f_one_b",
    "one_f_one_b_orders",
    "pipedream_async",
    "pipedream_orders",
    "register_schedule",
    "schedule_names",
    "simulate",
    "stage_load",
    "stage_orders",
    "validate",
]

# --- builders (orders) -------------------------------------------------------------------------


def gpipe_orders(stages: int, microbatches: int) -> Orders:
    """GPipe: every forward, then every backward, then one flush (update) per mini-batch.

    Backwards run last-in first-out, as in GPipe's own figure (survey Fig. 9): the micro-batch
    that just left the last stage is the first whose gradient can start, so no stage waits
    for it. Peak activations: all M micro-batches on every stage.
    """
    check_sizes(stages, microbatches)
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
    check_sizes(stages, microbatches)
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
    check_sizes(stages, minibatches, "minibatches")
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
    orders: Callable[..., Orders] = field(repr=False)  # (stages, microbatches[, virtual]) -> Orders
    flush: bool = True
    unit: str = "micro-batch"
    placement: str = "none"  # "none": one chunk per rank; "loop": chunk c on rank c mod P; "v"
    split: bool = False  # schedules W (weight gradient) apart from B (input gradient)

    @property
    def default_virtual(self) -> int:
        return 1 if self.placement == "none" else 2

    def build(self, stages: int, microbatches: int, virtual: int | None = None) -> Orders:
        """The orders for ``stages`` ranks; ``virtual`` chunks per rank (None: the default)."""
        if self.placement == "none":
            if virtual not in (None, 1):
                raise ConfigError(
                    f"'{self.name}' runs virtual_stages={virtual}. Rule: it places one chunk per rank. "
                    "Fix: --set virtual_stages=1, or a schedule with virtual stages (interleaved-1f1b)."
                )
            return self.orders(stages, microbatches)
        return self.orders(stages, microbatches, self.default_virtual if virtual is None else virtual)

    def grid(self, stages: int, microbatches: int, cost: Mapping[str, int] | None = None,
             virtual: int | None = None) -> Grid:
        return simulate(self.build(stages, microbatches, virtual), cost)


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


_NEW = (
    ("interleaved-1f1b", "Interleaved 1F1B (Megatron): V chunks per rank, bubble / V",
     schedule_virtual.interleaved_orders, "loop", False),
    ("looped-bfs", "Looped BFS: GPipe looped over V chunks per rank, earlier chunk first",
     schedule_virtual.looped_bfs_orders, "loop", False),
    ("zb-h1", "ZB-H1 zero bubble: 1F1B with B and W split, W deferred into the bubble",
     schedule_virtual.zb_h1_orders, "none", True),
    ("zbv", "ZB-V zero bubble: 2 chunks per rank in a V, B and W split",
     schedule_virtual.zbv_orders, "v", True),
    ("dualpipev", "DualPipeV (DeepSeek-V3, cut in half): 2 chunks per rank in a V, bidirectional",
     schedule_virtual.dualpipev_orders, "v", True),
)
for _name, _text, _build, _place, _split in _NEW:
    register_schedule(ScheduleSpec(_name, _text, _build, placement=_place, split=_split))


def schedule_names() -> list[str]:
    return list(SCHEDULES)


def get_schedule(name: str) -> ScheduleSpec:
    if name not in SCHEDULES:
        raise unknown("schedule", name, SCHEDULES, "Fix: polytrain schedule gpipe --stages 4.")
    return SCHEDULES[name]


def stage_orders(name: str, stages: int, microbatches: int, virtual: int | None = None) -> Orders:
    """The order of work per stage (rank) of a registered schedule: what the runtime executes."""
    return get_schedule(name).build(stages, microbatches, virtual)


def gpipe(stages: int, microbatches: int, cost: Mapping[str, int] | None = None) -> Grid:
    return simulate(gpipe_orders(stages, microbatches), cost)


def one_f_one_b(stages: int, microbatches: int, cost: Mapping[str, int] | None = None) -> Grid:
    return simulate(one_f_one_b_orders(stages, microbatches), cost)


def pipedream_async(stages: int, minibatches: int, cost: Mapping[str, int] | None = None) -> Grid:
    return simulate(pipedream_orders(stages, minibatches), cost)


# --- measures ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageLoad:
    busy: int
    idle: int


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
    versions). A micro-batch's activations are freed by its last B or W on the stage. With
    virtual stages a rank counts (chunk, micro-batch) pairs, each holding one chunk's activations.
    """
    peaks = {}
    for s, order in orders.items():
        last = {(a.stage, a.microbatch): i for i, a in enumerate(order) if a.op in ("B", "W")}
        live = peak = 0
        for i, a in enumerate(order):
            live += (a.op == "F") - (last.get((a.stage, a.microbatch)) == i)
            peak = max(peak, live)
        peaks[s] = peak
    return peaks
