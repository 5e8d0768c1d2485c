"""Shared fixtures. Multi-process tests run with collective checks on: gloo silently accepts
mismatched collectives, and polytrain's check mode (POLYTRAIN_CHECK_COLLECTIVES=1) turns that into
an error. (PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL would too, but it crashes DDP on torch 2.13/CPU;
see polytrain/comm/accounted.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("POLYTRAIN_CHECK_COLLECTIVES", "1")
os.environ.setdefault("TORCH_DISTRIBUTED_DEBUG", "INFO")
os.environ.setdefault("POLYTRAIN_REPORT", "0")  # the API's plots cost seconds per run; CLI tests ask
ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 300,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m polytrain ARGS` as a user would run it; output captured."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "160", **(env or {})}
    return subprocess.run([sys.executable, "-m", "polytrain", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def read_summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def step_losses(run_dir: Path) -> dict[int, float]:
    """Global loss per step: the mean over ranks of each rank's loss on its part of the batch."""
    per: dict[int, list[float]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        ev = json.loads(line)
        if ev["event"] == "step":
            per.setdefault(ev["step"], []).append(ev["loss"])
    return {s: sum(v) / len(v) for s, v in sorted(per.items())}


def load_model(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "model.pt", weights_only=True)


def assert_same_params(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor],
                       atol: float = 1e-5, rtol: float = 1e-4) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=rtol, msg=f"parameter {k} differs")


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path
