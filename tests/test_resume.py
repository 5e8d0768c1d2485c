"""Checkpoint -> resume equals an uninterrupted run, through the CLI a user would type."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import assert_same_params, load_model, read_summary, run_cli, step_losses

pytestmark = pytest.mark.slow  # every test here starts processes

JOB = ["--strategy", "allreduce", "--procs", "2", "--model", "mlp", "--batch-size", "32",
       "--optimizer", "momentum", "--lr", "0.05", "--no-report"]


def test_resume_equals_uninterrupted(tmp_path: Path) -> None:
    full = tmp_path / "full"
    r = run_cli("train", *JOB, "--steps", "12", "--out", str(full))
    assert r.returncode == 0, r.stderr
    part = tmp_path / "part"
    r = run_cli("train", *JOB, "--steps", "8", "--checkpoint-every", "4", "--out", str(part))
    assert r.returncode == 0, r.stderr
    assert (part / "checkpoints" / "LATEST").read_text() == "step-00000008"
    r = run_cli("train", "--resume", str(part), "--steps", "12", "--no-report")
    assert r.returncode == 0, r.stderr
    assert_same_params(load_model(part), load_model(full), atol=1e-6, rtol=1e-6)
    # the results cover the whole run: steps 1-8 of the first launch and 9-12 of the resume
    summary = read_summary(part)
    assert summary["steps_run"] == 12 and summary["samples"] == 12 * 32
    assert [r["from_step"] for r in summary["resumes"]] == [8]
    assert summary["wall_s"] > summary["resumes"][0]["t"] > 0
    full_losses, resumed = step_losses(full), step_losses(part)
    assert list(resumed) == list(range(1, 13))
    for s, v in resumed.items():
        assert abs(v - full_losses[s]) < 1e-6
    assert_each_step_once(part, 12)


def assert_each_step_once(run: Path, steps: int) -> None:
    """Every rank's event file, and metrics.jsonl per rank, hold steps 1..steps once each."""
    files = sorted((run / "ranks").glob("rank*.jsonl"))
    assert files
    for f in files:
        got = [json.loads(x)["step"] for x in f.read_text().splitlines() if '"event": "step"' in x]
        assert got == list(range(1, steps + 1)), f.name
    per_rank: dict[int, list[int]] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        ev = json.loads(line)
        if ev["event"] == "step":
            per_rank.setdefault(ev["rank"], []).append(ev["step"])
    assert per_rank and all(v == list(range(1, steps + 1)) for v in per_rank.values())


def test_resume_from_another_job_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "r"
    r = run_cli("train", *JOB, "--steps", "4", "--checkpoint-every", "2", "--out", str(run))
    assert r.returncode == 0, r.stderr
    r = run_cli("train", "--resume", str(run), "--model", "cnn")
    assert r.returncode == 2
    assert "belongs to another job" in r.stderr and "model: 'mlp' -> 'cnn'" in r.stderr
    r = run_cli("train", "--resume", str(tmp_path / "nowhere"))
    assert r.returncode == 2 and "not a polytrain run directory" in r.stderr


def test_resume_with_nothing_to_train_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    run = tmp_path / "r"
    r = run_cli("train", *JOB, "--steps", "4", "--checkpoint-every", "2", "--out", str(run))
    assert r.returncode == 0, r.stderr
    before = {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}
    for steps in ("2", "4"):  # fewer steps than the checkpoint's, and exactly as many
        r = run_cli("train", "--resume", str(run), "--steps", steps, "--no-report")
        assert r.returncode == 2, r.stderr
        assert "newest checkpoint is at step 4" in r.stderr and "nothing to train" in r.stderr
        assert "Traceback" not in r.stderr
    after = {p: p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}
    assert after == before


def test_corrupt_latest_checkpoint_falls_back_to_previous(tmp_path: Path) -> None:
    run = tmp_path / "r"
    r = run_cli("train", *JOB, "--steps", "8", "--checkpoint-every", "4", "--out", str(run))
    assert r.returncode == 0, r.stderr
    latest = run / "checkpoints" / "step-00000008" / "rank0.pt"
    latest.write_bytes(latest.read_bytes()[:-100])  # truncated: a half-written file
    r = run_cli("train", "--resume", str(run), "--steps", "10", "--no-report")
    assert r.returncode == 0, r.stderr
    assert "step-00000008 refused" in r.stderr and "resuming from step-00000004" in r.stderr
    assert list(step_losses(run)) == list(range(1, 11))  # 1-4 kept, 5-8 run again, 9-10 new
    assert_each_step_once(run, 10)
