"""A described cluster, as validated data: hosts, processes per host, links — hardware only.

``Cluster.parse("hosts=64,procs_per_host=8,nic=100gbit,intra=300gbyte,latency=5us")``:

- ``hosts``, ``procs_per_host``: ranks are numbered host by host (rank r on host r // ppn),
  as torchrun's node ranks place them;
- ``nic``: each host's network link, full duplex, shared by its processes (bits: ``100gbit``,
  or bytes: ``12.5gbyte``; decimal units, per second);
- ``intra``: the link between two processes of one host (shared memory, NVLink: ``300gbyte``);
- ``latency``: α, the fixed cost of one message between hosts (``5us``, ``1ms``);
  ``intra_latency`` the same inside a host (default: a tenth of ``latency``);
- ``device``: the accelerator each process drives, a name from the device catalogue
  (`cost.devices`, ``device=a100-80gb``): its peak FLOP/s and memory bandwidth price a meta-device
  profile, and its intra-host link (NVLink) is ``intra`` unless that is given;
- ``collectives``: the all-reduce algorithms the collective library chooses among: ``auto`` (default:
  the fastest of ring, tree and two-level, as NCCL picks) or ``ring`` (gloo, whose all-reduce is
  always a ring: 2(n−1) steps whatever the size; polytrain's CPU runs and the testbed);
What an emulated cluster adds to its hardware — ranks sharing one machine's cores, a shaped link's
bucket, the collective library's own time per call and per step, a waiting rank's late wake-up —
is not hardware: it is a calibration (`plan.calibration`), given to the planner with
``--calibration FILE``.

Errors name the field, the value and the fix.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any

from polytrain.cost.devices import Device, get_device
from polytrain.errors import ConfigError

_NUM = r"(\d+(?:\.\d*)?(?:e[+-]?\d+)?)"
_RATE_RE = re.compile(rf"^{_NUM}\s*([kmgt]?)(bit|byte|b)?(?:/s|ps)?$", re.IGNORECASE)
_TIME_RE = re.compile(rf"^{_NUM}\s*(ns|us|µs|ms|s)$", re.IGNORECASE)
_SCALE = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0}
FIELDS = ("hosts", "procs_per_host", "nic", "intra", "latency", "intra_latency", "collectives", "device")
# what an emulator needs, not hardware: a calibration file holds them (`plan.calibration`)
CALIBRATED = ("cores", "burst", "call", "hop", "direct_hop", "wake")
COLLECTIVES = ("auto", "ring")
MAX_WORLD = 1 << 17  # 131,072 processes: beyond today's largest jobs; 1e9 hosts hung the planner
EXAMPLE = "hosts=64,procs_per_host=8,nic=100gbit,intra=300gbyte,latency=5us"


def parse_rate(text: str, field: str) -> float:
    """``"100gbit"`` -> 12.5e9 bytes/s; ``"300gbyte"`` -> 3e11 bytes/s (decimal units)."""
    m = _RATE_RE.match(text.strip())
    if m is None or m[3] is None or float(m[1]) <= 0:
        raise ConfigError(
            f"--cluster field '{field}' is '{text}'. Rule: a positive rate with a unit, bits "
            f"(kbit, mbit, gbit, tbit) or bytes (kbyte, mbyte, gbyte) per second. Fix: e.g. "
            f"{field}=100gbit or {field}=300gbyte."
        )
    per_unit = 1 / 8 if m[3].lower() == "bit" else 1.0  # 'b' alone reads as bytes (GB/s)
    rate = float(m[1]) * _SCALE[m[2].lower()] * per_unit
    if not math.isfinite(rate):
        raise ConfigError(f"--cluster field '{field}' is '{text}', which is not a finite rate. "
                          f"Fix: e.g. {field}=100gbit.")
    return rate


def parse_seconds(text: str, field: str) -> float:
    """``"5us"`` -> 5e-6."""
    m = _TIME_RE.match(text.strip())
    if m is None:
        raise ConfigError(
            f"--cluster field '{field}' is '{text}'. Rule: a time with a unit (ns, us, ms, s). "
            f"Fix: e.g. {field}=5us."
        )
    return float(m[1]) * _SECONDS[m[2].lower()]


def _whole(text: str, field: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise ConfigError(
            f"--cluster field '{field}' is '{text}'. Rule: a whole number >= 1. Fix: e.g. {field}=8."
        )
    return int(text)


@dataclass(frozen=True)
class Cluster:
    """Bandwidths in bytes/s, latencies in seconds (see the module docstring). The properties after
    the fields are what an emulated cluster adds (`plan.calibration.EmulatedCluster`); on hardware
    they are nothing: no shared cores, no shaper's bucket, no time beyond α–β per message."""

    hosts: int = 1
    procs_per_host: int = 1
    nic_bps: float = 10e9 / 8
    intra_bps: float = 10e9
    latency_s: float = 5e-6
    intra_latency_s: float | None = None
    collectives: str = "auto"  # all-reduce algorithms: "auto" (NCCL's choice) or "ring" (gloo's only)
    device: str = ""  # a name from the device catalogue (`cost.devices`); "": unnamed (profiled times)

    def __post_init__(self) -> None:
        if self.device:
            get_device(self.device)
        if self.collectives not in COLLECTIVES:
            raise ConfigError(
                f"--cluster field 'collectives' is '{self.collectives}'. Rule: one of "
                f"{', '.join(COLLECTIVES)} (ring: gloo's all-reduce; auto: NCCL's choice of ring, tree "
                f"or two-level). Fix: e.g. collectives=ring."
            )

    @property
    def accelerator(self) -> Device | None:
        """The catalogue's entry for ``device``, None where the cluster names none."""
        return get_device(self.device) if self.device else None

    @property
    def world(self) -> int:
        return self.hosts * self.procs_per_host

    @property
    def intra_alpha(self) -> float:
        return self.latency_s / 10 if self.intra_latency_s is None else self.intra_latency_s

    @property
    def cores(self) -> float | None:
        """Cores ALL ranks share (an emulated cluster); None: every rank has its own device."""
        return None

    @property
    def burst_bytes(self) -> float:
        """Bytes a shaped NIC passes at line speed after an idle spell; 0: a plain link."""
        return 0.0

    @property
    def call_s(self) -> float:
        """A rank's own time per collective call beyond its messages (see cost.network)."""
        return 0.0

    @property
    def hop_s(self) -> float:
        """A rank's own time per step of a collective beyond α (see cost.network)."""
        return 0.0

    @property
    def direct_hop(self) -> float:
        """The same per message of a direct exchange (all in flight at once)."""
        return self.hop_s

    @property
    def wake_s(self) -> float:
        """On shared cores, how late a blocked receiver is woken (see cost.simulate)."""
        return 0.0

    def refilled(self, burst_bytes: float) -> Cluster:
        """This cluster with its shaped links' bucket at ``burst_bytes`` (a plain link has none)."""
        return self

    def host_of(self, rank: int) -> int:
        return rank // self.procs_per_host

    def with_hosts(self, hosts: int) -> Cluster:
        return replace(self, hosts=hosts)

    def contention(self, busy_ranks: float) -> float:
        """Compute slowdown when ``busy_ranks`` ranks compute at once (1 unless cores are shared)."""
        if self.cores is None:
            return 1.0
        return max(1.0, busy_ranks / self.cores)

    def describe(self) -> str:
        ring = ", ring all-reduce only" if self.collectives == "ring" else ""
        device = f" {self.device}" if self.device else ""
        return (
            f"{self.hosts} host(s) x {self.procs_per_host}{device} proc(s), NIC {self.nic_bps * 8 / 1e9:g} "
            f"Gbit/s, intra {self.intra_bps / 1e9:g} GB/s, latency {self.latency_s * 1e6:g} us{ring}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "hosts": self.hosts,
            "procs_per_host": self.procs_per_host,
            "nic_bytes_per_s": self.nic_bps,
            "intra_bytes_per_s": self.intra_bps,
            "latency_s": self.latency_s,
            "intra_latency_s": self.intra_alpha,
            "collectives": self.collectives,
            "device": self.device or None,
        }

    @classmethod
    def parse(cls, text: str) -> Cluster:
        """Read ``key=value,...`` (fields in the module docstring); unknown or bad fields raise."""
        values: dict[str, Any] = {}
        if not text.strip():
            raise ConfigError(f'--cluster is empty. Fix: describe the cluster, e.g. --cluster "{EXAMPLE}", '
                              "or leave --cluster out.")
        for item in (t for t in text.split(",") if t.strip()):
            key, eq, value = item.partition("=")
            key = key.strip().replace("-", "_")
            if eq and key in CALIBRATED:
                raise ConfigError(
                    f"--cluster field '{key}' is not hardware: it is what an emulated cluster adds, "
                    f"measured into a calibration file. Fix: drop '{item.strip()}' and pass "
                    f"--calibration FILE (docs/planner.md, Calibration).")
            if not eq or key not in FIELDS:
                raise ConfigError(
                    f"--cluster item '{item.strip()}' is not one of the fields "
                    f'{", ".join(FIELDS)} written as key=value. Fix: e.g. --cluster "{EXAMPLE}".'
                )
            if key in values:
                raise ConfigError(f"--cluster gives '{key}' twice ({values[key]} and {value.strip()}). "
                                  f"Fix: give each field once.")
            values[key] = value.strip()
        out: dict[str, Any] = {}
        for key in ("hosts", "procs_per_host"):
            if key in values:
                out[key] = _whole(values[key], key)
        if "nic" in values:
            out["nic_bps"] = parse_rate(values["nic"], "nic")
        if "intra" in values:
            out["intra_bps"] = parse_rate(values["intra"], "intra")
        if "latency" in values:
            out["latency_s"] = parse_seconds(values["latency"], "latency")
        if "intra_latency" in values:
            out["intra_latency_s"] = parse_seconds(values["intra_latency"], "intra_latency")
        if "collectives" in values:
            out["collectives"] = values["collectives"].lower()
        if "device" in values:
            dev = get_device(values["device"])
            out["device"] = dev.name
            out.setdefault("intra_bps", dev.link_bytes_per_s)
        world = out.get("hosts", 1) * out.get("procs_per_host", 1)
        if world > MAX_WORLD:
            raise ConfigError(f"--cluster describes {world:,} processes; the planner models at most "
                              f"{MAX_WORLD:,} (it simulates collectives per rank). Fix: fewer "
                              "hosts or procs_per_host.")
        return cls(**out)


def parse_bytes(text: str, field: str = "--memory-limit") -> int:
    """``"16GiB"`` -> 17179869184; ``"500MB"`` -> 5e8; a plain number is bytes."""
    m = re.match(r"^\s*(\d+(?:\.\d*)?)\s*([kmgt]?)(i?)b?\s*$", text, re.IGNORECASE)
    if m is None or float(m[1]) <= 0:
        raise ConfigError(
            f"{field} is '{text}'. Rule: a positive size such as 16GiB, 500MB or 2000000000 (bytes). "
            f"Fix: e.g. {field} 16GiB."
        )
    base = 1024.0 if m[3] else 1000.0
    power = "kmgt".find(m[2].lower()) + 1 if m[2] else 0
    return int(float(m[1]) * base**power)
