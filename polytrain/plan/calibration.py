"""A calibration: what an emulated cluster adds to its hardware, and what a model's steps cost
beyond their profile on one machine — measured, kept as data, given with ``--calibration FILE``.

A `Cluster` is hardware (hosts, links, latency). Running a cluster's ranks on one machine — the
testbed's network namespaces — adds effects no hardware description has: every rank shares this
machine's cores, a token-bucket shaper lets a burst through at line speed after an idle spell, the
collective library's process is woken at every step of a collective, a blocked receiver is woken
late when other messages share the wire. A real cluster has none of them; the planner's plain
physical model leaves them out. A calibration file holds them, with the per-model terms a step
pays beyond its profiled compute (a compute scale, the runtimes' own time per action or pass, a
parameter server's time per request), and where each figure came from::

    {"schema": "polytrain.calibration/1",
     "source": {"command": "...", "commit": "...", "date": "...", "machine": "..."},
     "emulation": {"cores": 2, "burst_s": 0.004, "min_burst_bytes": 3028, "goodput": 0.956,
                   "call_s": 0.0015, "hop_s": 0.0013, "direct_hop_s": 0.0009, "wake_s": 0.001},
     "models": {"cnn": {"compute_scale": 1.2, "action_overhead_s": 0.0002}}}

Every field is optional but ``schema``; a field left out is the physical model's value (nothing).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from polytrain.cost.cluster import Cluster
from polytrain.cost.profile import Profile
from polytrain.cost.scene import Scene
from polytrain.errors import ConfigError, validation_parts

SCHEMA = "polytrain.calibration/1"


@dataclass(frozen=True)
class Emulation:
    """What an emulated cluster adds to its hardware, resolved for one cluster's links."""

    cores: float | None = None  # cores ALL ranks share
    burst_bytes: float = 0.0  # a shaped NIC's bucket: payload bytes at line speed after an idle spell
    call_s: float = 0.0  # a rank's own time per collective call, beyond its messages (cost.network)
    hop_s: float = 0.0  # a rank's own time per step of a collective, beyond α (cost.network)
    direct_hop_s: float | None = None  # the same per message of a direct exchange; None: hop_s
    wake_s: float = 0.0  # on shared cores, a blocked receiver's late wake-up (cost.simulate)

    def __post_init__(self) -> None:
        if self.wake_s and self.cores is None:
            raise ConfigError(
                f"a calibration's wake_s is {self.wake_s * 1e3:g} ms with no cores. Rule: a waiting "
                "rank is woken late only where all ranks share cores. Fix: give cores or drop wake_s.")


@dataclass(frozen=True)
class EmulatedCluster(Cluster):
    """A cluster emulated on one machine: its hardware and what the emulation adds to it."""

    emulation: Emulation = Emulation()

    @property
    def cores(self) -> float | None:
        return self.emulation.cores

    @property
    def burst_bytes(self) -> float:
        return self.emulation.burst_bytes

    @property
    def call_s(self) -> float:
        return self.emulation.call_s

    @property
    def hop_s(self) -> float:
        return self.emulation.hop_s

    @property
    def direct_hop(self) -> float:
        d = self.emulation.direct_hop_s
        return self.hop_s if d is None else d

    @property
    def wake_s(self) -> float:
        return self.emulation.wake_s

    def refilled(self, burst_bytes: float) -> Cluster:
        return replace(self, emulation=replace(self.emulation, burst_bytes=burst_bytes))

    def describe(self) -> str:
        e = self.emulation
        parts = [f"{e.cores:g} shared cores"] if e.cores else []
        parts += [f"{e.call_s * 1e3:g} ms per collective call"] if e.call_s else []
        parts += [f"{e.hop_s * 1e3:g} ms per collective step"] if e.hop_s else []
        parts += [f"{e.direct_hop_s * 1e3:g} ms per direct message"] if e.direct_hop_s is not None else []
        parts += [f"{e.wake_s * 1e3:g} ms to wake a waiting rank"] if e.wake_s else []
        return super().describe() + "".join(f", {p}" for p in parts)

    def to_json(self) -> dict[str, Any]:
        e = self.emulation
        return {**super().to_json(), "emulation": {
            "cores": e.cores, "burst_bytes": e.burst_bytes, "call_s": e.call_s, "hop_s": e.hop_s,
            "direct_hop_s": self.direct_hop, "wake_s": e.wake_s}}


def emulate(cluster: Cluster, **emulation: Any) -> EmulatedCluster:
    """``cluster``'s hardware with ``emulation``'s fields (`Emulation`) added to what it emulates."""
    hardware = {f.name: getattr(cluster, f.name) for f in fields(Cluster)}
    base = cluster.emulation if isinstance(cluster, EmulatedCluster) else Emulation()
    return EmulatedCluster(**hardware, emulation=replace(base, **emulation))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _finite(v: float | None) -> float | None:
    if v is not None and (not math.isfinite(v) or v < 0):
        raise ValueError("must be a finite number >= 0")
    return v


class EmulationFile(_Strict):
    """The ``emulation`` part of a calibration file (per cluster it becomes an `Emulation`)."""

    cores: float | None = Field(default=None, gt=0)
    burst_s: float = 0.0  # the shaper's bucket in seconds of its line rate
    min_burst_bytes: float = 0.0  # ... and at least this many (frame) bytes
    goodput: float = Field(default=1.0, gt=0, le=1)  # the share of a shaped link's rate that carries payload
    call_s: float = 0.0
    hop_s: float = 0.0
    direct_hop_s: float | None = None
    wake_s: float = 0.0

    _check = field_validator("burst_s", "min_burst_bytes", "call_s", "hop_s", "direct_hop_s",
                             "wake_s")(_finite)


class ModelTerms(_Strict):
    """What one model's steps cost beyond its profile on the calibrated machine (`cost.estimate.Scene`)."""

    compute_scale: float = Field(default=1.0, gt=0)  # measured compute over the profile's
    forward_scale: float | None = Field(default=None, gt=0)  # the forward's own, where it differs
    action_overhead_s: float = 0.0  # the pipeline executor's own time per action
    pass_overhead_s: float = 0.0  # the other runtimes' own time per forward or backward pass
    ps_request_s: float = 0.0  # a parameter server's own time per worker request

    _check = field_validator("action_overhead_s", "pass_overhead_s", "ps_request_s")(_finite)


class Calibration(_Strict):
    """A calibration file's content (module docstring)."""

    schema_: str = Field(alias="schema")
    source: dict[str, Any] = Field(default_factory=dict)
    emulation: EmulationFile | None = None
    models: dict[str, ModelTerms] = Field(default_factory=dict)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("schema_")
    @classmethod
    def _schema(cls, v: str) -> str:
        if v != SCHEMA:
            raise ValueError(f"is '{v}'; this polytrain reads '{SCHEMA}'")
        return v

    @classmethod
    def load(cls, path: Path) -> Calibration:
        """Read and validate ``path``; one line naming the file, the field and the fix otherwise."""
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"--calibration {path}: no such file. Fix: give the path of a "
                              "calibration file (docs/planner.md, Calibration).") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ConfigError(f"--calibration {path} is not a JSON calibration file ({e}). Fix: "
                              "give a calibration file (docs/planner.md, Calibration).") from None
        if not isinstance(data, dict):
            raise ConfigError(f"--calibration {path} holds {type(data).__name__}, not an object with "
                              f"\"schema\": \"{SCHEMA}\". Fix: give a calibration file.")
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            why = "; ".join(validation_parts(e, ("schema", *cls.model_fields), "field"))
            raise ConfigError(f"--calibration {path}: {why}. Fix: correct it (the fields are in "
                              "docs/planner.md, 'Calibration').") from None

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.model_dump(by_alias=True, exclude_none=True), indent=1) + "\n")

    def cluster(self, hardware: Cluster) -> Cluster:
        """``hardware`` as this calibration's emulator runs it (itself with no ``emulation``)."""
        e = self.emulation
        if e is None:
            return hardware
        nic = hardware.nic_bps * e.goodput  # what the shaped rate carries of payload
        burst = max(e.min_burst_bytes, hardware.nic_bps * e.burst_s) * e.goodput
        return emulate(replace(hardware, nic_bps=nic), cores=e.cores, burst_bytes=burst,
                       call_s=e.call_s, hop_s=e.hop_s, direct_hop_s=e.direct_hop_s, wake_s=e.wake_s)

    def terms(self, model: str) -> ModelTerms:
        """``model``'s terms (the physical model's, all nothing, for a model it does not name)."""
        return self.models.get(model, ModelTerms())

    def scene(self, profile: Profile, hardware: Cluster, batch: int, scale: float = 1.0,
              **job: Any) -> Scene:
        """What the planner prices: ``profile`` at ``batch`` on ``hardware`` as this calibration
        runs it (its emulation, the model's terms; ``scale`` multiplies the compute on top;
        ``job``: the training flags the scene prices, e.g. ``precision``)."""
        t = self.terms(profile.model)
        forward = None if t.forward_scale is None else t.forward_scale * scale
        return Scene(profile, self.cluster(hardware), batch, t.compute_scale * scale, t.action_overhead_s,
                     t.pass_overhead_s, forward, t.ps_request_s, **job)


PHYSICAL = Calibration(schema=SCHEMA)  # no calibration: the plain physical model
