"""Tier 1: the recommender on synthetic profiles (no measuring): candidates, ranking, limits, speed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from polytrain.cli import main
from polytrain.cost.cluster import Cluster
from polytrain.cost.profile import LayerRecord, Profile
from polytrain.cost.scene import Scene
from polytrain.errors import ConfigError
from polytrain.models.partition import LayerCost
from polytrain.plan.commands import sweep
from polytrain.plan.recommend import candidates, check_memory, rank, to_json


def vgg_like(batch: int = 64) -> Profile:
    """13 conv layers (compute-heavy, few parameters), then 3 FC (fc1 ~ 3/4 of the parameters)."""
    layers = [
        LayerRecord(f"conv{i}", "Sequential", 2e-3, 4e-3, 1e-4, 2e-4, 400_000, 150_000, 300_000)
        for i in range(13)
    ]
    layers += [
        LayerRecord("fc1", "Sequential", 1e-3, 2e-3, 1e-4, 1e-4, 20_000, 6_000_000, 12_000_000),
        LayerRecord("fc2", "Sequential", 2e-4, 4e-4, 1e-5, 1e-5, 20_000, 900_000, 1_800_000),
        LayerRecord("fc3", "Linear", 1e-5, 2e-5, 1e-6, 1e-6, 2_560, 20_000, 40_000),
    ]
    params = tuple((f"{r.name}.weight", (r.param_bytes // 4,)) for r in layers)
    return Profile(
        "vgg16",
        "synthetic-images",
        batch,
        "adam",
        tuple(layers),
        params,
        batch * 12_288,
        0.01,
        300 * 2**20,
        13,
        {"width": 8},
        {},
    )


def gpt_like() -> Profile:
    layers = [LayerRecord("embed", "Embed", 1e-4, 2e-4, 1e-5, 1e-5, 500_000, 80_000, 160_000)]
    layers += [
        LayerRecord(f"block{i}", "Block", 5e-3, 1e-2, 2e-4, 4e-4, 500_000, 200_000, 400_000) for i in range(4)
    ]
    layers += [LayerRecord("head", "Head", 1e-3, 2e-3, 5e-5, 1e-4, 2_000_000, 66_000, 132_000)]
    params = tuple((f"{r.name}.weight", (r.param_bytes // 4,)) for r in layers)
    return Profile(
        "gpt-mini",
        "chars",
        32,
        "adam",
        tuple(layers),
        params,
        32 * 64 * 8,
        0.002,
        300 * 2**20,
        None,
        {},
        {},
        task="lm",
    )


CLUSTER = Cluster.parse("hosts=4,procs_per_host=1,nic=1gbit,latency=100us")


def test_every_family_is_priced() -> None:
    names = {c.strategy for c in candidates(Scene(vgg_like(), CLUSTER, 64))}
    assert {
        "single",
        "allreduce",
        "local-sgd",
        "ps",
        "gpipe",
        "1f1b",
        "zb-h1",
        "interleaved-1f1b",
        "looped-bfs",
        "zbv",
        "dualpipev",
        "pipedream",
        "layerwise",
        "owt",
        "mesh",
    } <= names
    gpt = {c.strategy for c in candidates(Scene(gpt_like(), CLUSTER, 32))}
    assert {"tensor", "mesh", "allreduce"} <= gpt and "owt" not in gpt


def test_ranking_fitting_first_then_fastest() -> None:
    ranked = rank(candidates(Scene(vgg_like(), CLUSTER, 64), memory_limit=330 * 2**20))
    fits = [c.fits for c in ranked]
    assert fits == sorted(fits, reverse=True)
    rates = [c.samples_per_s for c in ranked if c.fits]
    assert rates == sorted(rates, reverse=True)


def test_impossible_memory_limit_names_the_smallest_need() -> None:
    cands = candidates(Scene(vgg_like(), CLUSTER, 64), memory_limit=2**20)
    smallest = min(c.estimate.peak_memory_bytes for c in cands)
    with pytest.raises(ConfigError, match="smallest memory any strategy needs") as err:
        check_memory(cands, 2**20)
    assert "\n" not in str(err.value)
    from polytrain.report.units import human_bytes

    assert human_bytes(smallest) in str(err.value)


def test_more_bandwidth_never_predicts_slower() -> None:
    prof = vgg_like()
    for nic in ("100mbit", "1gbit", "10gbit"):
        slow = {
            c.label: c.estimate.step_s
            for c in candidates(Scene(prof, Cluster.parse(f"hosts=4,nic={nic}"), 64))
        }
        fast_nic = {"100mbit": "1gbit", "1gbit": "10gbit", "10gbit": "100gbit"}[nic]
        fast = candidates(Scene(prof, Cluster.parse(f"hosts=4,nic={fast_nic}"), 64))
        for c in fast:
            if c.label in slow and "partition" not in c.options:  # same plan on both links
                assert c.estimate.step_s <= slow[c.label] + 1e-12, c.label


def test_4096_ranks_planned_in_under_10_s() -> None:
    cluster = Cluster.parse("hosts=512,procs_per_host=8,nic=100gbit,intra=300gbyte,latency=5us")
    for prof, batch in ((vgg_like(), 8192), (gpt_like(), 8192)):
        t0 = time.perf_counter()
        ranked = rank(candidates(Scene(prof, cluster, batch)))
        assert time.perf_counter() - t0 < 10.0
        assert {"allreduce", "ps", "mesh"} <= {c.strategy for c in ranked}
        assert all(c.procs in (1, 4096) for c in ranked)


def test_json_schema_fields() -> None:
    job = {
        "model": "vgg16",
        "dataset": "synthetic-images",
        "optimizer": "adam",
        "model_options": {"width": 8},
    }
    for c in rank(candidates(Scene(vgg_like(), CLUSTER, 64))):
        row = to_json(c, job)
        for key in (
            "strategy",
            "options",
            "command",
            "predicted_step_s",
            "predicted_samples_per_s",
            "peak_memory_bytes",
            "bytes_per_step",
            "fits",
        ):
            assert key in row
        assert row["command"].startswith(f"polytrain train --strategy {c.strategy} --procs {c.procs}")
        json.dumps(row)


@pytest.mark.slow  # long (seconds of training/sampling), not multi-process
def test_sweep_finds_where_a_hybrid_overtakes_dp() -> None:
    # on a slow network the VGG shape's big FC layer makes owt/mesh beat DP as workers grow
    result = sweep(vgg_like(256), Cluster.parse("hosts=2,nic=100mbit,latency=100us"), 256, 1.0, 2, 64)
    assert [r["hosts"] for r in result["rows"]] == [2, 4, 8, 16, 32, 64]
    x = result["crossover_ranks"]
    assert x is not None
    row = next(r for r in result["rows"] if r["ranks"] == x)
    rates = row["samples_per_s"]
    assert max(rates.get("owt", 0), rates.get("mesh", 0)) > rates["allreduce"]


def test_plan_cli_json_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prof = tmp_path / "p.json"
    vgg_like().save(prof)
    assert main(["plan", "--profile", str(prof), "--cluster", "hosts=4,nic=1gbit", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["fits"] and rows[0]["predicted_samples_per_s"] >= rows[-1]["predicted_samples_per_s"]
    assert main(["plan", "--profile", str(prof), "--cluster", "hosts=4,nic=fast"]) == 2
    assert "field 'nic'" in capsys.readouterr().err
    assert main(["plan", "--profile", str(prof), "--cluster", "hosts=4", "--memory-limit", "1MiB"]) == 2
    assert "smallest memory any strategy needs" in capsys.readouterr().err
    out = tmp_path / "plan"
    assert main(["plan", "--profile", str(prof), "--cluster", "hosts=4,nic=1gbit", "--out", str(out)]) == 0
    assert "recommended: polytrain train --strategy" in capsys.readouterr().out
    assert (out / "plan.json").is_file() and list(out.glob("timeline_1_*.png"))


@pytest.mark.parametrize(
    "strategy,sets",
    [
        ("single", []),
        ("allreduce", ["bucket_mb=1"]),
        ("local-sgd", ["period=8"]),
        ("ps", ["servers=2", "sharding=size", "consistency=async"]),
        ("gpipe", ["microbatches=8"]),
        ("1f1b", ["partition=4,4,4,4"]),
        ("zb-h1", ["microbatches=8"]),
        ("zbv", ["microbatches=8"]),
        ("interleaved-1f1b", ["microbatches=4", "virtual_stages=4"]),
        ("pipedream", []),
        ("layerwise", ["partition=params"]),
        ("owt", []),
        ("mesh", ["dp=2", "pp=2"]),
        ("mesh", ["dp=2", "pp=2", "schedule=dualpipev"]),
        ("zero", ["stage=3", "prefetch=1"]),
        ("fsdp", ["reshard_after_forward=false"]),
    ],
)
def test_every_run_is_priced_with_its_own_options(strategy: str, sets: list[str]) -> None:
    from polytrain.config import load_config
    from polytrain.cost.scene import Estimate
    from polytrain.plan.predict import estimate_for

    cfg = load_config(
        None,
        {"strategy": strategy, "model": "vgg16", "dataset": "synthetic-images", "procs": 4},
        ["model.width=8", *sets],
    )
    e = estimate_for(cfg, 1 if strategy == "single" else 4, Scene(vgg_like(), CLUSTER, 64))
    assert isinstance(e, Estimate) and e.step_s > 0 and e.peak_memory_bytes > 0
    if strategy == "1f1b":
        assert e.detail["partition"] == "4,4,4,4"  # the run's own partition, not the planner's
    if strategy == "interleaved-1f1b":  # 4 ranks x 4 chunks, cut uniformly as the run cuts them
        assert e.detail["partition"] == ",".join(["1"] * 16)


def test_options_change_the_estimate() -> None:
    from polytrain.config import load_config
    from polytrain.plan.predict import estimate_for

    scene = Scene(vgg_like(), Cluster.parse("hosts=4,nic=100mbit"), 64)

    def step(strategy: str, *sets: str) -> float:
        cfg = load_config(None, {"strategy": strategy, "procs": 4}, list(sets))
        e = estimate_for(cfg, 4, scene)
        assert not isinstance(e, str)
        return e.step_s

    assert step("local-sgd", "period=16") < step("local-sgd", "period=2")  # fewer averages
    # period 0 averages once, after the last step: its steady step exchanges nothing
    assert step("local-sgd", "period=0") < step("local-sgd", "period=16")
    cfg = load_config(None, {"strategy": "local-sgd", "procs": 4}, ["period=0"])
    e = estimate_for(cfg, 4, scene)
    assert not isinstance(e, str) and e.bytes_per_step == 0
    # layer sharding puts fc1 (3/4 of the bytes) on one server: its link is the bottleneck
    assert step("ps", "servers=2", "sharding=size") < step("ps", "servers=2", "sharding=layer")
    assert step("gpipe", "microbatches=16") < step("gpipe", "microbatches=1")


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


def test_recommendation_learns_exactly_unless_inexact_is_allowed() -> None:
    """On a slow link local-sgd (averaging every 16 steps) and async ps step faster than any exact
    strategy; the recommendation stays exact unless --allow-inexact."""
    from polytrain.config import load_config
    from polytrain.plan.commands import first_choice
    from polytrain.strategies import make_strategy

    ranked = rank(candidates(Scene(vgg_like(), Cluster.parse("hosts=4,nic=1gbit"), 64)))
    cfg = load_config(None, {"strategy": "allreduce", "procs": 4, "model": "vgg16"})
    best = first_choice(ranked, cfg)
    assert best.exact and make_strategy(best.strategy, best.options).is_exact()
    fastest = first_choice(ranked, cfg, inexact=True)
    assert not fastest.exact and ranked.index(fastest) < ranked.index(best)
    marks = {(c.strategy, c.options.get("consistency")): c.exact for c in ranked if c.strategy == "ps"}
    assert marks[("ps", "bsp")] and not marks[("ps", "async")]


def test_the_planner_names_no_strategy_each_prices_itself() -> None:
    """plan/ dispatches on no strategy name: the registry's strategies offer and price themselves."""
    import ast

    from polytrain.strategies import registry

    names = set(registry())
    plan_dir = Path(__file__).resolve().parent.parent / "polytrain" / "plan"
    for path in plan_dir.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                consts = [c.value for c in ast.walk(node) if isinstance(c, ast.Constant)]
                assert not names & set(consts), f"{path.name}:{node.lineno} compares a strategy name"
    priced = {n for n, cls in registry().items() if cls.priced()}
    offered = {c.strategy for c in candidates(Scene(vgg_like(), CLUSTER, 64))}
    assert offered <= priced and "single" in offered


def test_sharding_priced_and_chosen_when_replicas_do_not_fit() -> None:
    """zero stages and fsdp price themselves: memory per rank falls stage by stage as the formulas
    say (Adam: optimizer 2Ψ; stage 2 with units smaller than the model: its transient is a unit's
    gradient and its flat copy), bytes are all-reduce's at stages 1-2 and 1.5x at stage 3; under a
    --memory-limit between allreduce's peak and stage 3's, the fastest fitting exact candidate
    shards (and no replica-holding data-parallel candidate fits)."""
    scene = Scene(gpt_like(), Cluster.parse("hosts=4,nic=10gbit"), 32)
    cands = candidates(scene)
    by = {(c.strategy, tuple(sorted(c.options.items()))): c.estimate for c in cands}
    ar = by[("allreduce", ())]
    z = {s: by[("zero", (("stage", s),))] for s in (1, 2, 3)}
    p, w = gpt_like().param_bytes, 4
    base = ar.peak_memory_bytes - 5 * p  # allreduce: 2Ψ + 2Ψ (Adam) + Ψ of DDP buckets
    assert z[1].peak_memory_bytes == base + int(2 * p + 2 * p / w)
    from polytrain.strategies import make_strategy

    small = make_strategy("zero", {"stage": 2, "bucket_mb": 0.1}).price(scene, w)
    assert not isinstance(small, str)
    assert ar.peak_memory_bytes > z[1].peak_memory_bytes > small.peak_memory_bytes > z[3].peak_memory_bytes
    assert z[1].bytes_per_step == z[2].bytes_per_step == ar.bytes_per_step == 2 * (w - 1) * p
    assert z[3].bytes_per_step == 3 * (w - 1) * p
    assert by[("fsdp", ())].bytes_per_step == z[3].bytes_per_step
    assert by[("zero", (("prefetch", 1), ("stage", 3)))].step_s <= z[3].step_s
    limit = (ar.peak_memory_bytes + z[3].peak_memory_bytes) // 2
    ranked = rank(candidates(scene, memory_limit=limit))
    fitting = [c for c in ranked if c.fits and c.exact]
    assert fitting and fitting[0].strategy in ("zero", "fsdp", "tensor", "gpipe", "1f1b", "zb-h1", "mesh")
    assert not any(c.fits for c in ranked if c.strategy == "allreduce")
    assert any(c.fits for c in ranked if c.strategy == "zero" and c.options["stage"] == 3)


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
