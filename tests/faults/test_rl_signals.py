"""`polytrain rl` stopped from outside (issue 22 items 5 and 7): SIGTERM/Ctrl-C to its launcher
ends every process, a dqn run that checkpoints writes a checkpoint at the stop and the summary is
marked interrupted (one line, exit 128 + signal); kill -9 of the launcher takes its processes
(they are the fork server's children, so they watch the launcher's pidfd)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from polytrain.rl import checkpoint
from tests.conftest import ROOT
from tests.faults.test_launcher_signals import wait_gone

pytestmark = pytest.mark.slow

FLAGS = ["--set=hidden=16", "--set=depth=1", "--set=max_seconds=1e6", "--set=target_return=1e6",
         "--set=eval_every_s=1e6", "--max-env-steps", "100000000", "--no-plots"]


def start(run: Path, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "polytrain", "rl", "dqn", *FLAGS, "--out", str(run),
                             *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def learner_pid(run: Path, timeout: float = 180) -> int:
    """The learner's pid once it has finished an episode (so it is past its startup)."""
    path, end = run / "ranks" / "rank0.jsonl", time.monotonic() + timeout
    while time.monotonic() < end:
        evs = [json.loads(x) for x in (path.read_text().splitlines() if path.exists() else [])
               if x.endswith("}")]
        if any(e["event"] == "episode" for e in evs):
            return int(next(e["pid"] for e in evs if e["event"] == "process"))
        time.sleep(0.2)
    raise AssertionError("the dqn learner never finished an episode")


@pytest.mark.parametrize("how", ["SIGTERM", pytest.param("SIGINT", marks=pytest.mark.nightly)])
def test_stop_request_checkpoints_dqn_and_marks_the_summary(tmp_path: Path, how: str) -> None:
    run = tmp_path / "run"
    proc = start(run, "--checkpoint-every", "10")
    try:
        pid = learner_pid(run)
        proc.send_signal(signal.Signals[how])
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.Signals[how], err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("interrupted:"), err
    wait_gone([pid], within=30)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted" and summary["interrupted"]["signal"] == how
    saved = checkpoint.load(run)
    assert saved["env_steps"] == summary["env_steps"] == summary["interrupted"]["env_steps"] > 0


@pytest.mark.nightly
def test_killed_rl_launcher_takes_its_processes(tmp_path: Path) -> None:
    proc = start(tmp_path / "run")
    try:
        pid = learner_pid(tmp_path / "run")
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    wait_gone([pid], within=30)
