"""Tier 1: a cluster is hardware; what an emulated cluster adds is a calibration file, validated and
applied by ``polytrain plan --calibration FILE``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from polytrain.cli import main
from polytrain.cost.cluster import CALIBRATED, Cluster
from polytrain.errors import ConfigError
from polytrain.plan.calibration import PHYSICAL, SCHEMA, Calibration, EmulatedCluster
from tests.test_plan_recommend import vgg_like

TESTBED = {"cores": 2, "burst_s": 0.004, "min_burst_bytes": 3028, "goodput": 0.95,
           "call_s": 1.5e-3, "hop_s": 1.3e-3, "direct_hop_s": 0.9e-3, "wake_s": 1e-3}


def _file(tmp_path: Path, data: object, name: str = "cal.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("field", CALIBRATED)
def test_a_cluster_refuses_what_only_an_emulator_needs(field: str) -> None:
    with pytest.raises(ConfigError, match=rf"'{field}' is not hardware.*--calibration FILE"):
        Cluster.parse(f"hosts=2,{field}=1ms")


def test_hardware_has_none_of_the_emulators_terms() -> None:
    hw = Cluster.parse("hosts=4,nic=1gbit,latency=10us")
    assert (hw.cores, hw.burst_bytes, hw.call_s, hw.hop_s, hw.direct_hop, hw.wake_s) == (None, 0, 0, 0, 0, 0)
    assert hw.contention(64) == 1.0 and hw.refilled(1e6) is hw
    assert "emulation" not in hw.to_json()


def test_a_calibration_adds_its_emulation_to_the_hardware(tmp_path: Path) -> None:
    cal = Calibration.load(_file(tmp_path, {"schema": SCHEMA, "emulation": TESTBED,
                                            "models": {"vgg16": {"compute_scale": 1.5,
                                                                 "action_overhead_s": 2e-4}}}))
    hw = Cluster.parse("hosts=4,nic=1gbit,latency=10us")
    cl = cal.cluster(hw)
    assert isinstance(cl, EmulatedCluster)
    assert cl.nic_bps == pytest.approx(1e9 / 8 * 0.95)  # the payload share of the shaped rate
    assert cl.burst_bytes == pytest.approx(max(3028, 1e9 / 8 * 0.004) * 0.95)
    assert (cl.cores, cl.call_s, cl.hop_s, cl.direct_hop, cl.wake_s) == (2, 1.5e-3, 1.3e-3, 0.9e-3, 1e-3)
    assert cl.contention(8) == 4.0 and (cl.hosts, cl.latency_s) == (4, hw.latency_s)
    assert "2 shared cores" in cl.describe() and cl.to_json()["emulation"]["hop_s"] == 1.3e-3
    prof = vgg_like()
    scene = cal.scene(prof, hw, 64, scale=2.0)
    assert scene.cluster == cl and scene.compute_scale == 3.0 and scene.action_overhead_s == 2e-4
    other = cal.scene(prof.__class__(**{**prof.__dict__, "model": "cnn"}), hw, 64)
    assert other.compute_scale == 1.0 and other.action_overhead_s == 0.0  # a model it does not name
    again = tmp_path / "again.json"
    cal.save(again)
    assert Calibration.load(again) == cal


def test_no_calibration_is_the_physical_model() -> None:
    hw = Cluster.parse("hosts=4,nic=1gbit")
    scene = PHYSICAL.scene(vgg_like(), hw, 64)
    assert scene.cluster is hw and scene.compute_scale == 1.0
    assert (scene.action_overhead_s, scene.pass_overhead_s, scene.ps_request_s) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize(
    ("content", "rule"),
    [
        (None, "no such file"),
        ("{not json", "not a JSON calibration file"),
        ([1, 2], "holds list"),
        ({"schema": "polytrain.calibration/0"}, "this polytrain reads 'polytrain.calibration/1'"),
        ({"schema": SCHEMA, "emulation": {"hop_s": -1}}, "finite number >= 0"),
        ({"schema": SCHEMA, "emulation": {"cores": 2, "hops": 1}}, "hops"),
        ({"schema": SCHEMA, "models": {"cnn": {"compute_scale": 0}}}, "greater than 0"),
        ({"schema": SCHEMA, "emulation": {"wake_s": 0.001}}, "no cores"),
    ],
)
def test_a_bad_calibration_file_is_one_line(tmp_path: Path, content: object, rule: str) -> None:
    path = tmp_path / "cal.json"
    if isinstance(content, str):
        path.write_text(content)
    elif content is not None:
        path.write_text(json.dumps(content))
    with pytest.raises(ConfigError, match=rule) as err:
        Calibration.load(path).cluster(Cluster.parse("hosts=2"))
    assert "\n" not in str(err.value)


def test_plan_prices_the_calibrated_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same profile and hardware, planned with and without a calibration: the emulator's
    per-step times and shared cores make every all-reduce slower (a shaper's bucket can make a
    lone message faster), and the table says what it priced."""
    prof = tmp_path / "p.json"
    vgg_like().save(prof)
    cal = _file(tmp_path, {"schema": SCHEMA, "emulation": TESTBED})
    base = ["plan", "--profile", str(prof), "--cluster", "hosts=4,nic=1gbit", "--json"]
    assert main(base) == 0
    plain = {c["command"]: c["predicted_step_s"] for c in json.loads(capsys.readouterr().out)}
    assert main([*base, "--calibration", str(cal)]) == 0
    calibrated = {c["command"]: c["predicted_step_s"] for c in json.loads(capsys.readouterr().out)}
    assert plain.keys() == calibrated.keys()
    reduced = [k for k in plain if "--strategy allreduce" in k]
    assert reduced and all(calibrated[k] > plain[k] for k in reduced)
    assert all(calibrated[k] == plain[k] for k in plain if "--strategy single" in k)
    assert main(["plan", "--profile", str(prof), "--cluster", "hosts=4,nic=1gbit", "--calibration",
                 str(cal), "--out", str(tmp_path / "out")]) == 0
    assert "2 shared cores" in capsys.readouterr().out
    assert main([*base, "--calibration", str(tmp_path / "none.json")]) == 2
    assert "no such file" in capsys.readouterr().err
