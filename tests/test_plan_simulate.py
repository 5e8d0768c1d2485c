"""Tier 1: the pipeline simulator runs the runtime's own schedule objects on a model clock."""

from __future__ import annotations

import itertools

import pytest

from polytrain.cost.simulate import StageTimes, action_seconds, makespan_s, pipeline_step, pipeline_timeline
from polytrain.schedules.registry import get_schedule, schedule_names, stage_orders


def _chunks(name: str, times: StageTimes) -> StageTimes:
    """``times`` per rank as per chunk for ``name``: each rank's times repeated for its V chunks
    (with virtual stages the planner prices P·V chunks)."""
    v = get_schedule(name).default_virtual
    msgs = (*times.message_s, times.message_s[-1]) if times.message_s else (0.0,)
    return StageTimes(times.forward_s * v, times.backward_s * v, (msgs * v)[: times.stages * v - 1])


@pytest.mark.parametrize("p,m", [(2, 1), (2, 4), (4, 8), (4, 3), (8, 32)])
@pytest.mark.parametrize("fwd,bwd", [(1.0, 1.0), (1.0, 2.0), (0.003, 0.007)])
def test_uniform_bubble_is_textbook(p: int, m: int, fwd: float, bwd: float) -> None:
    for name in ("gpipe", "1f1b"):
        est = pipeline_step(name, StageTimes.uniform(p, fwd, bwd), m)
        assert est.bubble == pytest.approx((p - 1) / (m + p - 1))
        assert est.step_s == pytest.approx((m + p - 1) * (fwd + bwd))


@pytest.mark.parametrize("name", schedule_names())
def test_action_order_is_the_runtimes(name: str) -> None:
    times = _chunks(name, StageTimes((1.0, 3.0, 2.0), (2.0, 1.0, 4.0), (0.5, 0.25)))
    timeline = pipeline_timeline(name, times, 6)
    orders = stage_orders(name, 3, 6)  # what the executor runs
    assert {s: [a for a, _, _ in row] for s, row in timeline.items()} == orders
    seconds = action_seconds(orders, times)
    for row in timeline.values():  # one action at a time per stage, durations as given
        for (a, t0, t1), (_, n0, _) in itertools.pairwise(row):
            assert t1 <= n0 + 1e-12
            assert t1 - t0 == pytest.approx(seconds[a])
            whole = (times.forward_s if a.op == "F" else times.backward_s)[a.stage]
            if not get_schedule(name).split:  # no W: every action is a whole F or B
                assert seconds[a] == whole


def test_messages_delay_the_next_stage() -> None:
    times = StageTimes((1.0, 1.0), (1.0, 1.0), (0.5,))
    timeline = pipeline_timeline("gpipe", times, 1)
    (_, _f0_start, f0_end), _ = timeline[0]
    (_, f1_start, _), _ = timeline[1]
    assert f1_start == pytest.approx(f0_end + 0.5)
    assert makespan_s(timeline) == pytest.approx(4 + 2 * 0.5)


def test_more_microbatches_never_bigger_gpipe_bubble() -> None:
    times = StageTimes((0.3, 0.5, 0.2, 0.4), (0.6, 1.1, 0.5, 0.7), (0.05, 0.1, 0.02))
    bubbles = [pipeline_step("gpipe", times, m).bubble for m in range(1, 33)]
    assert all(b2 <= b1 + 1e-12 for b1, b2 in itertools.pairwise(bubbles))


def test_faster_links_never_slower() -> None:
    for name in schedule_names():
        steps = [
            pipeline_step(name, _chunks(name, StageTimes((1.0, 2.0, 1.5), (2.0, 3.0, 2.5), (msg, msg * 2))),
                          6).step_s
            for msg in (1.0, 0.5, 0.1, 0.0)
        ]
        assert all(b <= a + 1e-12 for a, b in itertools.pairwise(steps)), name


def test_stream_schedule_steady_state_is_the_slowest_stage() -> None:
    # pipedream: no flush, so per mini-batch the slowest stage's F+B sets the pace
    est = pipeline_step("pipedream", StageTimes((1.0, 2.0, 1.0), (2.0, 3.0, 2.0)), 1)
    assert est.step_s == pytest.approx(5.0)


def test_queued_messages_share_their_link_by_hand() -> None:
    """With ``queue`` a boundary's messages in one direction leave one after the other: gpipe, 2
    stages, 3 micro-batches of 1 s forward and backward, 5 s per message. Stage 1's forwards start
    at 6, 11 and 16 (each activation waits for the previous one's 5 s), not at 6, 7 and 8."""
    from polytrain.cost.simulate import schedule_orders
    from polytrain.schedules.checks import simulate_times

    orders = schedule_orders("gpipe", 2, 3)
    durations = {a: 1.0 for row in orders.values() for a in row}
    starts = {
        queue: [t0 for a, t0, _ in simulate_times(orders, durations, 5.0, queue=queue)[1] if a.op == "F"]
        for queue in (False, True)
    }
    assert starts[False] == [6.0, 7.0, 8.0]
    assert starts[True] == [6.0, 11.0, 16.0]


def test_shared_cores_by_hand() -> None:
    """gpipe, 2 stages, 2 micro-batches of 1 s forward and backward, no message time. Stage 0's
    second forward and stage 1's first overlap, as do stage 1's last backward and stage 0's first:
    on 1.5 cores each of a pair runs at 0.75 of full speed, 4/3 s instead of 1, so the step is
    1 + 4/3 + 1 + 1 + 4/3 + 1 = 20/3 s; on 1 core the total work, 8 s; on 2 cores the textbook 6 s."""
    times = StageTimes.uniform(2, 1.0, 1.0)
    spans = {cores: makespan_s(pipeline_timeline("gpipe", times, 2, cores)) for cores in (1.0, 1.5, 2.0)}
    assert spans == pytest.approx({1.0: 8.0, 1.5: 20 / 3, 2.0: 6.0})


def test_a_waiting_stage_is_woken_late_by_hand() -> None:
    """``wake_s``: a stage already waiting when its message arrives starts that much later if another
    message was on the wire with it; a stage still computing, or woken by a message alone in flight,
    pays nothing. gpipe, 2 stages, 2 micro-batches, 0.1 s forwards, 0.5 s messages, wake 0.25 s:
    F0 0–0.1 sends A (0.1–0.6), F0' 0.1–0.2 sends B, queued behind A (0.6–1.1) but on the wire with
    it from 0.2: stage 1, waiting, starts A's forward at 0.6 + 0.25; it is still computing it (to
    1.85) when B lands, so B's forward follows at once."""
    times = StageTimes((0.1, 1.0), (0.1, 1.0), (0.5,))
    row = pipeline_timeline("gpipe", times, 2, cores=2.0, wake_s=0.25)[1]
    (_, f0, f0_end), (_, f1, _) = row[0], row[1]
    assert (f0, f0_end, f1) == pytest.approx((0.85, 1.85, 1.85))
    assert pipeline_timeline("gpipe", times, 2, cores=2.0)[1][0][1] == pytest.approx(0.6)
    # one micro-batch: every message alone on the wire, nobody is woken late (F0 0–1, F1 1.5–2.5,
    # B1 2.5–3.5, the gradient lands at 4, B0 4–5)
    lone = StageTimes((1.0, 1.0), (1.0, 1.0), (0.5,))
    assert makespan_s(pipeline_timeline("gpipe", lone, 1, cores=2.0, wake_s=0.25)) == pytest.approx(5.0)


@pytest.mark.parametrize("name", schedule_names())
def test_shared_cores_enough_equals_own_cores(name: str) -> None:
    """With a core per stage the shared-core clock is the plain one, action for action; with fewer
    the step never shrinks, and on one core it is at least the total work."""
    times = _chunks(name, StageTimes((1.0, 3.0, 2.0, 0.5), (2.0, 1.0, 4.0, 1.5), (0.5, 0.25, 1.0)))
    m = 8 if get_schedule(name).placement == "loop" else 5  # interleaving runs rounds of P
    own = pipeline_timeline(name, times, m)
    shared = pipeline_timeline(name, times, m, cores=4.0)
    assert {s: [a for a, _, _ in row] for s, row in shared.items()} == {
        s: [a for a, _, _ in row] for s, row in own.items()
    }
    flat = [t for row in own.values() for _, t0, t1 in row for t in (t0, t1)]
    assert [t for row in shared.values() for _, t0, t1 in row for t in (t0, t1)] == pytest.approx(flat)
    spans = [makespan_s(pipeline_timeline(name, times, m, cores=c)) for c in (4.0, 3.0, 2.0, 1.5, 1.0)]
    assert all(b >= a - 1e-9 for a, b in itertools.pairwise(spans))
    work = sum(t1 - t0 for row in own.values() for _, t0, t1 in row)
    assert spans[-1] >= work - 1e-9
