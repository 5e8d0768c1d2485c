"""The profiler the planner reads: `polytrain profile` (in-process) and the local α–β (2 processes)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from polytrain.cli import main
from polytrain.plan.commbench import fit_alpha_beta, measure_comm
from polytrain.plan.profile import Profile


def test_profile_cli_writes_a_reusable_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cnn.json"
    assert main(["profile", "--model", "cnn", "--batch-size", "32", "--no-comm", "--out", str(out)]) == 0
    prof = Profile.load(out)
    assert prof.model == "cnn" and prof.batch_size == 32 and prof.task == "classify"
    assert [r.name for r in prof.layers] == ["conv1", "conv2", "fc1", "head"]
    assert all(r.forward_s > 0 and r.backward_s > 0 for r in prof.layers)
    assert all(0 <= r.forward_fixed_s <= r.forward_s for r in prof.layers)
    assert prof.param_bytes == 38_282 * 4  # the zoo's cnn
    assert [r.optimizer_bytes for r in prof.layers] == [2 * r.param_bytes for r in prof.layers]  # adam
    assert prof.fc_start == 2
    assert sum(math.prod(s) for _, s in prof.params) == 38_282
    # the planner reads it offline
    assert main(["plan", "--profile", str(out), "--cluster", "hosts=2,nic=1gbit", "--json"]) == 0
    assert '"strategy"' in capsys.readouterr().out


def test_fit_alpha_beta_by_hand() -> None:
    fit = fit_alpha_beta([0.0, 1e6, 2e6], [1e-3, 2e-3, 3e-3])  # 1 ms + S / (1 GB/s)
    assert fit["alpha_s"] == pytest.approx(1e-3) and fit["bytes_per_s"] == pytest.approx(1e9)


@pytest.mark.slow
def test_measure_comm_two_real_processes() -> None:
    result = measure_comm(repeats=3)
    for kind in ("p2p", "allreduce"):
        assert result[kind]["bytes_per_s"] > 1e6 and result[kind]["alpha_s"] >= 0
    assert len(result["samples"]["p2p_s"]) == len(result["samples"]["sizes"])
