"""Testbed: input validation, teardown on success/failure/signal, isolation, real shaping.

Tests that build namespaces need root (CAP_NET_ADMIN + CAP_SYS_ADMIN) and iproute2; they are
skipped, with the reason, only when that is really missing. The whole file takes ~60 s.

Also a tier-4 measurement helper: ``python tests/test_testbed.py --bench`` prints the gloo
all-reduce bus bandwidth over 2 and 4 emulated hosts at 100mbit and 1gbit (the table quoted
in ``polytrain/testbed/hosts.py``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from polytrain.errors import ConfigError
from polytrain.testbed import netns
from polytrain.testbed.hosts import Testbed as Bed  # aliases: pytest collects "test*" names
from polytrain.testbed.hosts import parse_latency, parse_loss, parse_rate
from polytrain.testbed.torchrun import run_torchrun, torchrun_command
from polytrain.testbed.torchrun import testbed_record as record_of

REPO = Path(__file__).resolve().parents[1]
NO_PRIVILEGE = netns.missing_privileges()
_privileged = pytest.mark.skipif(NO_PRIVILEGE is not None, reason=str(NO_PRIVILEGE))


def needs_net(test: Callable[..., None]) -> Callable[..., None]:
    """Builds a testbed and starts processes in it: root only, and in the slow tier."""
    return pytest.mark.slow(_privileged(test))  # type: ignore[no-any-return]

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


def _ours(tb_id: str) -> list[str]:
    return [n for n in netns.list_netns() if n.startswith(f"polytrain-{tb_id}-")]


def _gone(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    return "\nState:\tZ" in status  # dead, waiting to be reaped by init


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


# -- building and tearing down (root) -------------------------------------------------------
@needs_net
def test_latency_or_loss_uses_netem_or_refuses() -> None:
    if not netns.netem_available():
        with pytest.raises(ConfigError, match=r"sch_netem.*Drop --latency/--loss"):
            Bed(2, "1gbit", latency="5ms").up()
        return
    with Bed(2, "1gbit", latency="5ms", loss="0.1%") as tb:
        out = netns.run(["tc", "-n", tb.host_ns(0), "qdisc", "show", "dev", tb.host_ifname(0)])
        assert "netem" in out and "delay 5ms" in out and "tbf" in out


@needs_net
def test_teardown_after_success_and_nothing_in_root_namespace() -> None:
    root_links = netns.run(["ip", "-o", "link", "show"]).count("\n")
    with Bed(2, "100mbit") as tb:
        assert sorted(_ours(tb.id)) == sorted(tb.namespaces) and len(tb.namespaces) == 3
        assert netns.run(["ip", "-o", "link", "show"]).count("\n") == root_links
        qdiscs = netns.run(["tc", "-n", tb.switch_ns, "qdisc", "show"])
        assert qdiscs.count("tbf") == 2 and "rate 100Mbit" in qdiscs
        tb_id = tb.id
    assert _ours(tb_id) == [] and not (netns.OWNER_DIR / f"{tb_id}.pid").exists()


@needs_net
def test_teardown_after_exception_kills_processes_inside() -> None:
    with pytest.raises(RuntimeError, match="boom"), Bed(2, "100mbit") as tb:
        proc = tb.popen(1, ["sleep", "600"])
        tb_id = tb.id
        raise RuntimeError("boom")
    assert _ours(tb_id) == [] and proc.poll() is not None


@needs_net
def test_two_testbeds_at_once_do_not_collide() -> None:
    with Bed(2, "100mbit") as a, Bed(2, "1gbit") as b:
        assert a.id != b.id and a.subnet != b.subnet
        assert not set(a.namespaces) & set(b.namespaces)
        assert a.host_ifname(0) != b.host_ifname(0) and a.host_addr(0) != b.host_addr(0)
        assert set(_ours(a.id)) == set(a.namespaces) and set(_ours(b.id)) == set(b.namespaces)
    assert _ours(a.id) == [] and _ours(b.id) == []


HOLD = """
import json, sys
from polytrain.testbed.hosts import Testbed as Bed
with Bed(2, "100mbit") as tb:
    print(json.dumps({"id": tb.id, "subnet": tb.subnet, "ns": tb.namespaces}), flush=True)
    sys.stdin.read()  # hold the testbed until the parent closes our stdin
"""


def _hold() -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", HOLD], cwd=REPO, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )


@needs_net
def test_concurrent_processes_get_distinct_testbeds() -> None:
    children = [_hold() for _ in range(3)]  # race for ids at the same moment
    infos = [json.loads(c.stdout.readline()) for c in children if c.stdout]
    for c in children:
        c.communicate("", timeout=30)
    assert all(c.returncode == 0 for c in children)
    assert len({i["id"] for i in infos}) == len({i["subnet"] for i in infos}) == 3
    assert all(_ours(i["id"]) == [] for i in infos)


HOLD_BUSY = """
import json, sys, time
from polytrain.testbed import netns
from polytrain.testbed.hosts import Testbed as Bed
with Bed(2, "100mbit") as tb:
    tb.popen(0, ["sleep", "600"])
    tb.popen(1, ["setsid", "sleep", "600"])  # forks out of our process group
    time.sleep(0.3)
    pids = netns.netns_pids(tb.host_ns(0)) + netns.netns_pids(tb.host_ns(1))
    print(json.dumps({"id": tb.id, "ns": tb.namespaces, "pids": pids}), flush=True)
    time.sleep(600)
"""


@needs_net
def test_a_testbed_whose_owner_is_killed_is_reaped_within_5_s() -> None:
    """Issue 50 item 7: SIGKILL runs no teardown; the testbed's reaper (its own session) kills
    the processes inside and deletes the namespaces."""
    child = subprocess.Popen([sys.executable, "-c", HOLD_BUSY], cwd=REPO, text=True,
                             stdout=subprocess.PIPE)
    assert child.stdout is not None
    info = json.loads(child.stdout.readline())
    assert sorted(_ours(info["id"])) == sorted(info["ns"]) and len(info["pids"]) >= 2
    child.kill()  # SIGKILL: no teardown runs
    child.wait()
    end = time.monotonic() + 5
    while (_ours(info["id"]) or any(_alive(p) for p in info["pids"])) and time.monotonic() < end:
        time.sleep(0.1)
    assert _ours(info["id"]) == [], "namespaces left 5 s after the owner's SIGKILL"
    assert not [p for p in info["pids"] if _alive(p)], "processes left inside"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _start_cli(tmp_path: Path) -> tuple[subprocess.Popen[str], str, Path]:
    """``polytrain testbed`` training on 2 hosts (own session, private TMPDIR ``tmp_path/tmp``,
    output in ``tmp_path/out.txt``), once host 0's rank has trained; (process, testbed id, out)."""
    tmp, run, out = tmp_path / "tmp", tmp_path / "run", tmp_path / "out.txt"
    tmp.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp)}
    with out.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "polytrain", "testbed", "--hosts", "2", "--nic", "1gbit", "--",
             "train", "--model", "mlp", "--set", "model.hidden=16", "--procs", "2", "--steps",
             "1000000", "--no-report", "--out", str(run)],
            cwd=tmp_path, env=env, stdout=sink, stderr=sink, text=True, start_new_session=True)
    end = time.monotonic() + 180
    rank0 = run / "ranks" / "rank0.jsonl"
    while not (rank0.exists() and '"event": "step"' in rank0.read_text()):
        assert proc.poll() is None and time.monotonic() < end, out.read_text()[-3000:]
        time.sleep(0.2)
    found = re.search(r"\[testbed ([0-9a-f]{2})\]", out.read_text())
    assert found, out.read_text()[-3000:]
    return proc, found.group(1), out


def _left(tb_id: str, pids: list[int], tmp: Path) -> list[str]:
    return (_ours(tb_id) + [f"pid {p}" for p in pids if _alive(p)]
            + sorted(p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor_")))


@needs_net
def test_ctrl_c_of_polytrain_testbed_prints_no_traceback_and_leaves_nothing(tmp_path: Path) -> None:
    """Issue 50 item 7: Ctrl-C printed torchrun's ``SignalException`` traceback and left the
    hosts' log folders and torchrun's ``torchelastic_*`` trees in the temporary folder."""
    proc, tb_id, out = _start_cli(tmp_path)
    pids = [p for ns in _ours(tb_id) for p in netns.netns_pids(ns)]
    try:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the foreground group
        proc.wait(timeout=60)
    finally:
        proc.kill()
    text = out.read_text()
    assert proc.returncode == 130, text[-3000:]
    assert "Traceback" not in text and "SignalException" not in text, text[-3000:]
    assert not _left(tb_id, pids, tmp_path / "tmp")


@needs_net
def test_sigkill_of_polytrain_testbed_leaves_nothing_within_5_s(tmp_path: Path) -> None:
    """Issue 50 item 7: after ``kill -9`` of ``polytrain testbed`` its reaper kills the ranks
    inside, deletes the namespaces and the temporary folders within 5 s."""
    proc, tb_id, _ = _start_cli(tmp_path)
    pids = [p for ns in _ours(tb_id) for p in netns.netns_pids(ns)]
    assert len(pids) >= 4  # two torchrun agents and their ranks
    proc.kill()
    proc.wait()
    t0 = time.monotonic()
    while _left(tb_id, pids, tmp_path / "tmp") and time.monotonic() - t0 < 5:
        time.sleep(0.05)
    print(f"\nafter kill -9 of polytrain testbed: nothing left after {time.monotonic() - t0:.2f} s")
    assert not _left(tb_id, pids, tmp_path / "tmp")


CHILD = """
import json, subprocess, sys, time
from polytrain.testbed import netns
from polytrain.testbed.hosts import Testbed as Bed
with Bed(2, "100mbit") as tb:
    stubborn = tb.popen(0, [sys.executable, "-c", "import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); signal.signal(signal.SIGINT, "
        "signal.SIG_IGN); time.sleep(600)"])
    tb.popen(1, ["setsid", "sleep", "600"])  # forks out of our process group
    time.sleep(0.5)
    pids = netns.netns_pids(tb.host_ns(0)) + netns.netns_pids(tb.host_ns(1))
    print(json.dumps({"id": tb.id, "pids": pids}), flush=True)
    time.sleep(600)
"""


@needs_net
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_tears_down_and_kills_stubborn_processes(sig: signal.Signals) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert child.stdout is not None and child.stderr is not None
    line = child.stdout.readline()
    assert line, child.stderr.read()
    ready = json.loads(line)
    assert len(ready["pids"]) >= 2 and len(_ours(ready["id"])) == 3
    child.send_signal(sig)
    child.wait(timeout=30)
    assert child.returncode != 0, child.stderr.read()
    assert _ours(ready["id"]) == []
    assert all(_gone(pid) for pid in ready["pids"])


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
    assert _ours(tb_id) == [] and not log.parent.exists()
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

