"""Plans at scale: the device catalogue, meta-device profiles, memory from the parts, 3-D layouts."""

from __future__ import annotations

import json
from typing import Any

import pytest

from polytrain.errors import ConfigError
from polytrain.plan.cluster import Cluster
from polytrain.plan.devices import CATALOGUE, catalogue, get_device


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


def _gpt(layers: int = 2, d: int = 64, heads: int = 4, seq: int = 32, vocab: int = 300, batch: int = 2) -> Any:
    from polytrain.config import load_config

    sets = [f"model.n_layer={layers}", f"model.d_model={d}", f"model.n_head={heads}",
            f"model.seq_len={seq}", f"model.vocab={vocab}"]
    return load_config(None, {"model": "gpt-mini", "dataset": "chars", "batch_size": batch}, sets)


@pytest.mark.slow  # the first FlopCounterMode of a process imports torch._dynamo (~10-20 s)
def test_meta_profile_flops_are_the_hand_formula() -> None:
    """Forward: 2 x (matrix parameters) x tokens + the causal attention's 4·s²·h per block
    (counted as full attention), the LM head 2·s·h·V; backward: twice the forward."""
    from polytrain.plan.meta import meta_profile

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
