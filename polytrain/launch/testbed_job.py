"""``polytrain testbed --hosts N --nic RATE -- train|compare|aco ...``: a job on an emulated cluster.

Each strategy (or the ant colony) runs under one torchrun agent per emulated host (a real
multi-node rendezvous); rank 0 writes the run directory. Afterwards the testbed's interface
counters are added to the summary (``testbed.wire_bytes_tx``), so polytrain's own byte
accounting can be checked against what really crossed the links.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.console import Console

from polytrain.errors import ConfigError

HOST_LOGS = "testbed-hosts"  # in the run directory: host i > 0's output (host 0's is the terminal's)
PER_HOST_HELP = "processes per host (default: --procs / hosts, else 1)"


def _take(args: list[str], flag: str) -> str | None:
    """The value of ``flag`` in ``args`` (``--flag V`` or ``--flag=V``), if present."""
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def _without(args: list[str], flag: str) -> list[str]:
    out, skip = [], False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a == flag and i + 1 < len(args):
            skip = True
            continue
        if a.startswith(flag + "="):
            continue
        out.append(a)
    return out


def per_host(hosts: int, job_args: list[str], procs_per_host: int | None) -> int:
    procs = _take(job_args, "--procs")
    if procs_per_host is not None:
        if procs is not None and int(procs) != hosts * procs_per_host:
            raise ConfigError(
                f"--procs {procs} disagrees with --hosts {hosts} x --procs-per-host {procs_per_host}."
                " Give one of them.")
        return procs_per_host
    if procs is None:
        return 1
    if int(procs) % hosts:
        raise ConfigError(
            f"--procs {procs} must split evenly over --hosts {hosts} (each emulated host runs the same "
            f"number of processes). Use --procs {hosts * max(1, int(procs) // hosts)}.")
    return int(procs) // hosts


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


def run_testbed(hosts: int, nic: str, latency: str | None, loss: str | None,
                procs_per_host: int | None, job: list[str], console: Console) -> int:
    from polytrain.launch.testbed import Testbed
    from polytrain.launch.testbed_torchrun import run_torchrun

    if not job or job[0] not in ("train", "compare", "aco"):
        raise ConfigError(
            "polytrain testbed runs a train, compare or aco job after '--', e.g. "
            "polytrain testbed --hosts 4 --nic 1gbit -- train --strategy allreduce --procs 4")
    command, args = job[0], job[1:]
    nper = per_host(hosts, args, procs_per_host)
    args = _without(args, "--procs")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if command == "aco":
        return _run_aco(hosts, nic, latency, loss, nper, args, stamp)
    if command == "train":
        strategies = [_take(args, "--strategy") or "allreduce"]
    else:
        names = _take(args, "--strategies")
        if not names:
            raise ConfigError("compare needs --strategies a,b,c")
        strategies = [s.strip() for s in names.split(",") if s.strip()]
        args = _without(_without(args, "--strategies"), "--target-accuracy")
    root = Path(_take(args, "--out") or f"runs/{stamp}-testbed-{command}")
    args = _without(_without(args, "--out"), "--strategy")
    _check_job(strategies, args, hosts, hosts * nper)
    code = 0
    with Testbed(hosts, nic, latency=latency, loss=loss) as tb:
        for name in strategies:
            out = root if command == "train" else root / name
            before = tb.interface_bytes()
            code = run_torchrun(tb, ["-m", "polytrain", "train", "--strategy", name, *args,
                                     "--out", str(out)], nper, log_dir=out / HOST_LOGS)
            _annotate(out, before, tb.interface_bytes())
            if code:
                break
    if command == "compare" and code == 0:
        from polytrain.report import summary_table, write_report

        summaries = [json.loads((root / n / "summary.json").read_text()) for n in strategies]
        (root / "compare.json").write_text(json.dumps({"strategies": summaries, "target_accuracy": None},
                                                      indent=1))
        console.print(summary_table(summaries, title=f"comparison on the testbed ({hosts} hosts, {nic})"))
        if "--no-report" not in args:
            write_report(root)
    return code


def _run_aco(hosts: int, nic: str, latency: str | None, loss: str | None, nper: int,
             args: list[str], stamp: str) -> int:
    """``polytrain aco`` on the emulated cluster: validated before any host starts, one torchrun
    agent per host, the interface counters added to the run's summary as for ``train``."""
    from polytrain.aco.cli import check_aco_args
    from polytrain.launch.testbed import Testbed
    from polytrain.launch.testbed_torchrun import run_torchrun

    check_aco_args(args, hosts * nper)
    out = Path(_take(args, "--out") or f"runs/{stamp}-testbed-aco")
    args = _without(args, "--out")
    with Testbed(hosts, nic, latency=latency, loss=loss) as tb:
        before = tb.interface_bytes()
        code = run_torchrun(tb, ["-m", "polytrain", "aco", *args, "--out", str(out)], nper,
                            log_dir=out / HOST_LOGS)
        _annotate(out, before, tb.interface_bytes())
    return code


def _check_job(strategies: list[str], args: list[str], hosts: int, procs: int) -> None:
    """Validate the whole job for each strategy — that it runs on the testbed, its options, the batch
    against the ranks, model and data — with the hosts' own ``prepare()``, before any emulated host
    starts: a bad job is one error line here, not a failure inside N torchrun agents."""
    from polytrain.cli import _overrides, build_parser
    from polytrain.config import load_config
    from polytrain.launch.prepare import prepare

    ns = build_parser().parse_args(["train", *args, "--procs", str(procs)])
    for name in strategies:
        cfg = load_config(ns.config, {**_overrides(ns), "strategy": name}, ns.sets)
        prepare(cfg, hosts=hosts, testbed=True)
