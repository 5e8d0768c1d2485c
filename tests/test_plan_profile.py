"""The profiler the planner reads: `polytrain profile` (in-process) and the local α–β (2 processes)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from polytrain.cli import main
from polytrain.cost.profile import Profile
from polytrain.plan.commbench import fit_alpha_beta, measure_comm
from tests.test_exposure import _listening, _socket_inodes, _tree


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
def test_measure_comm_two_real_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two real processes meet through a FileStore in a private (0700) temporary directory,
    removed afterwards, and listen on loopback only (gloo's sockets; no TCPStore: issue 50)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    seen: dict[str, Any] = {"modes": set(), "stores": False, "listening": set()}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for d in tmp_path.glob("polytrain-profile-*"):
                with contextlib.suppress(OSError):
                    seen["modes"] |= {stat.S_IMODE(x.stat().st_mode) for x in (d, d / "store")}
                    seen["stores"] |= (d / "store" / "ranks.store").exists()
            children = _tree(os.getpid()) - {os.getpid()}
            seen["listening"] |= _listening(_socket_inodes(children))
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = measure_comm(repeats=3, timeout_s=180)  # spawn and import: slow on a loaded machine
    finally:
        done.set()
        watcher.join()
    for kind in ("p2p", "allreduce"):
        assert result[kind]["bytes_per_s"] > 1e6 and result[kind]["alpha_s"] >= 0
    assert len(result["samples"]["p2p_s"]) == len(result["samples"]["sizes"])
    assert seen["stores"] and seen["modes"] == {0o700}
    assert not list(tmp_path.glob("polytrain-profile-*"))  # removed
    assert seen["listening"] and {host for host, _ in seen["listening"]} <= {"127.0.0.1"}


@pytest.mark.slow
def test_auto_runs_the_first_choice_and_every_run_records_a_prediction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POLYTRAIN_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "auto"
    args = ["train", "--strategy", "auto", "--procs", "2", "--steps", "5", "--out", str(out), "--no-report"]
    assert main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["strategy"] != "auto" and summary["world_size"] == 2
    pred = summary["prediction"]
    assert pred["modelled"] and pred["step_s"] > 0 and pred["peak_memory_bytes"] > 0
    assert pred["samples_per_s"] == pytest.approx(64 / pred["step_s"])
    assert list((tmp_path / "cache" / "profiles").glob("*.json"))  # profiled once, cached
    # a strategy the planner does not model says so instead of guessing
    other = tmp_path / "malt"
    assert (
        main(
            [
                "train",
                "--strategy",
                "malt",
                "--procs",
                "2",
                "--steps",
                "2",
                "--out",
                str(other),
                "--no-report",
            ]
        )
        == 0
    )
    assert json.loads((other / "summary.json").read_text())["prediction"] == {
        "modelled": False,
        "why": "the planner does not model 'malt' yet",
    }


def test_auto_refuses_strategy_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--strategy", "auto", "--set", "servers=2"]) == 2
    assert "chooses the strategy options itself" in capsys.readouterr().err
    assert main(["train", "--strategy", "allreduce", "--cluster", "hosts=2"]) == 2
    assert "--cluster is read by --strategy auto only" in capsys.readouterr().err


def _shifted(prof: Profile, factor: float) -> Profile:
    """``prof`` with every time multiplied by ``factor`` (a faster or slower moment of the machine)."""
    from dataclasses import replace

    times = ("forward_s", "backward_s", "forward_fixed_s", "backward_fixed_s")
    layers = tuple(replace(r, **{k: getattr(r, k) * factor for k in times}) for r in prof.layers)
    return replace(prof, layers=layers, optimizer_s=prof.optimizer_s * factor,
                   comm={"p2p": {"alpha_s": 1e-4 * factor, "bytes_per_s": 1e9 / factor}})


def test_median_of_profiles_takes_each_time_s_median(tmp_path: Path) -> None:
    from polytrain.cost.profile import median_of
    from polytrain.errors import ConfigError

    out = tmp_path / "cnn.json"
    assert main(["profile", "--model", "cnn", "--batch-size", "32", "--no-comm", "--out", str(out)]) == 0
    base = Profile.load(out)
    slow, fast, mid = _shifted(base, 1.5), _shifted(base, 0.7), _shifted(base, 1.1)
    med = median_of([slow, fast, mid])
    for got, want in zip(med.layers, mid.layers, strict=True):
        assert got.forward_s == pytest.approx(want.forward_s) and got.backward_s == want.backward_s
        assert got.forward_fixed_s == want.forward_fixed_s and got.activation_bytes == want.activation_bytes
    assert med.optimizer_s == mid.optimizer_s and med.comm["p2p"] == mid.comm["p2p"]
    assert median_of([base]) == base  # one profile: itself (the analyses of older passes unchanged)
    with pytest.raises(ConfigError, match="same model, batch"):
        median_of([base, Profile.from_json({**base.to_json(), "batch_size": 64})])


def test_profile_rounds_refuses_bad_counts_before_measuring(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "--model", "cnn", "--no-comm", "--rounds", "0"]) == 2
    err = capsys.readouterr().err
    assert "--rounds must be >= 1" in err and "got --rounds 0" in err and "Fix:" in err
    assert main(["profile", "--model", "cnn", "--no-comm", "--gap", "-1"]) == 2
    assert "--gap -1.0" in capsys.readouterr().err


def test_profile_rounds_writes_their_median(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cnn.json"
    args = ["profile", "--model", "cnn", "--batch-size", "16", "--no-comm", "--rounds", "3",
            "--out", str(out)]
    assert main(args) == 0
    assert "3 rounds: forward + backward" in capsys.readouterr().out
    prof = Profile.load(out)
    assert prof.model == "cnn" and all(r.forward_s > 0 for r in prof.layers)
