"""The launcher's ranks never outlive it (issue 22 item 5).

* kill -9 of the launcher: its ranks die with it (parent-death signal), within seconds;
* SIGTERM to the launcher, or Ctrl-C (SIGINT to the terminal's process group): every rank stops
  after one agreed step (parameter servers once their clients have stopped: ps, distbelief), a
  checkpoint is written there, metrics.jsonl and a summary marked ``interrupted`` (by rank 0, not
  by the launcher after killing ranks at the end of the grace period) are kept, and the launcher
  prints one line (no traceback), exit 128 + signal.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from polytrain.launch.agent import process_state
from tests.conftest import ROOT
from tests.faults.probes import assert_emptied, leftovers

pytestmark = pytest.mark.slow

JOB = ["--model", "mlp", "--set", "model.hidden=16", "--steps", "1000000", "--no-report"]


def start(run: Path, *extra: str) -> subprocess.Popen[str]:
    """A long 2-rank job in its own session (as a terminal's foreground job is), with a private
    TMPDIR (``tmp`` beside ``run``) that must be empty when it ends, killed or not."""
    tmp = run.parent / "tmp"
    tmp.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)}
    procs = [] if "--procs" in extra else ["--procs", "2"]
    return subprocess.Popen([sys.executable, "-m", "polytrain", "train", *JOB, *procs, "--out",
                             str(run), *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def rank_pids(run: Path, steps: int = 3, timeout: float = 120, ranks: int = 2) -> list[int]:
    """The ranks' pids, once every rank has started and one has recorded ``steps`` steps."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        pids, stepped = [], 0
        for rank in range(ranks):
            path = run / "ranks" / f"rank{rank}.jsonl"
            lines = path.read_text().splitlines() if path.exists() else []
            evs = [json.loads(x) for x in lines if x.endswith("}")]
            stepped = max(stepped, sum(e["event"] == "step" for e in evs))
            pids += [e["pid"] for e in evs if e["event"] == "process"][:1]
        if len(pids) == ranks and stepped >= steps:
            return pids
        time.sleep(0.2)
    raise AssertionError("the ranks never started training")


def alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped by its new parent, does not count)."""
    state = process_state(pid)
    return state is not None and state not in ("Z", "X")


def wait_gone(pids: list[int], within: float) -> float:
    t0 = time.monotonic()
    while any(alive(p) for p in pids):
        if time.monotonic() - t0 > within:
            for p in pids:  # leave nothing behind, then fail
                if alive(p):
                    os.kill(p, signal.SIGKILL)
            raise AssertionError(f"ranks {[p for p in pids if alive(p)]} outlived the launcher")
        time.sleep(0.05)
    return time.monotonic() - t0


def test_killed_launcher_takes_its_ranks(tmp_path: Path) -> None:
    proc = start(tmp_path / "run")
    try:
        pids = rank_pids(tmp_path / "run")
        proc.kill()
        proc.wait(timeout=10)
        assert wait_gone(pids, within=5) < 5
    finally:
        proc.kill()
    assert not leftovers(tmp_path / "tmp")  # no /tmp/torchelastic_* tree
    # the agent's log folder in the run directory: removed by a rank's watcher
    assert_emptied(tmp_path / "run" / "ranks", within=30, name="agent")


# (strategy arguments, the ranks that run steps): the shared loop (allreduce), and strategies with
# loops of their own whose servers end with their clients: ps (rank 0 a server), distbelief
# (ranks 0-1 the two stages' servers, ranks 2-3 one replica's stages)
# Stream pipelines stop mid-segment (their one segment here spans the whole run): pipedream on 3
# stages (the STOP passes through a middle stage), spectrain on 2.
JOBS = {"allreduce": ([], [0, 1]),
        "ps": (["--strategy", "ps", "--procs", "3"], [1, 2]),
        "distbelief": (["--strategy", "distbelief", "--procs", "4"], [2, 3]),
        "pipedream": (["--strategy", "pipedream", "--procs", "3", "--steps", "20000"], [0, 1, 2]),
        "spectrain": (["--strategy", "spectrain", "--optimizer", "momentum", "--steps", "20000"], [0, 1])}


@pytest.mark.parametrize(("how", "job"), [
    ("SIGTERM", "allreduce"), ("SIGTERM", "distbelief"), ("SIGTERM", "pipedream"),
    pytest.param("SIGTERM", "spectrain", marks=pytest.mark.nightly),  # pipedream's stream
    pytest.param("SIGTERM", "ps", marks=pytest.mark.nightly),  # its loop is allreduce's
    pytest.param("SIGINT", "allreduce", marks=pytest.mark.nightly)])
def test_stop_request_checkpoints_and_keeps_an_interrupted_summary(tmp_path: Path, how: str,
                                                                   job: str) -> None:
    run = tmp_path / "run"
    args, stepping = JOBS[job]
    proc = start(run, *args, "--checkpoint-every", "1000000")
    try:
        pids = rank_pids(run, ranks=len(stepping) + stepping[0])
        sig = signal.Signals[how]
        if how == "SIGINT":  # Ctrl-C: the terminal signals the whole foreground group
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        proc.kill()
    assert took < 15, f"the launcher took {took:.1f} s to stop"
    wait_gone(pids, within=1)
    assert proc.returncode == 128 + sig
    assert not leftovers(tmp_path / "tmp") and not (run / "ranks" / "agent").exists()
    assert "Traceback" not in err and "death signal" not in err
    lines = [x for x in err.splitlines() if "interrupted" in x]
    assert len(lines) == 1 and f"{how}: every rank stopped after step" in lines[0], err
    summary = json.loads((run / "summary.json").read_text())
    step = summary["interrupted"]["step"]
    assert summary["interrupted"]["signal"] == how and summary["steps_run"] == step >= 3
    assert "by" not in summary["interrupted"], summary["interrupted"]  # the ranks finished
    assert (run / "checkpoints" / "LATEST").read_text() == f"step-{step:08d}"
    assert f"checkpoint step-{step:08d}; continue with: polytrain train --resume" in lines[0]
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for rank in stepping:
        mine = [e["step"] for e in steps if e["event"] == "step" and e["rank"] == rank]
        assert mine == list(range(1, step + 1))


def test_stop_request_ends_ps_k_of_n(tmp_path: Path) -> None:
    """ps k-of-n (its own loop, no checkpoints): the workers stop at the servers' agreed step,
    before computing the next, so none waits on a step the others have left; rank 0 (a
    server) writes the summary."""
    run = tmp_path / "run"
    proc = start(run, "--strategy", "ps", "--procs", "4", "--batch-size", "66", "--set",
                 "consistency=k-of-n")  # 3 workers, k = 2
    try:
        pids = rank_pids(run, ranks=4)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    wait_gone(pids, within=1)
    assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in err
    summary = json.loads((run / "summary.json").read_text())
    step = summary["interrupted"]["step"]
    assert "by" not in summary["interrupted"], summary["interrupted"]  # the ranks finished
    assert step >= 3 and "no checkpoint" in err
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for rank in (1, 2, 3):  # a late worker skips steps; none computes past the agreed one
        mine = [e["step"] for e in steps if e["event"] == "step" and e["rank"] == rank]
        assert mine and max(mine) <= step and mine == sorted(set(mine))
