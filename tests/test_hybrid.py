"""Hybrid parallelism, tier 3 (real processes): `owt` and `mesh` equal single-process training of
the same network — per-step losses and parameters — and `owt` moves only the conv gradients and
the activations, not the FC weights. The 6-process `distbelief` run is opt-in (POLYTRAIN_SLOW=1):
it is not one of the issue's oracles and would take a sixth of the family's test budget."""

from __future__ import annotations

from pathlib import Path

import pytest

import polytrain
from polytrain.config import load_config
from polytrain.errors import ConfigError
from polytrain.strategies import make_strategy
from tests.test_model_parallel import assert_same_run
from tests.test_model_parallel_refs import ALEXNET, GPT, MLP, job, single_reference


@pytest.mark.slow
def test_owt_equals_single_with_uneven_splits(tmp_path_factory: pytest.TempPathFactory,
                                             tmp_path: Path) -> None:
    # the batch of 15 splits 8/7 over the conv replicas
    ref = single_reference(tmp_path_factory, ALEXNET)
    out = tmp_path / "owt"
    summary = polytrain.train(strategy="owt", procs=2, out=str(out), **ALEXNET)
    assert_same_run(out, ref)
    m = summary["strategy_metrics"]
    assert m["model_parallel_children"] == ["fc1", "fc2", "fc3"]
    conv, fc = m["conv_parameters"], m["fc_parameters"]
    for rec in summary["per_rank"]:
        ops = rec["bytes_by_op"]
        # only the conv replicas' gradients are all-reduced: ring 2(W-1)/W of them per step
        assert ops["allreduce"] == 3 * conv * 4
        # activations + conv gradients < what allreduce would send for the whole model
        assert ops["allreduce"] + ops["owt_gather"] < 3 * (conv + fc) * 4


def test_owt_refuses_models_it_cannot_cut_before_any_process() -> None:
    """`check` (before the launcher starts anything) accepts conv nets ending in Linear layers and
    refuses, naming the rule: a transformer (its blocks hold several Linears and LayerNorms, its head
    a LayerNorm beside the Linear), a user module that is not an nn.Sequential (one child), and fully
    connected children whose output is not one vector per sample."""
    strategy = make_strategy("owt", {})

    def cfg(model: str, dataset: str) -> object:
        return load_config(overrides={"strategy": "owt", "model": model, "dataset": dataset})

    strategy.check(cfg("cnn", "digits"), 5)  # type: ignore[arg-type]
    strategy.check(cfg("userzoo.factories:make", "digits"), 2)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"last child is not one: a child whose only weights are one "
                                          r"nn.Linear.*tensor for transformer blocks"):
        strategy.check(cfg("gpt-mini", "chars"), 2)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"not an nn.Sequential is one child, which owt cannot cut"):
        strategy.check(cfg("userzoo.resnet:resnet18", "synthetic-images"), 2)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"child 1 \(Linear\) outputs \(8, 10\) per sample"):
        strategy.check(cfg("userzoo.factories:per_row", "digits"), 2)  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.parametrize("layout,extra", [("pp", ()), ("tp", ()), ("pp", ("schedule=zb-h1",))],
                         ids=["pp", "tp", "pp-zb-h1"])
def test_mesh_equals_single(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path,
                            layout: str, extra: tuple[str, ...]) -> None:
    base = MLP if layout == "pp" else GPT
    ref = single_reference(tmp_path_factory, base)
    out = tmp_path / f"mesh-{layout}"
    summary = polytrain.train(strategy="mesh", procs=4, out=str(out),
                              **job(base, "dp=2", f"{layout}=2", *extra))
    assert_same_run(out, ref)
    assert summary["strategy_metrics"]["layout"] == {"dp": 2, "pp": 2 if layout == "pp" else 1,
                                                     "tp": 2 if layout == "tp" else 1,
                                                     "text": f"dp=2 × pp={2 if layout == 'pp' else 1}"
                                                             f" × tp={2 if layout == 'tp' else 1}"}
    inner = "activation" if layout == "pp" else "tp_allreduce"
    for rec in summary["per_rank"]:
        assert rec["bytes_by_op"]["dp_allreduce"] > 0
    assert summary["per_rank"][0]["bytes_by_op"][inner] > 0


@pytest.mark.slow
@pytest.mark.parametrize("schedule,microbatches,optimizer", [
    ("interleaved-1f1b", 2, "sgd"), ("looped-bfs", 4, "adam"), ("zbv", 2, "adam"), ("dualpipev", 4, "sgd"),
])
def test_mesh_with_virtual_stages_equals_single(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path,
                                                schedule: str, microbatches: int, optimizer: str) -> None:
    # dp=2 × pp=2 with V=2 chunks per rank: the mlp's 4 layers cut into 4 one-layer chunks
    base = job(MLP, optimizer=optimizer, lr=0.1 if optimizer == "sgd" else 0.01)
    ref = single_reference(tmp_path_factory, base)
    out = tmp_path / schedule
    summary = polytrain.train(strategy="mesh", procs=4, out=str(out),
                              **job(base, "dp=2", "pp=2", f"schedule={schedule}",
                                    f"microbatches={microbatches}"))
    assert_same_run(out, ref)
    m = summary["strategy_metrics"]
    v_shape = schedule in ("zbv", "dualpipev")
    assert m["chunks_of_rank"] == ([[0, 3], [1, 2]] if v_shape else [[0, 2], [1, 3]])
    for rec in summary["per_rank"]:  # every rank's chunks all-reduced across the two replicas
        assert rec["bytes_by_op"]["dp_allreduce"] > 0


@pytest.mark.slow
def test_distbelief_with_bsp_servers_equals_single(tmp_path_factory: pytest.TempPathFactory,
                                                   tmp_path: Path) -> None:
    # 2 servers (one per stage), then 2 replicas of 2 model-parallel stages
    ref = single_reference(tmp_path_factory, MLP)
    out = tmp_path / "distbelief"
    summary = polytrain.train(strategy="distbelief", procs=6, out=str(out),
                              **job(MLP, "stages=2", "consistency=bsp"))
    assert_same_run(out, ref)
    m = summary["strategy_metrics"]
    assert (m["replicas"], m["stages"], m["staleness_max"]) == (2, 2, 0)
    roles = [r["role"] for r in summary["per_rank"]]
    assert roles == ["server/stage0", "server/stage1", "replica0/stage0", "replica0/stage1",
                     "replica1/stage0", "replica1/stage1"]
    # a stage rank talks to its own stage's server only: it pushes exactly its stage's gradient
    ops = [r["bytes_by_op"] for r in summary["per_rank"]]
    assert ops[2]["ps_push"] == 3 * 4 * m["server_params"][0]
    assert ops[3]["ps_push"] == 3 * 4 * m["server_params"][1]


def test_distbelief_refuses_ranks_that_do_not_form_replicas() -> None:
    cfg = load_config(overrides={"strategy": "distbelief", "model": "mlp", "dataset": "digits"})
    with pytest.raises(ConfigError, match=r"the other 3 of --procs 5 .* --procs 4 \(or 6\)"):
        make_strategy("distbelief", {"stages": 2}).check(cfg, 5)


def test_mesh_refuses_pipeline_options_it_cannot_honour() -> None:
    gpt = load_config(overrides={"strategy": "mesh", "model": "gpt-mini", "dataset": "chars",
                                 "batch_size": 8})
    make_strategy("mesh", {"dp": 2, "tp": 2}).check(gpt, 4)  # defaults: nothing asked
    with pytest.raises(ConfigError, match=r"tp=2 .* microbatches, schedule only apply to dp × pp"):
        make_strategy("mesh", {"dp": 2, "tp": 2, "schedule": "gpipe", "microbatches": 2}).check(gpt, 4)
    mlp = load_config(overrides={"strategy": "mesh", "model": "mlp", "dataset": "digits",
                                 "batch_size": 12})
    make_strategy("mesh", {"dp": 2, "pp": 2, "microbatches": 3}).check(mlp, 4)
    with pytest.raises(ConfigError, match=r"6 samples into 4 equal micro-batches.*divides"):
        make_strategy("mesh", {"dp": 2, "pp": 2, "microbatches": 4}).check(mlp, 4)


@pytest.mark.parametrize("options,match", [
    ({"schedule": "interleaved-1f1b", "depth": 4}, r"5 layers into 2 ranks x 2 .* divide the layers"),
    ({"schedule": "interleaved-1f1b", "microbatches": 3}, r"microbatches=3 on 2 ranks. Rule: .*multiple"),
    ({"schedule": "zbv", "virtual_stages": 4}, r"exactly 2 chunks per rank"),
    ({"schedule": "zb-h1", "virtual_stages": 2}, r"one chunk per rank"),
    ({"schedule": "dualpipev", "partition": "2,1,1"}, r"one layer count per chunk"),
])
def test_mesh_refuses_virtual_stages_it_cannot_cut(options: dict[str, object], match: str) -> None:
    depth = options.pop("depth", 3)
    mlp = load_config(overrides={"strategy": "mesh", "model": "mlp", "dataset": "digits",
                                 "batch_size": 12, "model_options": {"depth": 3}})
    make_strategy("mesh", {"dp": 2, "pp": 2, "schedule": "zbv"}).check(mlp, 4)  # 4 layers, 4 chunks
    mlp = load_config(overrides={"strategy": "mesh", "model": "mlp", "dataset": "digits",
                                 "batch_size": 12, "model_options": {"depth": depth}})
    with pytest.raises(ConfigError, match=match) as err:
        make_strategy("mesh", {"dp": 2, "pp": 2, **options}).check(mlp, 4)
    assert "\n" not in str(err.value)
