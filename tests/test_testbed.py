"""Testbed: input validation, jobs on it (a failing host, real shaping, the parsed job passed to
the hosts). Building and tearing down is ``test_testbed_lifecycle.py``.

Tests that build namespaces need root (CAP_NET_ADMIN + CAP_SYS_ADMIN) and iproute2; they are
skipped, with the reason, only when that is really missing.

Also a tier-4 measurement helper: ``python -m tests.test_testbed --bench`` prints the gloo
all-reduce bus bandwidth over 2 and 4 emulated hosts at 100mbit and 1gbit (the table quoted
in ``polytrain/testbed/hosts.py``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from polytrain.errors import ConfigError
from polytrain.testbed import netns
from polytrain.testbed.hosts import Testbed as Bed  # aliases: pytest collects "test*" names
from polytrain.testbed.hosts import parse_latency, parse_loss, parse_rate
from polytrain.testbed.torchrun import run_torchrun, torchrun_command
from polytrain.testbed.torchrun import testbed_record as record_of
from tests.testbed_util import needs_net, ours

# One rank per host: all-reduce a 4 MiB float32 tensor; bus bandwidth as nccl-tests define it.
ALLREDUCE = """
import json, os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.ones(1 << 20)
for _ in range(2):
    dist.all_reduce(t)
dist.barrier()
iters = int(sys.argv[2])
t0 = time.perf_counter()
for _ in range(iters):
    dist.all_reduce(t)
dt = (time.perf_counter() - t0) / iters
assert json.loads(os.environ["POLYTRAIN_TESTBED_RECORD"])["procs_per_host"] == 1
res = {"rank": rank, "world": world, "host": int(os.environ["POLYTRAIN_TESTBED_HOST"]),
       "group_rank": int(os.environ["GROUP_RANK"]), "ok": bool(t[0] == world ** (iters + 2)),
       "busbw_bits": t.numel() * 4 * 2 * (world - 1) / world / dt * 8}
open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w").write(json.dumps(res))
dist.destroy_process_group()
"""


def measure_allreduce(hosts: int, nic: str, work: Path, iters: int = 8) -> dict[str, Any]:
    """Run ALLREDUCE on a fresh testbed; return rc, per-rank results and NIC byte counts."""
    script = work / "allreduce.py"
    script.write_text(ALLREDUCE)
    with Bed(hosts, nic) as tb:
        before = tb.interface_bytes()
        rc = run_torchrun(tb, [str(script), str(work), str(iters)], 1, timeout=120)
        after = tb.interface_bytes()
        record = record_of(tb)
    ranks = [json.loads(p.read_text()) for p in sorted(work.glob("rank*.json"))]
    tx = {h: after[h]["tx"] - before[h]["tx"] for h in after}
    wire = {h: after[h]["tx_wire"] - before[h]["tx_wire"] for h in after}
    payload = (iters + 2) * 4 * 2**20 * 2 * (hosts - 1) / hosts  # bytes each rank sends
    return {"rc": rc, "ranks": ranks, "tx": tx, "wire": wire, "payload": payload, "record": record}


# -- input validation (no privileges needed) ----------------------------------------------
@pytest.mark.parametrize(
    ("text", "bits"),
    [
        ("100mbit", 10**8),
        ("1gbit", 10**9),
        ("200mbit", 2 * 10**8),
        ("10gbit", 10**10),
        ("500kbit", 5 * 10**5),
        ("1.5Gbit", 15 * 10**8),
    ],
)
def test_rate_parses(text: str, bits: int) -> None:
    assert parse_rate(text) == bits


@pytest.mark.parametrize("text", ["100mb", "100", "fast", "", "0mbit", "-1gbit", "1000gbit"])
def test_bad_rate_is_config_error_with_examples(text: str) -> None:
    with pytest.raises(ConfigError, match=r"--nic .*Examples: 500kbit, 100mbit, 1gbit"):
        Bed(2, text)


@pytest.mark.parametrize("text", ["5", "5 sec", "-1ms", "0ms", "11s"])
def test_bad_latency_is_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match=r"--latency .*Examples: 200us, 5ms"):
        Bed(2, "1gbit", latency=text)


@pytest.mark.parametrize("text", ["5", "0%", "100%", "x%"])
def test_bad_loss_is_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match=r"--loss .*Examples: 0.01%"):
        Bed(2, "1gbit", loss=text)


def test_good_latency_and_loss_parse() -> None:
    assert (parse_latency("5ms"), parse_latency("200us"), parse_latency("0.1s")) == (5000, 200, 100_000)
    assert parse_loss("0.5%") == 0.5


@pytest.mark.parametrize("hosts", [0, 91, "2", True])
def test_bad_hosts_is_config_error(hosts: Any) -> None:
    with pytest.raises(ConfigError, match=r"--hosts must be an integer from 1 to 90"):
        Bed(hosts, "1gbit")


def test_missing_tools_and_privileges_are_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netns.shutil, "which", lambda name: None)
    assert "apt-get install iproute2" in str(netns.missing_privileges())
    monkeypatch.setattr(netns.shutil, "which", lambda name: "/usr/sbin/" + name)
    monkeypatch.setattr(netns, "_effective_caps", lambda: 0)
    msg = str(netns.missing_privileges())
    assert "CAP_NET_ADMIN" in msg and "Run as root" in msg and "sudo" in msg
    with pytest.raises(ConfigError, match="CAP_NET_ADMIN"):
        Bed(2, "1gbit").up()


def test_record_and_torchrun_command_without_building() -> None:
    tb = Bed(3, "1Gbit")
    tb.id = "2a"  # naming only; nothing is built
    assert record_of(tb) == {
        "hosts": 3,
        "nic": "1gbit",
        "rate_bits_per_s": 10**9,
        "latency": None,
        "loss": None,
        "procs_per_host": None,
    }
    cmd = torchrun_command(tb, 2, ["-m", "polytrain", "train"], 4, "rid")
    joined = " ".join(cmd)
    assert "--nnodes 3 --nproc-per-node 4 --rdzv-backend c10d" in joined
    assert "--rdzv-endpoint 10.213.42.10:29400 --rdzv-id rid --rdzv-conf is_host=0" in joined
    assert "--local-addr 10.213.42.12" in joined and cmd[-3:] == ["-m", "polytrain", "train"]
    assert tb.host_ifname(2) == "pt2ah2" and len(f"pt{'ff'}h{89}") <= 15


# -- running jobs (root) ------------------------------------------------------------------
FAILING = """
import os, sys, time
if os.environ["POLYTRAIN_TESTBED_HOST"] == "1":
    sys.exit(3)
time.sleep(600)  # host 0 would wait forever for its peer
"""


@needs_net
def test_failing_host_fails_the_job_fast_and_tears_down(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "failing.py"
    script.write_text(FAILING)
    start = time.monotonic()
    with Bed(2, "100mbit") as tb:
        rc = run_torchrun(tb, [str(script)], 1, fail_grace_s=2.0, timeout=120)
        tb_id, log = tb.id, tb.host_logs[1]
    assert rc != 0 and time.monotonic() - start < 60
    # its last lines were printed; the temporary log folder is gone (kept only with log_dir)
    assert ours(tb_id) == [] and not log.parent.exists()
    assert f"host 1 exited with {rc}" in capfd.readouterr().err


@needs_net
def test_allreduce_is_shaped_to_the_configured_rate(tmp_path: Path) -> None:
    res = measure_allreduce(2, "100mbit", tmp_path)
    assert res["rc"] == 0 and len(res["ranks"]) == 2
    for r in res["ranks"]:
        assert r["ok"] and r["group_rank"] == r["host"] == r["rank"]  # host i is node rank i
        assert 0.5 < r["busbw_bits"] / 10**8 <= 1.1, r
    for h, tx in res["tx"].items():  # the NIC saw the all-reduce bytes (+ headers, store)
        assert res["payload"] <= tx <= 1.001 * res["wire"][h] <= 1.1 * res["payload"], res
    assert res["record"]["procs_per_host"] == 1

@pytest.mark.parametrize(
    ("job", "rule"),
    [
        (["train", "--strategy", "allreduce", "--procs", "3", "--batch-size", "64"], "multiple of 3"),
        (["train", "--strategy", "ps", "--procs", "3", "--set", "servers=5"], "servers"),
        (["compare", "--strategies", "allreduce,gpipe", "--procs", "3", "--set", "nope=1"], "nope"),
    ],
)
def test_testbed_job_is_validated_before_any_host_starts(job: list[str], rule: str) -> None:
    """The whole job goes through the hosts' own ``prepare()`` first: one error line, no host
    started (no root needed to see it)."""
    import argparse

    from rich.console import Console

    from polytrain.cli import cmd_testbed

    bed = argparse.Namespace(hosts=3, nic="1gbit", latency=None, loss=None, procs_per_host=None)
    with pytest.raises(ConfigError, match=rule):
        cmd_testbed(bed, job, Console())


def test_the_hosts_get_the_parsed_job_back_as_flags() -> None:
    """The testbed's hosts run the job the command line parsed: its flags written back from the
    namespace, parsed again to the same job (world size, run directory and strategy left to the
    testbed)."""
    from polytrain.cli import build_parser
    from polytrain.flags import job_argv
    from polytrain.flags import overrides as _overrides

    job = ["train", "--strategy", "gpipe", "--procs", "4", "--lr", "0.05", "--steps", "7",
           "--set", "microbatches=4", "--set", "model.width=8", "--activation-checkpointing",
           "--no-report", "--out", "x", "--grad-accum", "2"]
    ns = build_parser().parse_args(job)
    again = build_parser().parse_args(["train", *job_argv(ns, drop=("procs", "out", "strategy"))])
    assert _overrides(again) == {k: v for k, v in _overrides(ns).items() if k not in ("procs", "out",
                                                                                      "strategy")}
    assert again.sets == ns.sets and again.no_report


def bench() -> None:
    """Print the markdown table quoted in polytrain/testbed/hosts.py's docstring."""
    import tempfile

    print("| hosts | nic | bus bandwidth | % of rate | NIC tx / payload | wire tx / payload |")
    print("|---|---|---|---|---|---|")
    for hosts in (2, 4):
        for nic in ("100mbit", "1gbit"):
            res = measure_allreduce(hosts, nic, Path(tempfile.mkdtemp()))
            bw = min(r["busbw_bits"] for r in res["ranks"])
            over = max(res["tx"].values()) / res["payload"]
            wire = max(res["wire"].values()) / res["payload"]
            print(
                f"| {hosts} | {nic} | {bw / 1e6:.1f} Mbit/s | "
                f"{100 * bw / parse_rate(nic):.0f}% | {over:.3f} | {wire:.3f} |",
                flush=True,
            )


if __name__ == "__main__" and "--bench" in sys.argv:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    bench()

