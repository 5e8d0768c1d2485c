"""Tier 1: each strategy's price from the orders and options its runtime uses: pipeline cuts and
schedules, ZeRO-3's gathers per micro-step, mesh's layouts (synthetic profiles, no measuring)."""

from __future__ import annotations

from typing import Any

import pytest

from polytrain.cost.cluster import Cluster
from polytrain.cost.profile import LayerRecord, Profile
from polytrain.cost.scene import Scene
from polytrain.models.partition import LayerCost
from polytrain.plan.recommend import candidates, rank
from tests.test_plan_recommend import CLUSTER, gpt_like, vgg_like


def test_partition_auto_is_priced_with_the_cut_the_runtime_makes() -> None:
    """partition=auto plans for the run's ``link_gbps`` (10 Gbit/s by default), not for the
    cluster's network: the estimate must price that cut (`pipeline.planning.resolve_partition`)."""
    from polytrain.config import load_config
    from polytrain.cost.pipeline import plan_partition
    from polytrain.models.partition import pipedream_plan
    from polytrain.plan.predict import estimate_for

    # a wide activation after layer 0, a narrow one after layer 1: on a slow link the planner would
    # cut at the narrow one, the runtime (planning for 10 Gbit/s) balances compute at the wide one
    layers = (
        LayerRecord("conv1", "Sequential", 5e-3, 1e-2, 0.0, 0.0, 64 * 4096, 640, 1280),
        LayerRecord("conv2", "Sequential", 3e-3, 6e-3, 0.0, 0.0, 64 * 256, 18_560, 37_120),
        LayerRecord("fc1", "Sequential", 2e-3, 4e-3, 0.0, 0.0, 64 * 256, 131_328, 262_656),
        LayerRecord("head", "Linear", 1e-4, 2e-4, 0.0, 0.0, 64 * 40, 2_600, 5_200),
    )
    prof = Profile(
        "cnn",
        "digits",
        64,
        "sgd",
        layers,
        tuple((r.name, (r.param_bytes // 4,)) for r in layers),
        64 * 256,
        1e-4,
        300 * 2**20,
        2,
        {},
        {},
    )
    scene = Scene(prof, Cluster.parse("hosts=2,nic=100mbit"), 64)
    costs = [
        LayerCost(r.name, sum(scene.layer_fb(i, 16)), r.activation_bytes // 4, r.param_bytes)
        for i, r in enumerate(layers)
    ]
    runtime = pipedream_plan(costs, 2, 10e9 / 8, replicate=False).partition
    assert (str(runtime), str(plan_partition(scene, 2, 16))) == ("1,3", "2,2")  # the cuts differ

    def priced(*sets: str) -> str:
        cfg = load_config(
            None,
            {"strategy": "gpipe", "procs": 2, "model": "cnn", "dataset": "digits"},
            ["microbatches=4", *sets],
        )
        e = estimate_for(cfg, 2, scene)
        assert not isinstance(e, str)
        return str(e.detail["partition"])

    assert priced() == str(runtime)
    assert priced("link_gbps=0.1") == "2,2"  # planned for the slow link, as the runtime would


def test_pipeline_messages_get_only_the_refilled_bucket() -> None:
    """A shaped link's bucket refills at the shaped rate between a boundary's messages, which leave
    one per micro-batch: with next to no compute between them it gives nothing back; with long
    compute every message finds it full again."""
    from dataclasses import replace

    from polytrain.cost.pipeline import pipeline
    from polytrain.plan.calibration import emulate

    prof = vgg_like()
    plain = Cluster.parse("hosts=2,nic=100mbit,latency=10us")
    shaped = emulate(plain, burst_bytes=50_000)
    instant = replace(prof, layers=tuple(replace(r, forward_s=1e-9, backward_s=1e-9, forward_fixed_s=0.0,
                                                 backward_fixed_s=0.0) for r in prof.layers))
    for p, refills in ((instant, False), (prof, True)):
        with_bucket, part = pipeline(Scene(p, shaped, 64), "gpipe", 2, 4)
        without, _ = pipeline(Scene(p, plain, 64), "gpipe", 2, 4, partition=part)
        if refills:
            assert with_bucket.step_s < without.step_s
        else:
            assert with_bucket.step_s == pytest.approx(without.step_s, abs=1e-6)  # a byte at most


def test_forward_scale_prices_the_forward_alone() -> None:
    """A forward scale of its own moves every forward and no backward (a training step's forward runs
    slower against its profile than its backward; the benchmark's probes measure each apart)."""
    prof = vgg_like()
    one = Scene(prof, CLUSTER, 64, 1.5)
    split = Scene(prof, CLUSTER, 64, 1.5, forward_scale=3.0)
    f1, b1 = one.fb(0, len(prof.layers), 16)
    f2, b2 = split.fb(0, len(prof.layers), 16)
    assert f2 == pytest.approx(2 * f1) and b2 == pytest.approx(b1)
    assert Scene(prof, CLUSTER, 64, 1.5, forward_scale=1.5).fb(0, 3, 16) == pytest.approx(one.fb(0, 3, 16))


def test_executor_and_server_own_times_by_hand() -> None:
    """The executor's own time per action is paid once per neighbouring stage (a middle stage's
    action receives from one and sends to the other); a parameter server takes its workers'
    requests one at a time, so a BSP step pays workers × its time per request."""
    from polytrain.cost.estimate import ps

    scene = Scene(vgg_like(), CLUSTER, 64, action_overhead_s=1e-3)
    bare = Scene(vgg_like(), CLUSTER, 64)
    for neighbours, paid in ((0, 1e-3), (1, 1e-3), (2, 2e-3)):
        f, b = scene.action_fb(0, 4, 16, neighbours)
        f0, b0 = bare.action_fb(0, 4, 16, neighbours)
        assert (f - f0, b - b0) == (pytest.approx(paid), pytest.approx(paid))
    served = Scene(vgg_like(), CLUSTER, 64, ps_request_s=2e-3)
    for world, servers in ((4, 1), (4, 2)):
        def step(s: Scene, consistency: str, world: int = world, servers: int = servers) -> float:
            return ps(s, world, servers, "size", consistency).step_s

        assert step(served, "bsp") - step(bare, "bsp") == pytest.approx((world - servers) * 2e-3)
        assert step(served, "async") >= step(bare, "async")  # async: the busiest link may hide it


def test_zb_h1_priced_below_1f1b_from_the_same_orders() -> None:
    """The planner replays zb-h1's own orders (W = half of each backward): on the same cut and M it
    never predicts a longer step than 1f1b, and strictly shorter once the pipe has a bubble to fill."""
    from polytrain.cost.pipeline import pipeline

    scene = Scene(vgg_like(), CLUSTER, 64)
    one, _ = pipeline(scene, "1f1b", 4, 8)
    zb, _ = pipeline(scene, "zb-h1", 4, 8)
    assert zb.step_s < one.step_s


@pytest.mark.parametrize("schedule", ["interleaved-1f1b", "looped-bfs", "zbv", "dualpipev"])
def test_virtual_schedules_priced_from_the_orders_the_runtime_runs(schedule: str) -> None:
    """P = 2 ranks, V = 2: the planner cuts 4 chunks and replays, rank by rank, exactly the actions
    of the registered orders; looped-bfs holds every micro-batch of both chunks (M·V), the
    interleaved order fewer, so it is priced with more memory on the same cut."""
    from polytrain.cost.pipeline import pipeline
    from polytrain.schedules.registry import stage_orders

    scene = Scene(vgg_like(), CLUSTER, 64)
    e, part = pipeline(scene, schedule, 2, 4)
    assert part.stages == 4 and e.step_s > 0
    orders = stage_orders(schedule, 2, 4)
    for r in (0, 1):
        done = [s.label for s in sorted(e.spans, key=lambda s: s.start)
                if s.rank == r and s.kind in ("forward", "backward")]
        assert done == [a.cell for a in orders[r]]
    if schedule == "looped-bfs":
        interleaved, _ = pipeline(scene, "interleaved-1f1b", 2, 4, partition=part)
        assert e.peak_memory_bytes > interleaved.peak_memory_bytes


def test_zero3_gathers_16_bit_parameters_every_micro_step_on_one_link() -> None:
    """Stage 3's collectives from first principles. Under bf16 the runtimes gather 16-bit
    parameters and reduce-scatter 16-bit gradients: Ψ/2 bytes per fp32 Ψ each. They gather every
    layer before its forward and its backward in every micro-step of --grad-accum k; zero stages
    2-3 reduce-scatter every micro-step, stage 1 and fsdp (sync off) once a step. All of them
    cross the same NIC, so on a link-bound cluster a step lasts at least the sum of their times
    on it. fsdp's no-sync micro-steps accumulate the full 16-bit gradient."""
    from polytrain.cost.network import group_allgather_s
    from polytrain.strategies import make_strategy

    prof, cl, w, k = gpt_like(), Cluster.parse("hosts=4,nic=1gbit"), 4, 4
    psi = prof.param_bytes

    def price(name: str, opts: dict[str, int], accum: int) -> Any:
        e = make_strategy(name, opts).price(Scene(prof, cl, 32, precision="bf16", grad_accum=accum), w)
        assert not isinstance(e, str)
        return e

    z3 = price("zero", {"stage": 3, "prefetch": 1}, 1)
    assert z3.bytes_per_step == pytest.approx(3 * (w - 1) * psi / 2)
    z3k = price("zero", {"stage": 3, "prefetch": 1}, k)
    assert z3k.bytes_per_step == pytest.approx(k * z3.bytes_per_step)
    assert price("fsdp", {}, k).bytes_per_step == pytest.approx((w - 1) * (2 * k + 1) * psi / 2)
    assert price("zero", {"stage": 2}, k).bytes_per_step == pytest.approx((w - 1) * (1 + k) * psi / 2)
    assert price("zero", {"stage": 1}, k).bytes_per_step == pytest.approx((w - 1) * 2 * psi / 2)
    # one link: every gather (twice per layer) and every reduce-scatter, one after another
    per_micro = sum(3 * group_allgather_s(r.param_bytes / 2, range(w), cl) for r in prof.layers)
    for accum in (1, k):
        e = price("zero", {"stage": 3, "prefetch": 1}, accum)
        assert accum * per_micro <= e.step_s <= accum * per_micro + e.detail["compute_s"] + prof.optimizer_s
    fsdp, zero = price("fsdp", {}, k), price("zero", {"stage": 3, "prefetch": 1}, k)
    assert fsdp.peak_memory_bytes - zero.peak_memory_bytes == pytest.approx(psi / 2, abs=2)


def test_mesh_offers_dp_pp_layouts_with_the_new_schedules() -> None:
    """``mesh`` dp × pp is offered with each schedule the pipe can run, the planner's cut of P·V
    chunks pinned, and priced from the same orders as the strategy built from those options; on
    the GPT shape (bubble-bound at pp=2) a zero-bubble or virtual-stage layout is the fastest
    mesh pipeline, so the plan lists and ranks it above every 1F1B layout."""
    from polytrain.schedules.registry import get_schedule
    from polytrain.strategies import make_strategy

    scene = Scene(gpt_like(), CLUSTER, 64)
    ranked = rank(candidates(scene))
    piped = [c for c in ranked if c.strategy == "mesh" and "pp" in c.options]
    offered = {c.options.get("schedule", "1f1b") for c in piped}
    assert offered == {"1f1b", "zb-h1", "interleaved-1f1b", "looped-bfs", "zbv", "dualpipev"}
    for c in piped:
        o = c.options
        name, pp, m = o.get("schedule", "1f1b"), o["pp"], o["microbatches"]
        chunks = pp * get_schedule(name).default_virtual
        assert len(o["partition"].split(",")) == chunks and m % pp == 0
        again = make_strategy("mesh", o).price(scene, c.procs)
        assert not isinstance(again, str) and again.step_s == c.estimate.step_s
    best = piped[0]
    assert best.options.get("schedule", "1f1b") != "1f1b"
    assert best.estimate.step_s < min(c.estimate.step_s for c in piped if "schedule" not in c.options)
