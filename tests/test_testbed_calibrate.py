"""``polytrain testbed calibrate``: bad input refused before any testbed starts; on the testbed
(root), a real probe run of a tiny model writes a file ``polytrain plan --calibration`` reads and
prices with; ``polytrain testbed --calibration F -- train --strategy auto`` plans with it."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from polytrain.errors import ConfigError
from polytrain.plan.calibrate import parse_calibrate
from polytrain.testbed import netns
from tests.conftest import run_cli

NO_PRIVILEGE = netns.missing_privileges()
MLP = ["--model", "mlp", "--batch-size", "64"]


OUT = "{tmp}/cal.json"


@pytest.mark.parametrize(
    ("args", "rule"),
    [
        ([*MLP, "--steps", "2", "--out", OUT], r"--steps 2: a probe leaves out its first 2 steps"),
        ([*MLP, "--repeats", "0", "--out", OUT], r"--repeats 0: each probe runs at least once"),
        ([*MLP, "--nic", "fast", "--out", OUT], r"fast"),
        ([*MLP, "--out", "/nonexistent-dir/cal.json"], r"the folder /nonexistent-dir does not exist"),
        ([*MLP, "--out", "{tmp}"], r"is not a file name"),
        ([*MLP, "--hops", "/nonexistent/hops.json", "--out", OUT], r"is not a plan_hops results file"),
        (["--model", "resnet999", "--out", OUT], r"Unknown model 'resnet999'"),
        ([*MLP, "--set", "model.widht=3", "--out", OUT], r"widht"),
    ],
    ids=["steps", "repeats", "nic", "out-folder", "out-dir", "hops", "model", "model-option"],
)
def test_bad_input_is_one_line_before_any_testbed(tmp_path: Path, args: list[str], rule: str) -> None:
    with pytest.raises(ConfigError, match=rule) as e:
        parse_calibrate([a.format(tmp=tmp_path) for a in args])
    assert "\n" not in str(e.value)
    assert not (tmp_path / "cal.json").exists()


def test_a_bad_calibration_is_refused_before_any_host_starts(tmp_path: Path) -> None:
    from rich.console import Console

    from polytrain.cli import cmd_testbed

    bed = argparse.Namespace(hosts=2, nic="1gbit", latency=None, loss=None, procs_per_host=None,
                             calibration=str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match="no such file"):
        cmd_testbed(bed, ["train", "--strategy", "allreduce", "--procs", "2"], Console())


@pytest.mark.slow
@pytest.mark.skipif(NO_PRIVILEGE is not None, reason=str(NO_PRIVILEGE))
def test_calibrate_writes_a_file_that_plan_reads_and_prices_with(tmp_path: Path) -> None:
    """A real probe run (3 testbed jobs of a tiny MLP); the file validates, names the model's
    measured terms, and `polytrain plan --calibration` prices with exactly them."""
    from polytrain.cost.cluster import Cluster
    from polytrain.cost.profile import Profile
    from polytrain.plan.calibration import Calibration
    from polytrain.plan.commands import price_one

    cache = {"POLYTRAIN_CACHE": str(tmp_path / "cache")}
    cal_path = tmp_path / "cal.json"
    r = run_cli("testbed", "calibrate", *MLP, "--steps", "8", "--repeats", "1", "--out", str(cal_path),
                env=cache, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    cal = Calibration.load(cal_path)
    terms = cal.terms("mlp")
    assert terms.compute_scale > 0 and terms.forward_scale is not None
    assert terms.action_overhead_s > 0 and terms.pass_overhead_s >= 0
    assert cal.emulation is not None and cal.emulation.cores and cal.emulation.goodput < 1
    assert [p["strategy"] for p in cal.source["probes"]] == ["single", "gpipe", "local-sgd"]
    # the profile the probes were measured against (cached by the command), priced both ways
    prof = Profile.load(next((tmp_path / "cache" / "profiles").glob("*.json")))
    prof.save(tmp_path / "prof.json")
    cluster = "hosts=2,nic=1gbit"

    def plan(*extra: str) -> dict[str, float]:
        out = run_cli("plan", "--profile", str(tmp_path / "prof.json"), "--cluster", cluster, "--json",
                      *extra, env=cache)
        assert out.returncode == 0, out.stderr
        return {c["command"]: c["predicted_step_s"] for c in json.loads(out.stdout)
                if c["strategy"] == "allreduce" and not c["options"]}

    calibrated, physical = plan("--calibration", str(cal_path)), plan()
    (step,) = calibrated.values()
    (plain,) = physical.values()
    expected = price_one(cal.scene(prof, Cluster.parse(cluster), prof.batch_size), "allreduce", [], None)
    assert step == pytest.approx(expected.estimate.step_s, rel=1e-9)
    assert step != pytest.approx(plain, rel=1e-3)  # the file changed the price


@pytest.mark.slow  # profiles the model (seconds); no testbed is built
def test_auto_on_the_testbed_plans_with_the_calibration(tmp_path: Path) -> None:
    """``polytrain testbed --calibration F -- train --strategy auto`` resolves the strategy before any
    host starts, on the testbed's links priced with the file: a file that makes every data-parallel
    runtime's pass cost seconds (and the pipeline executor's actions nothing) moves the choice from
    a data-parallel strategy to a pipeline."""
    from polytrain.cli import build_parser
    from polytrain.plan.calibrate import resolve_auto
    from polytrain.plan.calibration import SCHEMA
    from polytrain.testbed.job import Bed

    def choose(cal: Path | None) -> tuple[str, str]:
        ns = build_parser().parse_args(["train", "--strategy", "auto", "--model", "mlp", "--procs", "2"])
        line = resolve_auto(ns, Bed(2, "1gbit"), 1, cal)
        assert ns.strategy != "auto" and not ns.allow_inexact
        return ns.strategy, line

    heavy = tmp_path / "cal.json"
    heavy.write_text(json.dumps({"schema": SCHEMA, "models": {"mlp": {"pass_overhead_s": 5.0}}}))
    plain, line = choose(None)
    chosen, line2 = choose(heavy)
    assert "the testbed's construction" in line and str(heavy) in line2
    from polytrain.strategies import get_strategy_class

    families = (get_strategy_class(plain).family, get_strategy_class(chosen).family)
    assert families == ("data", "pipeline"), (plain, chosen)
