"""The device catalogue (`devices.json` beside this file): what the planner knows of an accelerator.

Each entry: peak dense FLOP/s per precision, memory capacity and bandwidth, the intra-host link,
and the vendor datasheet every figure comes from. ``--cluster ...,device=a100-80gb`` selects one;
the cost model then prices a meta-device profile's FLOPs and bytes on it (`cost.estimate.Scene`).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polytrain.errors import ConfigError

CATALOGUE = Path(__file__).with_name("devices.json")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


@dataclass(frozen=True)
class Device:
    name: str
    description: str
    flops: dict[str, float]  # peak dense FLOP/s per precision
    memory_bytes: float
    memory_bytes_per_s: float
    link: str
    link_bytes_per_s: float  # one direction of the intra-host link
    source: str

    def peak(self, precision: str) -> float:
        """Peak dense FLOP/s of matrix work at ``precision`` (fp32 training runs tf32-free: fp32)."""
        return self.flops[precision]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "flops": self.flops, "memory_bytes": self.memory_bytes,
                "memory_bytes_per_s": self.memory_bytes_per_s, "link_bytes_per_s": self.link_bytes_per_s}


@functools.cache
def catalogue() -> dict[str, Device]:
    data = json.loads(CATALOGUE.read_text())
    return {name: Device(name, d["description"], dict(d["flops"]), float(d["memory_bytes"]),
                         float(d["memory_bytes_per_s"]), d["link"], float(d["link_bytes_per_s"]),
                         d["source"])
            for name, d in data["devices"].items()}


def get_device(name: str) -> Device:
    """The catalogue's entry ``name``; an unknown name is refused with the valid ones."""
    devices = catalogue()
    key = name.strip().lower()
    if key not in devices:
        raise ConfigError(f"--cluster field 'device' is '{name}', which is not in the device catalogue. "
                          f"Rule: one of {', '.join(devices)}. Fix: e.g. device=a100-80gb.")
    return devices[key]
