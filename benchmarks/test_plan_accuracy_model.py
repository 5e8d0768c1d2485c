"""The planner benchmark's own model (`plan_accuracy_model.py`): a parameter server's time per
request from the probes, the table by workers per server, and the blind sets drawn, not picked.
Run with the suite (pytest's testpaths include benchmarks/)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

from plan_accuracy_model import load_requests, predict, probe_ps_requests, request_at  # noqa: E402

from polytrain.cli import main  # noqa: E402
from polytrain.cost.profile import Profile  # noqa: E402


@pytest.mark.slow
def test_a_servers_time_per_request_is_measured_not_fitted(tmp_path: Path) -> None:
    out = tmp_path / "cnn.json"
    assert main(["profile", "--model", "cnn", "--batch-size", "64", "--no-comm", "--out", str(out)]) == 0
    profile = Profile.load(out)
    # a parameter server's time per request: each ps probe's step beyond its price, the median
    params = (1.0, 0.0, 0.06, 0.0, 0.0, 0.0)
    probe = {"model": "cnn", "strategy": "ps", "hosts": 2, "nic": "1gbit", "options": {"servers": 1}}
    row = {**probe, "measured_step_s": 1.0}
    predict([row], {"cnn": profile}, *params)
    priced = row["predicted_step_s"]
    ps_probes = [{**probe, "measured_step_s": priced + d} for d in (1e-3, 3e-3, -1e-3)]  # the last: 0
    requests = probe_ps_requests({"probes": [*ps_probes, {**probe}]}, {"cnn": profile}, params)
    assert requests == {"cnn": pytest.approx(1e-3)}  # median of 1, 3 and 0 ms; a failed probe left out
    assert probe_ps_requests({}, {"cnn": profile}, params) == {}
    # or a table by workers per server (`plan_ps_requests.py`): a server of W workers pays W times
    # its entry, JSON's string keys read as counts, between two counts linear, beyond them the nearest
    table = {"cnn": {"1": 2e-3, "2": 1e-3, "4": 1.5e-3}}
    assert [request_at(table["cnn"], w) for w in (1, 2, 3, 4, 8)] == pytest.approx(
        [2e-3, 1e-3, 1.25e-3, 1.5e-3, 1.5e-3])
    for servers, hosts, per in ((1, 3, 1e-3), (2, 6, 1.5e-3)):  # 2 and 4 workers per server
        bare = {**probe, "hosts": hosts, "options": {"servers": servers}, "measured_step_s": 1.0}
        served = dict(bare)
        predict([bare], {"cnn": profile}, *params)
        predict([served], {"cnn": profile}, *params, ps_request=table)
        assert served["predicted_step_s"] - bare["predicted_step_s"] == pytest.approx((hosts - servers) * per)
    # the table from plan_ps_requests.py's runs, two measurements pooled: median of excess / workers
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps({"runs": [{"model": "cnn", "workers": 2, "excess_s": 2e-3},
                                          {"model": "cnn", "workers": 2, "excess_s": 4e-3}]}))
    second.write_text(json.dumps({"runs": [{"model": "cnn", "workers": 2, "excess_s": 8e-3},
                                           {"model": "vgg16", "workers": 1, "excess_s": -1e-3}]}))
    assert load_requests([first, second]) == {"cnn": {2: pytest.approx(2e-3)}, "vgg16": {1: 0.0}}



def test_the_tenth_blind_set_is_the_draw() -> None:
    """`BLIND10` is what `plan_accuracy_draw.py --seed 10` draws: the set was not picked by hand."""
    import plan_accuracy_blind as blind
    from plan_accuracy_draw import draw

    assert draw(10, ["275mbit", "625mbit", "950mbit"]) == blind.BLIND10
    assert draw(11, ["325mbit", "675mbit", "875mbit"]) == blind.BLIND11
    # the twelfth: the pass's held-back half as it stands
    assert [blind.pa.SCENARIOS[i] for i in range(1, len(blind.pa.SCENARIOS), 2)] == blind.BLIND12
    assert blind.BLIND13 == blind.BLIND14 == blind.BLIND12  # the same half, measured afresh


@pytest.mark.parametrize(("strategy", "options"), [("gpipe", {"microbatches": 4}), ("allreduce", {}),
                                                   ("ps", {"servers": 2})])
def test_the_validation_scores_what_plan_prints(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                strategy: str, options: dict[str, int]) -> None:
    """The benchmark's prediction of a testbed row is `polytrain plan --cluster HARDWARE
    --calibration FILE --strategy S --set ... --json` on the row's hardware and calibration: the same
    pricing function, the same number."""
    from plan_accuracy_model import row_calibration

    from tests.test_plan_recommend import vgg_like

    profile = vgg_like()
    row = {"model": "vgg16", "strategy": strategy, "hosts": 4, "nic": "1gbit", "options": options,
           "measured_step_s": 1.0}
    params = (1.2, 2e-4, 0.06, 5e-4, 1e-3, 1.5e-3, (1.3e-3, 0.9e-3, 1e-3), 2e-4)
    predict([row], {"vgg16": profile}, *params)
    hardware, cal = row_calibration(row, *params)
    cal.save(tmp_path / "cal.json")
    profile.save(tmp_path / "vgg.json")
    cluster = (f"hosts={hardware.hosts},procs_per_host=1,nic={hardware.nic_bps * 8}bit,"
               f"intra={hardware.intra_bps}byte,latency={hardware.latency_s * 1e6}us,"
               f"intra_latency={hardware.intra_alpha * 1e6}us,collectives={hardware.collectives}")
    sets = [a for k, v in options.items() for a in ("--set", f"{k}={v}")]
    assert main(["plan", "--profile", str(tmp_path / "vgg.json"), "--cluster", cluster, "--calibration",
                 str(tmp_path / "cal.json"), "--strategy", strategy, *sets, "--batch-size", "64",
                 "--json"]) == 0
    (printed,) = json.loads(capsys.readouterr().out)
    assert printed["predicted_step_s"] == pytest.approx(row["predicted_step_s"], rel=1e-9)
    assert printed["peak_memory_bytes"] == pytest.approx(row["predicted_memory_bytes"], rel=1e-9)
