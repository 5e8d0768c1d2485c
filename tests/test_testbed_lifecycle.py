"""Testbed lifecycle: building and tearing down — after success, an exception, a signal, the
owner's SIGKILL, Ctrl-C of ``polytrain testbed`` — and testbeds side by side that never collide.
Every test here builds namespaces: root (CAP_NET_ADMIN + CAP_SYS_ADMIN) and iproute2, skipped
with the reason only when really missing; the slow tier."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from polytrain.errors import ConfigError
from polytrain.testbed import netns
from polytrain.testbed.hosts import Testbed as Bed  # aliases: pytest collects "test*" names
from tests.testbed_util import REPO, gone, needs_net, ours


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
        assert sorted(ours(tb.id)) == sorted(tb.namespaces) and len(tb.namespaces) == 3
        assert netns.run(["ip", "-o", "link", "show"]).count("\n") == root_links
        qdiscs = netns.run(["tc", "-n", tb.switch_ns, "qdisc", "show"])
        assert qdiscs.count("tbf") == 2 and "rate 100Mbit" in qdiscs
        tb_id = tb.id
    assert ours(tb_id) == [] and not (netns.OWNER_DIR / f"{tb_id}.pid").exists()


@needs_net
def test_teardown_after_exception_kills_processes_inside() -> None:
    with pytest.raises(RuntimeError, match="boom"), Bed(2, "100mbit") as tb:
        proc = tb.popen(1, ["sleep", "600"])
        tb_id = tb.id
        raise RuntimeError("boom")
    assert ours(tb_id) == [] and proc.poll() is not None


@needs_net
def test_two_testbeds_at_once_do_not_collide() -> None:
    with Bed(2, "100mbit") as a, Bed(2, "1gbit") as b:
        assert a.id != b.id and a.subnet != b.subnet
        assert not set(a.namespaces) & set(b.namespaces)
        assert a.host_ifname(0) != b.host_ifname(0) and a.host_addr(0) != b.host_addr(0)
        assert set(ours(a.id)) == set(a.namespaces) and set(ours(b.id)) == set(b.namespaces)
    assert ours(a.id) == [] and ours(b.id) == []


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
    assert all(ours(i["id"]) == [] for i in infos)


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
    assert sorted(ours(info["id"])) == sorted(info["ns"]) and len(info["pids"]) >= 2
    child.kill()  # SIGKILL: no teardown runs
    child.wait()
    end = time.monotonic() + 5
    while (ours(info["id"]) or not all(gone(p) for p in info["pids"])) and time.monotonic() < end:
        time.sleep(0.1)
    assert ours(info["id"]) == [], "namespaces left 5 s after the owner's SIGKILL"
    assert not [p for p in info["pids"] if not gone(p)], "processes left inside"


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
    return (ours(tb_id) + [f"pid {p}" for p in pids if not gone(p)]
            + sorted(p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor_")))


@needs_net
def test_ctrl_c_of_polytrain_testbed_prints_no_traceback_and_leaves_nothing(tmp_path: Path) -> None:
    """Issue 50 item 7: Ctrl-C printed torchrun's ``SignalException`` traceback and left the
    hosts' log folders and torchrun's ``torchelastic_*`` trees in the temporary folder."""
    proc, tb_id, out = _start_cli(tmp_path)
    pids = [p for ns in ours(tb_id) for p in netns.netns_pids(ns)]
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
    pids = [p for ns in ours(tb_id) for p in netns.netns_pids(ns)]
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
    assert len(ready["pids"]) >= 2 and len(ours(ready["id"])) == 3
    child.send_signal(sig)
    child.wait(timeout=30)
    assert child.returncode != 0, child.stderr.read()
    assert ours(ready["id"]) == []
    assert all(gone(pid) for pid in ready["pids"])
