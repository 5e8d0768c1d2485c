"""Tier 1: the recommender on synthetic profiles (no measuring): candidates, ranking, limits, speed."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from polytrain.cli import main
from polytrain.cost.cluster import Cluster
from polytrain.cost.profile import LayerRecord, Profile
from polytrain.cost.scene import Scene
from polytrain.errors import ConfigError
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
