"""The command line as a user meets it: the default job, listings, and every bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli

pytestmark = pytest.mark.slow  # every test here starts processes


def test_default_train_reaches_stated_accuracy(tmp_path: Path) -> None:
    r = run_cli("train", "--no-report", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1
    run = runs[0]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["strategy"] == "allreduce" and summary["world_size"] == 2
    assert summary["eval"]["accuracy"] >= 0.95
    for key in ("steps", "samples", "wall_s", "throughput_samples_per_s", "final_loss",
                "bytes_sent", "bytes_sent_per_sample", "peak_rss_bytes", "per_rank",
                "strategy_metrics"):
        assert key in summary
    assert (run / "config.toml").is_file() and (run / "metrics.jsonl").is_file()
    assert "Accuracy" in r.stdout and "samples/s" in r.stdout


def test_strategies_listing() -> None:
    r = run_cli("strategies")
    assert r.returncode == 0
    assert "allreduce" in r.stdout and "single" in r.stdout


BAD = [
    (["--strategy", "allreduc"], "Unknown strategy 'allreduc'.*Did you mean 'allreduce'"),
    (["--model", "resnet999"], "Unknown model 'resnet999'"),
    (["--dataset", "imagenet"], "Unknown dataset 'imagenet'"),
    (["--procs", "0"], "at least 1"),
    (["--procs", "3", "--batch-size", "64"], "multiple of 3"),
    (["--strategy", "single", "--procs", "2"], "exactly 1 process"),  # default --procs: runs on 1
    (["--model", "no_such_pkg.nets:make"], "no_such_pkg"),
    (["--model", "json:dumps"], "factory .json:dumps. requires argument .obj."),
    (["--config", "/nonexistent/job.toml"], "Cannot read config file"),
    (["--set", "bucket=1"], "unknown option 'bucket'.*bucket_mb"),
    (["--set", "model.widht=3"], "widht"),
    # issue 50 item 11: each refused before any process starts, in one line
    (["--config", sys.executable], "is not text"),
    (["--steps", "100000000000000000000"], "at most 1e\\+12 steps"),
    (["--out", ""], "--out is empty"),
    (["--cluster", ""], "--cluster is read by --strategy auto only"),
    (["--allow-inexact"], "--allow-inexact is read by --strategy auto only"),
    (["--dataset", "tests.bad_data:empty"], "inputs but 0 labels|train split is empty"),
    (["--dataset", "tests.bad_data:negative"], "labels include -1"),
    (["--dataset", "tests.bad_data:mismatch"], "32 inputs but 30 labels"),
    (["--dataset", "tests.bad_data:floats"], "train labels are torch.float"),
    (["--dataset", "tests.bad_data:tiny", "--model", "mlp"], "larger than the 3 training samples"),
    (["plan", "--cluster", ""], "--cluster is empty"),
    (["plan", "--cluster", "hosts=2,hosts=3"], "gives 'hosts' twice"),
    (["plan", "--cluster", "nic=1e400gbit"], "not a finite rate"),
    (["plan", "--cluster", "hosts=1000000000"], "the planner models at most 131,072"),
    (["testbed", "calibrate", "--model", "mlp", "--steps", "2", "--out", "c.json"], "--steps 2: a probe"),
    (["testbed", "calibrate", "--model", "resnet999", "--out", "c.json"], "Unknown model 'resnet999'"),
    (["testbed", "--hosts", "2", "--nic", "1gbit", "--calibration", "nope.json", "--", "train"],
     "--calibration nope.json: no such file"),
]
COMMANDS = ("plan", "testbed")


@pytest.mark.parametrize("args,message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_refused_before_any_process(tmp_path: Path, args: list[str], message: str) -> None:
    cmd = [] if args and args[0] in COMMANDS else ["train"]
    r = run_cli(*cmd, *args, cwd=tmp_path, env={"PYTHONPATH": str(ROOT)})
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    import re

    assert re.search(message, " ".join(r.stderr.split())), r.stderr
    assert not (tmp_path / "runs").exists()


def test_existing_run_is_never_overwritten(tmp_path: Path) -> None:
    out = tmp_path / "r"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    r = run_cli("train", "--out", str(out), cwd=tmp_path)
    assert r.returncode == 2 and "never overwrites" in r.stderr


def test_compare_runs_each_strategy_on_the_same_job(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    r = run_cli("compare", "--strategies", "single,allreduce", "--model", "mlp", "--steps", "30",
                "--eval-every", "10", "--target-accuracy", "0.5", "--out", str(out), "--no-report")
    assert r.returncode == 0, r.stderr
    data = json.loads((out / "compare.json").read_text())
    assert [s["strategy"] for s in data["strategies"]] == ["single", "allreduce"]
    assert [s["world_size"] for s in data["strategies"]] == [1, 2]
    assert all(s["samples"] == 30 * 64 for s in data["strategies"])
    # same job, synchronous strategies: the same final loss
    losses = [s["final_loss"] for s in data["strategies"]]
    assert abs(losses[0] - losses[1]) < 1e-4
    assert all(s["time_to_accuracy_s"] is not None for s in data["strategies"])
    for col in ("samples/s", "Final loss", "Accuracy", "Bytes/sample", "Peak memory", "Time to"):
        assert col in r.stdout


@pytest.mark.slow
def test_the_command_ends_without_the_interpreters_teardown_but_loses_nothing() -> None:
    """With torch loaded, `leave` skips Python's module teardown (seconds after a run) yet runs
    the exit handlers, flushes unterminated output and keeps the exit code."""
    code = ("import atexit, torch\n"
            "from polytrain.cli import leave\n"
            "atexit.register(lambda: print('handler ran', flush=True))\n"
            "print('no newline yet', end='')\n"
            "leave(3)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 3
    assert r.stdout == "no newline yethandler ran\n"
