"""A failing, dying or hanging rank ends the whole job with a clear message — never a hang."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli

pytestmark = pytest.mark.slow  # every test here starts processes

FAULTY = '''
import os
import torch
from torch import nn

class Boom(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0
    def forward(self, x):
        self.calls += 1
        if os.environ.get("RANK") == "1" and self.calls == 4:
            raise ValueError("simulated fault in the user model")
        return x

def make():
    return [nn.Flatten(), Boom(), nn.Linear(64, 10)]
'''


def test_raising_rank_is_named_with_step_and_cause(tmp_path: Path) -> None:
    (tmp_path / "faulty.py").write_text(FAULTY)
    start = time.monotonic()
    r = run_cli("train", "--model", "faulty:make", "--steps", "50", "--out", str(tmp_path / "run"),
                "--no-report", cwd=tmp_path, env={"PYTHONPATH": f"{ROOT}:{tmp_path}"})
    assert r.returncode == 1
    assert "rank 1 failed at step 4: ValueError: simulated fault in the user model" in r.stderr
    assert "Traceback" not in r.stderr
    assert time.monotonic() - start < 60


def _start_long_job(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[str], Path]:
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "polytrain", "train", "--model", "mlp", "--steps", "1000000",
         "--out", str(run), "--no-report", *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, run


def _pid_after_steps(run: Path, rank: int, steps: int, timeout: float = 60) -> int:
    path = run / "ranks" / f"rank{rank}.jsonl"
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists():
            events = [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")]
            if sum(e["event"] == "step" for e in events) >= steps:
                return next(e["pid"] for e in events if e["event"] == "process")
        time.sleep(0.2)
    raise AssertionError(f"rank {rank} never reached step {steps}")


def test_killed_rank_ends_the_job(tmp_path: Path) -> None:
    proc, run = _start_long_job(tmp_path)
    try:
        pid = _pid_after_steps(run, 1, 5)
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=90)
        assert time.monotonic() - t0 < 60
    finally:
        proc.kill()
    assert proc.returncode == 1
    assert "rank 1 died (SIGKILL) after step" in err


def test_stopped_rank_is_reaped_within_timeout_plus_10_s_and_named(tmp_path: Path) -> None:
    """SIGSTOP rank 1: rank 0 times out after --timeout, the launcher kills the stopped rank at
    once (no grace: it cannot act on SIGTERM) and names it, not the rank that waited."""
    proc, run = _start_long_job(tmp_path, "--timeout", "5")
    pid = None
    try:
        pid = _pid_after_steps(run, 1, 5)
        os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=90)
        took = time.monotonic() - t0
        stat = Path(f"/proc/{pid}/stat")  # reaped, or a zombie: not running, not stopped
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    finally:
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.kill()
    assert took < 5 + 10, f"{took:.1f} s from SIGSTOP to the launcher's exit"
    assert proc.returncode == 1
    assert "The job failed: rank 1 stopped answering after step" in err
    assert "(its process was stopped (SIGSTOP)); rank 0 timed out waiting for it" in err
    assert "out of memory" not in err and "rank 0 failed" not in err


def test_script_without_main_guard_trains(tmp_path: Path) -> None:
    """Ranks start as fresh interpreters (as under torchrun): they never import the launching
    script, so a script that calls train() at import time, without a __main__ guard, works, and
    its own folder's model factory is importable in the ranks."""
    (tmp_path / "mynets.py").write_text(
        "from torch import nn\n"
        "def make():\n    return [nn.Flatten(), nn.Linear(64, 10)]\n")
    script = tmp_path / "unguarded.py"
    out = str(tmp_path / "run")
    script.write_text("import polytrain\n"
                      f"s = polytrain.train(procs=2, steps=3, model='mynets:make', out={out!r})\n"
                      "print('STEPS', s['steps'])\n")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert "STEPS 3" in r.stdout
