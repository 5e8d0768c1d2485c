"""Resumes that are exact or refused (issue 50, items 2 and 3): extending a finished run with
``--resume RUN --steps N`` equals the uninterrupted N-step run (the parameter server's final
checkpoint included: its workers pull at a checkpointed last step), and a run directory is
locked while a job writes it (a second launcher is refused in one line, naming the holder; a
lock left by a dead process is taken over)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from polytrain.errors import ConfigError
from polytrain.launch.lock import LOCK, hold_run_dir
from tests.conftest import ROOT, assert_same_params, load_model, read_summary, run_cli, step_losses

MLP = ["--model", "mlp", "--set", "model.hidden=16", "--batch-size", "16", "--optimizer", "momentum",
       "--lr", "0.05", "--no-report"]
JOBS = {
    "ps": ["--strategy", "ps", "--procs", "3", *MLP, "--set", "servers=1"],
    # one server, then extended with two: the final checkpoint re-sharded
    "ps-reshard": ["--strategy", "ps", "--procs", "3", *MLP, "--set", "servers=1"],
    "single": ["--strategy", "single", "--procs", "1", *MLP],
}


@pytest.mark.slow
@pytest.mark.parametrize("key", sorted(JOBS))
def test_extending_a_finished_run_equals_the_longer_run(tmp_path: Path, key: str) -> None:
    full, short = tmp_path / "full", tmp_path / "short"
    for out, steps in ((full, "6"), (short, "3")):
        r = run_cli("train", *JOBS[key], "--steps", steps, "--checkpoint-every", "3", "--out", str(out))
        assert r.returncode == 0, r.stderr
    more = ["--procs", "4", "--set", "servers=2", "--set", "sharding=size"] if key == "ps-reshard" else []
    r = run_cli("train", "--resume", str(short), "--steps", "6", *more, "--no-report")
    assert r.returncode == 0, r.stderr
    assert_same_params(load_model(short), load_model(full), atol=1e-6, rtol=1e-5)
    extended, uninterrupted = step_losses(short), step_losses(full)
    assert list(extended) == [1, 2, 3, 4, 5, 6]
    for s, v in extended.items():
        assert v == pytest.approx(uninterrupted[s], rel=1e-5, abs=1e-7)
    # item 4: the summary covers both launches, per segment and in total
    whole, ref = read_summary(short), read_summary(full)
    segments = whole["segments"]
    assert [(g["from_step"], g["to_step"]) for g in segments] == [(1, 3), (4, 6)]
    assert whole["samples"] == ref["samples"] == sum(g["samples"] for g in segments)
    assert whole["bytes_sent"] == sum(g["bytes_sent"] for g in segments)
    assert whole["wall_s"] == pytest.approx(sum(g["wall_s"] for g in segments))
    if key == "ps":  # the same traffic as the uninterrupted run, not the last launch's alone
        assert min(g["bytes_sent"] for g in segments) > 0
        assert whole["bytes_sent"] == pytest.approx(ref["bytes_sent"], rel=0.1)


def test_a_held_run_directory_is_refused_naming_its_holder(tmp_path: Path) -> None:
    with hold_run_dir(tmp_path):
        holder = json.loads((tmp_path / LOCK).read_text())
        assert holder["pid"] == os.getpid()
        with pytest.raises(ConfigError, match=rf"is in use by pid {os.getpid()} on "), \
                hold_run_dir(tmp_path):
            pass  # pragma: no cover
    with hold_run_dir(tmp_path):  # released: taken again
        pass


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path: Path) -> None:
    code = ("import sys, time; from pathlib import Path; from polytrain.launch.lock import hold_run_dir\n"
            "with hold_run_dir(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=f"pid {holder.pid}"), hold_run_dir(tmp_path):
            pass  # pragma: no cover
    finally:
        holder.kill()
        holder.wait()
    assert json.loads((tmp_path / LOCK).read_text())["pid"] == holder.pid  # the stale name stays
    with hold_run_dir(tmp_path):
        assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()


def _holder_pid(run: Path) -> int | None:
    try:
        return int(json.loads((run / LOCK).read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


@pytest.mark.slow
def test_two_resumes_of_one_run_at_once_one_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    r = run_cli("train", *JOBS["single"], "--steps", "4", "--checkpoint-every", "2", "--out", str(run))
    more = ["--steps", "40", "--checkpoint-every", "20", "--no-report"]
    assert r.returncode == 0, r.stderr
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "160"}
    args = [sys.executable, "-m", "polytrain", "train", "--resume", str(run), *more]
    first = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while _holder_pid(run) != first.pid:
            assert time.monotonic() < deadline and first.poll() is None, first.communicate()
            time.sleep(0.05)
        first.send_signal(signal.SIGSTOP)  # hold the first launcher (and its lock) still
        try:
            second = run_cli("train", "--resume", str(run), *more)
        finally:
            first.send_signal(signal.SIGCONT)
        assert second.returncode != 0
        line = [x for x in second.stderr.splitlines() if "in use by" in x]
        assert line and f"pid {first.pid}" in line[0], second.stderr
        assert "Traceback" not in second.stderr
        _, err = first.communicate(timeout=300)
        assert first.returncode == 0, err
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps_run"] == 40 and list(step_losses(run)) == list(range(1, 41))


@pytest.mark.slow
def test_soak_extend_a_finished_ps_run_with_two_resumes_at_once(tmp_path: Path) -> None:
    """The probe of issue 50 as a user would run it: a finished 200-step ps run extended to 400
    steps by two ``--resume`` started together. One holds the run directory, the other is
    refused in one line; the survivor's record is whole (every step in metrics.jsonl, a
    summary of the 400 steps over both launches) and its parameters are those of the
    uninterrupted 400-step run."""
    full, run = tmp_path / "full", tmp_path / "run"
    for out, steps in ((full, "400"), (run, "200")):
        r = run_cli("train", *JOBS["ps"], "--steps", steps, "--checkpoint-every", "100", "--out", str(out))
        assert r.returncode == 0, r.stderr
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "160"}
    args = [sys.executable, "-m", "polytrain", "train", "--resume", str(run), "--steps", "400",
            "--no-report"]
    both = [subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True) for _ in range(2)]
    try:
        errs = [p.communicate(timeout=300)[1] for p in both]
    finally:
        for p in both:
            p.kill()
    codes = sorted(p.returncode for p in both)
    refused = errs[[p.returncode for p in both].index(codes[1])]
    assert codes[0] == 0 and codes[1] != 0, errs
    assert [x for x in refused.splitlines() if "is in use by pid" in x], refused
    assert "Traceback" not in refused
    summary, ref = read_summary(run), read_summary(full)
    assert summary["steps_run"] == 400 and summary["stopped"]["reason"] == "completed"
    assert [(g["from_step"], g["to_step"]) for g in summary["segments"]] == [(1, 200), (201, 400)]
    assert summary["samples"] == ref["samples"]
    events = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for rank in (1, 2):  # the workers (rank 0 is the server)
        mine = [e["step"] for e in events if e["event"] == "step" and e["rank"] == rank]
        assert mine == list(range(1, 401)), f"rank {rank}: steps {mine[:3]}…{mine[-3:]}"
    assert_same_params(load_model(run), load_model(full), atol=1e-6, rtol=1e-5)
