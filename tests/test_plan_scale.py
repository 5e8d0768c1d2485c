"""Plans at scale: the device catalogue, meta-device profiles, memory from the parts, 3-D layouts."""

from __future__ import annotations

import json
from typing import Any

import pytest

from polytrain.cost.cluster import Cluster
from polytrain.cost.devices import CATALOGUE, catalogue, get_device
from polytrain.errors import ConfigError


def test_catalogue_entries_have_sources_and_are_selected_by_cluster() -> None:
    data = json.loads(CATALOGUE.read_text())["devices"]
    assert {"a100-40gb", "a100-80gb", "h100-80gb", "h200"} <= set(data)
    assert any(name.startswith("cpu") for name in data)
    for name, dev in catalogue().items():
        assert "http" in dev.source or "datasheet" in dev.source, name
        assert dev.peak("bf16") >= dev.peak("fp32") > 0 and dev.memory_bytes > 0
    assert get_device("a100-80gb").peak("bf16") == 312e12
    assert get_device("a100-40gb").memory_bytes == 40e9
    c = Cluster.parse("hosts=2,procs_per_host=8,device=a100-80gb")
    assert c.accelerator is not None and c.accelerator.memory_bytes == 80e9
    assert c.intra_bps == get_device("a100-80gb").link_bytes_per_s  # NVLink unless intra is given
    assert Cluster.parse("device=h100-80gb,intra=100gbyte").intra_bps == 100e9


def test_unknown_device_is_refused_in_one_line_naming_the_valid_ones() -> None:
    with pytest.raises(ConfigError) as err:
        Cluster.parse("hosts=2,device=v100")
    text = str(err.value)
    assert "\n" not in text and "'v100'" in text
    assert all(name in text for name in catalogue())


def _gpt(layers: int = 2, d: int = 64, heads: int = 4, seq: int = 32, vocab: int = 300,
         batch: int = 2) -> Any:
    from polytrain.config import load_config

    sets = [f"model.n_layer={layers}", f"model.d_model={d}", f"model.n_head={heads}",
            f"model.seq_len={seq}", f"model.vocab={vocab}"]
    return load_config(None, {"model": "gpt-mini", "dataset": "chars", "batch_size": batch}, sets)


@pytest.mark.slow  # the first FlopCounterMode of a process imports torch._dynamo (~10-20 s)
def test_meta_profile_flops_are_the_hand_formula() -> None:
    """Forward: 2 x (matrix parameters) x tokens + the causal attention's 4·s²·h per block
    (counted as full attention), the LM head 2·s·h·V; backward: twice the forward."""
    from polytrain.cost.meta_profile import meta_profile

    L, d, s, V, B = 3, 64, 32, 300, 2
    prof = meta_profile(_gpt(L, d, 4, s, V, B))
    assert prof.device == "meta" and [r.kind for r in prof.layers] == ["Embed", *["Block"] * L, "Head"]
    block = 2 * 12 * d * d * B * s + 4 * B * s * s * d
    assert [r.forward_flops for r in prof.layers] == [0.0, *[block] * L, 2 * B * s * d * V]
    for r in prof.layers[1:]:
        assert r.backward_flops == pytest.approx(2 * r.forward_flops, rel=1e-9)
    params = sum(r.param_bytes for r in prof.layers) / 4
    assert params == (V + s) * d + L * (12 * d * d + 13 * d) + 2 * d + d * V
    assert all(r.forward_bytes > 0 for r in prof.layers[1:])  # layer norms, GELU, adds


def _printed_tolerance(value: float) -> float:
    """Half a unit of the last digit the table prints (0.12 -> 0.005; 4046 -> 0.5)."""
    text = repr(float(value)).rstrip("0").rstrip(".")
    decimals = len(text.split(".")[1]) if "." in text else 0
    return 0.5 * 10 ** -decimals


def test_zero_memory_formulas_reproduce_the_zero_papers_table() -> None:
    """Rajbhandari et al. 2020, Table 1 (benchmarks/plan_published_data.json): within 1 % or,
    where the paper rounds harder (0.12 GB for 0.117), within its printed digits."""
    from pathlib import Path

    from polytrain.cost.memory import state_bytes, zero_bytes

    data = json.loads((Path(__file__).resolve().parent.parent / "benchmarks" /
                       "plan_published_data.json").read_text())["zero"]["rows"]
    assert len(data) == 54
    adam = state_bytes("bf16", 2)
    assert (adam.param, adam.grad, adam.optimizer) == (2, 2, 12)
    for params_b, dp, stage, gb in data:
        ours = zero_bytes(params_b * 1e9, dp, stage, adam) / 1e9
        assert abs(ours - gb) <= max(0.01 * gb, _printed_tolerance(gb)), (params_b, dp, stage, ours, gb)
    assert state_bytes("fp32", 2).total == 16 and state_bytes("fp32", 0).total == 8


def test_megatron_table2_transcription_agrees_with_the_papers_equations() -> None:
    """Narayanan et al. 2021, Table 2 (benchmarks/plan_published_data.json "zero3"): eq. (2) gives
    each model's parameter count from its shape, the days for 300B tokens follow eq. (4) (8TP/(nX),
    an approximation the paper's own days exceed by a few per cent), every ZeRO-3 row runs one
    micro-batch per step on data parallelism alone, and PTD-P's t·p divides the GPUs."""
    from pathlib import Path

    data = json.loads((Path(__file__).resolve().parent.parent / "benchmarks" /
                       "plan_published_data.json").read_text())["zero3"]
    rows = [dict(zip(data["columns"], r, strict=True)) for r in data["rows"]]
    assert len(rows) == 12
    for r in rows:
        n, h = r["layers"], r["hidden"]
        params = 12 * n * h * h * (1 + 13 / (12 * h) + (51200 + 2048) / (12 * n * h))
        assert abs(params / 1e9 - r["params_b"]) < 0.05, r
        days = 8 * 300e9 * params / (r["gpus"] * r["tflops_per_gpu"] * 1e12) / 86400
        assert 0 < r["days_300b_tokens"] / days - 1 < 0.04, r
        if r["scheme"] == "zero3":
            assert r["model_parallel"] == 1 and r["batch"] == r["gpus"] * r["micro_batch"], r
        else:
            assert r["gpus"] % r["model_parallel"] == 0 and r["model_parallel"] % 8 == 0, r


def test_transformer_activations_follow_korthikanti() -> None:
    from polytrain.cost.memory import transformer_activation_bytes as act

    s, b, h, a = 2048, 1, 12288, 96
    assert act(s, b, h, a) == s * b * h * (34 + 5 * a * s / h)
    assert act(s, b, h, a, tp=8) == s * b * h * (10 + 24 / 8 + 5 * a * s / (h * 8))
    assert act(s, b, h, a, recompute=True) == 2 * s * b * h
    assert act(s, b, h, a, element=4) == 2 * act(s, b, h, a)


@pytest.mark.slow  # a meta profile of a 175B GPT: ~15-30 s
def test_a_175b_gpt_plans_on_an_a100_cluster_and_ranks_3d_layouts(tmp_path: Any) -> None:
    from polytrain.cli import main
    from polytrain.cost.meta_profile import meta_profile
    from polytrain.cost.scene import Scene
    from polytrain.plan.recommend import candidates, rank

    prof = meta_profile(_gpt(96, 12288, 96, 2048, 51200, 1))
    assert 174e9 < prof.param_bytes / 4 < 176e9
    path = tmp_path / "gpt175b.json"
    prof.save(path)
    cluster = Cluster.parse("hosts=192,procs_per_host=8,device=a100-80gb,nic=1600gbit,latency=5us")
    ranked = rank(candidates(Scene(prof, cluster, 1536, precision="bf16", recompute=True),
                             int(80e9)))
    meshes = [c for c in ranked if c.strategy == "mesh" and c.fits]
    assert any(c.options["tp"] > 1 and c.options["pp"] > 1 for c in meshes[:5])
    e = next(c for c in meshes if (c.options["tp"], c.options["pp"], c.options["dp"]) == (8, 8, 24))
    assert 0 < e.estimate.peak_memory_bytes < 80e9
    # one layout priced as given, the ranked table printed with memory per rank
    base = ["plan", "--profile", str(path), "--cluster",
            "hosts=192,procs_per_host=8,device=a100-80gb,nic=1600gbit,latency=5us",
            "--batch-size", "1536", "--precision", "bf16", "--activation-checkpointing"]
    assert main([*base, "--strategy", "mesh", "--set", "tp=8", "--set", "pp=8", "--set", "dp=24",
                 "--set", "microbatches=64", "--json"]) == 0
    assert main([*base, "--out", str(tmp_path / "plan")]) == 0
    rows = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert rows[0]["peak_memory_bytes"] <= 80e9 and len(rows) > 100
