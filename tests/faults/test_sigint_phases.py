"""Ctrl-C is honoured in every phase of the local launcher (issue 50 item 4).

Ctrl-C (SIGINT to the terminal's whole process group) at: the launcher's own preparation (a
user model factory that is slow in the launcher), the agent's start and rendezvous (as soon as
the launcher hands the job to the agent), ranks starting (the factory slow in the ranks),
training, and teardown (the launcher writing the report after the ranks ended). Each time the
launcher must exit with 130 and no process it started (ranks, watchers) may remain. The time
from the signal to the launcher's exit is printed, not asserted (a 30 s bound only stops a hang).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.faults.probes import leftovers
from tests.faults.test_launcher_signals import alive
from tests.test_exposure import _tree

pytestmark = pytest.mark.slow

SLOW_FACTORY = """
import os, pathlib, time
from torch import nn

def make(num_classes: int = 10) -> nn.Module:
    where = "rank" if "RANK" in os.environ else "launcher"
    (pathlib.Path(os.environ["PHASE_MARKS"]) / where).touch()
    if os.environ.get("PHASE_HOLD") == where:
        time.sleep(600)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes))
"""


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _steps(run: Path) -> bool:
    path = run / "ranks" / "rank0.jsonl"
    return path.exists() and '"event": "step"' in path.read_text()


# phase -> (where the factory sleeps, steps, report, the moment to press Ctrl-C)
PHASES: dict[str, tuple[str, int, bool, Callable[[Path, Path], bool]]] = {
    "preparing": ("launcher", 50, False, lambda run, marks: (marks / "launcher").exists()),
    "rendezvous": ("", 50, False, lambda run, marks: (run / "ranks" / "launch.json").exists()),
    "ranks starting": ("rank", 50, False, lambda run, marks: (marks / "rank").exists()),
    "training": ("", 1_000_000, False, lambda run, marks: _steps(run)),
    "teardown": ("", 30, True, lambda run, marks: (run / "summary.json").exists()),
}


# training is also covered by test_launcher_signals.py (SIGTERM), rendezvous is brief with the
# private FileStore: both nightly, to keep the suite's time
@pytest.mark.parametrize("phase", [pytest.param(p, marks=pytest.mark.nightly)
                                   if p in ("rendezvous", "training") else p for p in PHASES])
def test_ctrl_c_ends_the_launcher_and_every_rank(tmp_path: Path, phase: str) -> None:
    hold, steps, report, ready = PHASES[phase]
    (tmp_path / "slowmodel.py").write_text(SLOW_FACTORY)
    marks, tmp, run = tmp_path / "marks", tmp_path / "tmp", tmp_path / "run"
    marks.mkdir()
    tmp.mkdir()
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "TMPDIR": str(tmp),
           "PHASE_MARKS": str(marks), "PHASE_HOLD": hold}
    cmd = [sys.executable, "-m", "polytrain", "train", "--model", "slowmodel:make", "--procs", "2",
           "--steps", str(steps), "--out", str(run), *([] if report else ["--no-report"])]
    # a terminal's foreground job: SIGINT at its default action, even when this test runs from a
    # script's background job, whose children inherit SIGINT ignored (POSIX)
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_default_sigint)
    seen: set[int] = set()
    try:
        end = time.monotonic() + 180
        while not ready(run, marks) and proc.poll() is None and time.monotonic() < end:
            seen |= _tree(proc.pid)
            time.sleep(0.02)
        assert proc.poll() is None, f"the job ended before the {phase} phase: {proc.stderr}"
        assert ready(run, marks), f"the {phase} phase never came"
        seen |= _tree(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
        t0 = time.monotonic()
        while proc.poll() is None and time.monotonic() - t0 < 30:
            seen |= _tree(proc.pid)
            time.sleep(0.02)
        took = time.monotonic() - t0
        _, err = proc.communicate(timeout=5)
    finally:
        proc.kill()
    end = time.monotonic() + 5  # a log watcher polls every 0.2 s once the agent has gone
    while [p for p in seen if alive(p)] and time.monotonic() < end:
        time.sleep(0.05)
    print(f"\nCtrl-C while {phase}: the launcher exited {proc.returncode} after {took:.2f} s; "
          f"{len(seen)} processes seen")
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    left = [p for p in seen if alive(p)]
    assert not left, f"processes left after Ctrl-C while {phase}: {left}"
    assert not leftovers(tmp) and not (run / "ranks" / "agent").exists()
    if (run / "summary.json").exists() and phase != "teardown":
        assert json.loads((run / "summary.json").read_text())["stopped"]["reason"] == "interrupted"
