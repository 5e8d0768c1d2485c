"""`mesh` dp × pp × tp (Megatron's PTD-P) on 8 local processes equals `single`: 2 replicas of 2
pipeline stages, each stage's gpt-mini block split over 2 tensor ranks. Per-step losses and the
gathered parameters (the user's key names and shapes), with SGD, with Adam + ``--grad-accum 2``
resumed from a checkpoint, and with ``--clip-grad-norm`` (the global norm over stages, shards and
replicas) against torch's own clipping. Tier 1: what 3-D cannot run is refused before launch."""

from __future__ import annotations

from pathlib import Path

import pytest

import polytrain
from polytrain.config import load_config
from polytrain.errors import ConfigError
from polytrain.strategies import make_strategy
from tests.conftest import assert_same_params, load_model, step_losses
from tests.test_model_parallel import assert_same_run
from tests.test_model_parallel_refs import job, single_reference

# 4 layers (embed, 2 blocks, head): uniform stages of (embed, block1) and (block2, head)
GPT2 = {"model": "gpt-mini", "dataset": "chars", "steps": 3, "batch_size": 8, "optimizer": "sgd",
        "lr": 0.1, "seed": 1,
        "sets": ["model.n_layer=2", "model.d_model=32", "model.n_head=4", "data.chars=20000"]}
MESH3D = ("dp=2", "pp=2", "tp=2")


@pytest.mark.slow
@pytest.mark.parametrize("schedule,counts", [("1f1b", [2, 2]), ("zbv", [1, 1, 1, 1])])
def test_mesh_3d_equals_single_sgd(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path,
                                   schedule: str, counts: list[int]) -> None:
    """1F1B, one stage per rank; ZBV, two one-layer chunks per rank in a V (rank 0: embed and
    head, rank 1: the blocks) with the split backward (B, then W)."""
    ref = single_reference(tmp_path_factory, GPT2)
    out = tmp_path / schedule
    summary = polytrain.train(strategy="mesh", procs=8, out=str(out),
                              **job(GPT2, *MESH3D, "microbatches=2", f"schedule={schedule}"))
    assert_same_run(out, ref)
    m = summary["strategy_metrics"]
    assert m["layout"]["text"] == "dp=2 × pp=2 × tp=2"
    assert (m["schedule"], m["microbatches"], m["partition"]["counts"]) == (schedule, 2, counts)
    if schedule == "zbv":  # the head-and-embedding rank shards nothing
        assert m["sharded_parameters"] == 0
        return
    ops = [rec["bytes_by_op"] for rec in summary["per_rank"]]  # rank = (d·2 + s)·2 + t
    for o in ops:  # every rank: its piece across replicas, its stage across its tensor group
        assert o["dp_allreduce"] > 0 and o["tp_allreduce"] > 0
    # the boundary is whole on every shard: tensor rank t of stage 0 sends t's activations to
    # tensor rank t of stage 1 (the same bytes on each), which returns their gradients
    boundary = [o["activation"] for r, o in enumerate(ops) if r // 2 % 2 == 0] + \
               [o["gradient"] for r, o in enumerate(ops) if r // 2 % 2 == 1]
    assert len(set(boundary)) == 1 and boundary[0] > 0


@pytest.mark.slow
def test_mesh_3d_adam_grad_accum_gpipe_resumes_exactly(tmp_path_factory: pytest.TempPathFactory,
                                                       tmp_path: Path) -> None:
    from tests.test_resume_all import _cut_back

    base = job(GPT2, optimizer="adam", lr=0.01, grad_accum=2, steps=4)
    ref = single_reference(tmp_path_factory, base)
    full, part = tmp_path / "full", tmp_path / "part"
    polytrain.train(strategy="mesh", procs=8, out=str(full), checkpoint_every=2,
                    **job(base, *MESH3D, "schedule=gpipe", "collective=ring"))
    ours, theirs = load_model(full), load_model(ref)
    # a key bias's exact gradient is 0 (softmax ignores a shift shared by every key), so Adam moves
    # it by float noise / (noise + eps) alone: ~1e-5 in 4 steps on either side, each run its own
    noise = [k for k in theirs if k.endswith("attn.k.bias")]
    for k in noise:
        assert ours.pop(k).abs().max() < 1e-4 and theirs.pop(k).abs().max() < 1e-4
    assert_same_params(ours, theirs)
    assert step_losses(full) == pytest.approx(step_losses(ref), rel=1e-5, abs=1e-6)
    _cut_back(full, part, 2)
    polytrain.train(resume=part)
    assert_same_params(load_model(part), load_model(full), atol=0, rtol=0)
    assert step_losses(part) == step_losses(full)


@pytest.mark.slow
def test_mesh_3d_clips_by_the_global_norm(tmp_path: Path) -> None:
    """With ``--lr-schedule cosine`` and ``--grad-accum 2`` (4 micro-batches of one row), ZB-H1.
    Stage 1 is the head alone (n_layer=1: 3 layers cut 2/1), replicated over its tensor group;
    the norm counts a shard once per replica and a replicated parameter once per replica and shard."""
    from tests.test_training_runs import GPT, reference

    out = tmp_path / "mesh3d-clip"
    polytrain.train(**(GPT | {"strategy": "mesh", "procs": 8, "out": str(out),
                              "sets": [*MESH3D, "schedule=zb-h1"]}))
    assert_same_params(load_model(out), reference(GPT), atol=1e-6, rtol=1e-5)


def test_mesh_3d_refuses_what_it_cannot_run_before_launch() -> None:
    gpt = load_config(overrides={"strategy": "mesh", "model": "gpt-mini", "dataset": "chars",
                                 "batch_size": 8})
    make_strategy("mesh", {"dp": 2, "pp": 2, "tp": 2}).check(gpt, 8)
    make_strategy("mesh", {"dp": 1, "pp": 2, "tp": 2, "schedule": "gpipe"}).check(gpt, 4)
    make_strategy("mesh", {"dp": 1, "pp": 2, "tp": 2, "schedule": "interleaved-1f1b",
                           "microbatches": 2}).check(gpt, 4)
    one_block = load_config(overrides={"strategy": "mesh", "model": "gpt-mini", "dataset": "chars",
                                       "batch_size": 8, "model_options": {"n_layer": 1}})
    with pytest.raises(ConfigError, match=r"3 layer\(s\) but .* one per stage \(4 stages\)"):
        make_strategy("mesh", {"dp": 1, "pp": 2, "tp": 2, "schedule": "zbv"}).check(one_block, 4)
    with pytest.raises(ConfigError, match=r"compression=fp16 runs on dp × pp and dp × tp only"):
        make_strategy("mesh", {"dp": 2, "pp": 2, "tp": 2, "compression": "fp16"}).check(gpt, 8)
    with pytest.raises(ConfigError, match=r"microbatches divides batch_size / dp"):
        make_strategy("mesh", {"dp": 2, "pp": 2, "tp": 2, "microbatches": 3}).check(gpt, 8)
    with pytest.raises(ConfigError, match=r"splits gpt-mini's 4 attention heads over 8"):
        make_strategy("mesh", {"dp": 1, "pp": 2, "tp": 8}).check(gpt, 16)
    mlp = load_config(overrides={"strategy": "mesh", "model": "mlp", "dataset": "digits"})
    with pytest.raises(ConfigError, match=r"--model mlp has none"):
        make_strategy("mesh", {"dp": 1, "pp": 2, "tp": 2}).check(mlp, 4)


@pytest.mark.slow  # a meta-device profile (its first FlopCounterMode imports torch._dynamo)
def test_every_3d_layout_the_planner_prices_passes_the_pre_launch_check() -> None:
    """The planner's (t, p, d) layouts of a 4-block gpt-mini on 8 ranks, 1F1B and interleaved,
    with the cut it priced pinned: `mesh` accepts each of them as a job."""
    from polytrain.cost.cluster import Cluster
    from polytrain.cost.estimate import Scene
    from polytrain.cost.mesh3d import layouts
    from polytrain.cost.meta_profile import meta_profile

    cfg = load_config(None, {"strategy": "mesh", "model": "gpt-mini", "dataset": "chars",
                             "batch_size": 8},
                      ["model.n_layer=4", "model.n_head=4", "model.d_model=32", "model.seq_len=32",
                       "data.seq_len=32"])
    scene = Scene(meta_profile(cfg), Cluster.parse("hosts=1,procs_per_host=8,device=a100-80gb"), 8)
    three_d = [o for o in layouts(scene) if o["pp"] != 1 and o["tp"] != 1]
    assert {"1f1b", "interleaved-1f1b"} == {o.get("schedule", "1f1b") for o in three_d}
    assert {"dp": 2, "pp": 2, "tp": 2, "microbatches": 2, "partition": "3,3"} in three_d
    for options in three_d:
        make_strategy("mesh", options).check(cfg, 8)
