"""Plans at scale: the device catalogue, meta-device profiles, memory from the parts, 3-D layouts."""

from __future__ import annotations

import json

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
