"""Plain torchrun runs the same job; with --max-restarts a killed rank's job resumes and ends
with exactly the parameters of an undisturbed run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import polytrain
from tests.conftest import ROOT, assert_same_params, load_model, read_summary
from tests.faults.probes import assert_emptied

pytestmark = pytest.mark.slow  # every test here starts processes

JOB = ["--model", "mlp", "--batch-size", "32", "--optimizer", "momentum", "--lr", "0.05",
       "--no-report"]


def _torchrun(*args: str, restarts: int = 0, tmp: Path | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **({"TMPDIR": str(tmp)} if tmp else {})}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "--max-restarts", str(restarts), "-m", "polytrain", "train", *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_torchrun_entry_point_runs_a_two_process_job(tmp_path: Path) -> None:
    out, tmp = tmp_path / "tr", tmp_path / "tmp"
    tmp.mkdir()
    p = _torchrun(*JOB, "--steps", "10", "--out", str(out), tmp=tmp)
    stdout, stderr = p.communicate(timeout=180)
    assert p.returncode == 0, stderr
    # torchrun's own /tmp/torchelastic_* log tree: removed by a rank's watcher once torchrun ends
    assert_emptied(tmp)
    s = read_summary(out)
    assert s["world_size"] == 2 and s["steps_run"] == 10 and s["bytes_sent"] > 0
    assert s["prediction"]["modelled"] and s["prediction"]["step_s"] > 0  # added by rank 0's CLI
    assert "throughput" in stdout.lower()


def _wait_step(path: Path, step: int, timeout: float = 90) -> int:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists():
            evs = [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")]
            if any(e["event"] == "step" and e["step"] >= step for e in evs):
                return next(e["pid"] for e in evs if e["event"] == "process")
        time.sleep(0.05)
    raise AssertionError(f"step {step} never reached")


def test_killed_rank_restarts_and_resumes_exactly(tmp_path: Path) -> None:
    ref = tmp_path / "ref"  # the undisturbed run, through the local launcher (same rank code)
    polytrain.train(model="mlp", batch_size=32, optimizer="momentum", lr=0.05,
                    procs=2, steps=120, out=str(ref))
    run = tmp_path / "run"
    p = _torchrun(*JOB, "--steps", "120", "--checkpoint-every", "20", "--out", str(run), restarts=1)
    try:
        # Step lines reach the file in batches (at most FLUSH_EVERY_S late), so the kill lands
        # some steps after 30: any checkpoint before the end will do.
        pid = _wait_step(run / "ranks" / "rank1.jsonl", 30)
        os.kill(pid, signal.SIGKILL)
        _, stderr = p.communicate(timeout=240)
    finally:
        p.kill()
    assert p.returncode == 0, stderr
    events = [json.loads(x) for x in (run / "ranks" / "rank1.jsonl").read_text().splitlines()]
    assert [e["generation"] for e in events if e["event"] == "process"] == [0, 1]
    starts = [e["first_step"] for e in events if e["event"] == "start"]
    # resumed from a checkpoint, not from scratch
    assert starts[0] == 1 and starts[1] in (21, 41, 61, 81, 101)
    assert_same_params(load_model(run), load_model(ref), atol=1e-6, rtol=1e-6)
    # the restarted generation's steps replace the killed one's: each step once, whole run
    for rank in (0, 1):
        log = (run / "ranks" / f"rank{rank}.jsonl").read_text().splitlines()
        assert [json.loads(x)["step"] for x in log if '"event": "step"' in x] == list(range(1, 121))
    s = read_summary(run)
    assert s["steps_run"] == 120 and s["samples"] == 120 * 32 and len(s["resumes"]) == 1
