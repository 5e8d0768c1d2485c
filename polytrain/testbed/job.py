"""``polytrain testbed --hosts N --nic RATE -- train|compare|aco ...``: a job on an emulated cluster.

The command line parses and validates the job (`TestbedJob`) before any host starts; this module
runs it.

Each strategy (or the ant colony) runs under one torchrun agent per emulated host (a real
multi-node rendezvous); rank 0 writes the run directory. Afterwards the testbed's interface
counters are added to the summary (``testbed.wire_bytes_tx``), so polytrain's own byte
accounting can be checked against what really crossed the links.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from polytrain.env import CALIBRATION
from polytrain.errors import ConfigError

if TYPE_CHECKING:  # `polytrain --help` builds this parser: rich loads only when something prints
    from rich.console import Console

HOST_LOGS = "testbed-hosts"  # in the run directory: host i > 0's output (host 0's is the terminal's)
PER_HOST_HELP = "processes per host (default: --procs / hosts, else 1)"


@dataclass(frozen=True)
class Bed:
    """The emulated cluster: ``hosts`` network namespaces with ``nic`` links (`testbed.hosts`)."""

    hosts: int
    nic: str
    latency: str | None = None
    loss: str | None = None


@dataclass(frozen=True)
class TestbedJob:
    """A job the command line has parsed and validated: what runs, where it writes, and the job's
    own flags for every host (``host_args``: the parsed job written back as flags, without the
    world size, run directory and strategy, which the testbed sets per host and per strategy)."""

    command: str  # train | compare | aco
    root: Path
    per_host: int
    host_args: tuple[str, ...]
    strategies: tuple[str, ...] = ()  # train: one; compare: each in turn; aco: none
    report: bool = True  # compare: write report.md
    calibration: Path | None = None  # the runs' predictions are priced with it (`plan.calibration`)


def add_testbed_parser(sub: Any) -> None:
    """``polytrain testbed``'s flags (its job after ``--`` is parsed by the job's own command;
    ``polytrain testbed calibrate`` has its own parser: `plan.calibrate`)."""
    p = sub.add_parser("testbed", help="run a train/compare/aco job on an emulated cluster (root)",
                       usage="polytrain testbed --hosts N --nic RATE [--latency T] [--loss P] "
                             "[--calibration FILE] -- train|compare|aco [options]\n"
                             "       polytrain testbed calibrate --model M [--nic RATE] --out FILE")
    p.add_argument("--hosts", type=int, required=True, help="emulated hosts (network namespaces)")
    p.add_argument("--nic", required=True, help="link rate per host, e.g. 100mbit, 1gbit")
    p.add_argument("--latency", help="one-way delay, e.g. 1ms (needs the kernel's sch_netem)")
    p.add_argument("--loss", help="packet loss, e.g. 0.1%% (needs sch_netem)")
    p.add_argument("--procs-per-host", type=int, help="processes per host (default --procs / hosts)")
    p.add_argument("--calibration", metavar="FILE",
                   help="price the runs (their recorded prediction, --strategy auto) with this file from "
                        "`polytrain testbed calibrate`; default: the testbed's construction only")


def per_host(hosts: int, procs: int | None, procs_per_host: int | None) -> int:
    """Processes per emulated host from ``--procs`` (the job's world) or ``--procs-per-host``."""
    if procs_per_host is not None:
        if procs is not None and procs != hosts * procs_per_host:
            raise ConfigError(
                f"--procs {procs} disagrees with --hosts {hosts} x --procs-per-host {procs_per_host}."
                " Give one of them.")
        return procs_per_host
    if procs is None:
        return 1
    if procs % hosts:
        raise ConfigError(
            f"--procs {procs} must split evenly over --hosts {hosts} (each emulated host runs the same "
            f"number of processes). Use --procs {hosts * max(1, procs // hosts)}.")
    return procs // hosts


def _annotate(run_dir: Path, before: dict[int, dict[str, int]], after: dict[int, dict[str, int]]) -> None:
    path = run_dir / "summary.json"
    if not path.is_file():
        return
    summary = json.loads(path.read_text())
    tb = summary.get("testbed") or {}
    tb["wire_bytes_tx"] = {str(h): after[h]["tx_wire"] - before[h]["tx_wire"] for h in after}
    tb["nic_bytes_tx"] = {str(h): after[h]["tx"] - before[h]["tx"] for h in after}
    summary["testbed"] = tb
    path.write_text(json.dumps(summary, indent=1))


def run_testbed(bed: Bed, job: TestbedJob, console: Console) -> int:
    """Run ``job`` on a testbed of ``bed``'s hosts: each strategy in turn (or the ant colony), one
    torchrun agent per host, the interface counters added to each run's summary."""
    from polytrain.testbed.hosts import Testbed
    from polytrain.testbed.torchrun import run_torchrun

    code = 0
    priced = {CALIBRATION: str(job.calibration)} if job.calibration else None
    with Testbed(bed.hosts, bed.nic, latency=bed.latency, loss=bed.loss) as tb:
        if job.command == "aco":
            before = tb.interface_bytes()
            code = run_torchrun(tb, ["-m", "polytrain", "aco", *job.host_args, "--out", str(job.root)],
                                job.per_host, priced, log_dir=job.root / HOST_LOGS)
            _annotate(job.root, before, tb.interface_bytes())
            return code
        for name in job.strategies:
            out = job.root if job.command == "train" else job.root / name
            before = tb.interface_bytes()
            code = run_torchrun(tb, ["-m", "polytrain", "train", "--strategy", name, *job.host_args,
                                     "--out", str(out)], job.per_host, priced, log_dir=out / HOST_LOGS)
            _annotate(out, before, tb.interface_bytes())
            if code:
                break
    if job.command == "compare" and code == 0:
        from polytrain.report import summary_table, write_report

        summaries = [json.loads((job.root / n / "summary.json").read_text()) for n in job.strategies]
        (job.root / "compare.json").write_text(json.dumps({"strategies": summaries, "target_accuracy": None},
                                                          indent=1))
        console.print(summary_table(summaries, title=f"comparison on the testbed ({bed.hosts} hosts, "
                                                      f"{bed.nic})"))
        if job.report:
            write_report(job.root)
    return code
