"""Checkpoint -> resume equals an uninterrupted run, through the CLI a user would type."""

from __future__ import annotations

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
    assert read_summary(part)["steps_run"] == 4
    full_losses, resumed = step_losses(full), step_losses(part)
    assert list(resumed) == [9, 10, 11, 12]
    for s, v in resumed.items():
        assert abs(v - full_losses[s]) < 1e-6


def test_resume_from_another_job_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "r"
    r = run_cli("train", *JOB, "--steps", "4", "--checkpoint-every", "2", "--out", str(run))
    assert r.returncode == 0, r.stderr
    r = run_cli("train", "--resume", str(run), "--model", "cnn")
    assert r.returncode == 2
    assert "belongs to another job" in r.stderr and "model: 'mlp' -> 'cnn'" in r.stderr
    r = run_cli("train", "--resume", str(tmp_path / "nowhere"))
    assert r.returncode == 2 and "not a polytrain run directory" in r.stderr


def test_corrupt_latest_checkpoint_falls_back_to_previous(tmp_path: Path) -> None:
    run = tmp_path / "r"
    r = run_cli("train", *JOB, "--steps", "8", "--checkpoint-every", "4", "--out", str(run))
    assert r.returncode == 0, r.stderr
    latest = run / "checkpoints" / "step-00000008" / "rank0.pt"
    latest.write_bytes(latest.read_bytes()[:-100])  # truncated: a half-written file
    r = run_cli("train", "--resume", str(run), "--steps", "10", "--no-report")
    assert r.returncode == 0, r.stderr
    assert "step-00000008 refused" in r.stderr and "resuming from step-00000004" in r.stderr
    assert list(step_losses(run)) == [5, 6, 7, 8, 9, 10]
