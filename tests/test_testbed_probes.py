"""What a calibration is measured from (`polytrain.testbed.probes`): a run's own trace
(`ranks/rank*.jsonl`) read into per-step compute (`span_stats`) and a pass's probes turned into a
measured compute scale (`probe_scales`), the executor's time per action and the runtimes' time per
pass. A real training run writes the trace; the figures are checked against the spans it holds."""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path

import pytest

from polytrain.cli import main
from polytrain.cost.profile import Profile
from polytrain.testbed import probes as pa
from polytrain.testbed.probes import probe_action_overheads, probe_scales


@pytest.fixture(scope="module")
def ps_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The probe's job (a worker and its server), as a local two-process run."""
    out = tmp_path_factory.mktemp("probe") / "run"
    args = ["train", "--strategy", "ps", "--procs", "2", "--model", "cnn", "--dataset", "digits",
            "--steps", "6", "--batch-size", "64", "--optimizer", "sgd", "--out", str(out),
            "--no-report", "--set", "servers=1"]
    assert main(args) == 0
    return out


def _spans(run: Path, rank: int) -> list[dict[str, object]]:
    lines = (run / "ranks" / f"rank{rank}.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e.get("event") == "span" and e.get("cat") == "compute"]


def test_span_stats_is_each_rank_compute_per_step_after_warm_up(ps_run: Path) -> None:
    stats = pa.span_stats(ps_run)
    assert set(stats) == {"rank1"}  # the server's spans carry no step: only the worker is timed
    worker = _spans(ps_run, 1)
    steps = sorted({int(e["step"]) for e in worker})
    for name in ("forward", "backward"):
        per = {s: sum(e["end"] - e["start"] for e in worker if e["name"] == name and e["step"] == s)
               for s in steps[2:]}
        assert stats["rank1"][name] == pytest.approx(statistics.median(per.values()), abs=2e-6)
    assert pa.span_stats(ps_run, skip=len(steps)) == {"rank1": {}}  # nothing left after the warm-up
    # each stepping rank's process CPU per step: the median difference of its step events' cpu_s
    events = [json.loads(line) for line in (ps_run / "metrics.jsonl").read_text().splitlines()]
    cpu = [e["cpu_s"] for e in events if e.get("event") == "step" and e["rank"] == 1]
    diffs = [b - a for a, b in itertools.pairwise(cpu)]
    assert all(d >= 0 for d in diffs)
    assert pa.cpu_per_step(ps_run)["rank1"] == pytest.approx(statistics.median(diffs[2:]), abs=2e-6)


def test_probe_scales_is_the_in_job_compute_over_the_profile(ps_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "cnn.json"
    assert main(["profile", "--model", "cnn", "--batch-size", "64", "--no-comm", "--out", str(out)]) == 0
    profile = Profile.load(out)
    stats = pa.span_stats(ps_run)
    fb = stats["rank1"]["forward"] + stats["rank1"]["backward"]
    slower = {"rank1": {"forward": 2 * stats["rank1"]["forward"], "backward": 2 * stats["rank1"]["backward"]}}
    probes = [{"model": "cnn", "spans": stats}, {"model": "cnn", "spans": {}},  # a failed probe: left out
              {"model": "cnn", "spans": slower}, {"model": "cnn", "spans": slower},
              # the pipeline probe's stages compute only their share: never a compute scale
              {"model": "cnn", "strategy": "gpipe", "spans": stats}, {"model": "cnn", "strategy": "gpipe",
                                                                       "spans": stats}]
    scales = probe_scales({"probes": probes}, {"cnn": profile})
    assert scales == {"cnn": pytest.approx(2 * fb / profile.forward_backward_s)}  # the median probe
    # forward and backward apart: each over the profile's own
    f = sum(layer.forward_s for layer in profile.layers)
    b = sum(layer.backward_s for layer in profile.layers)
    split = probe_scales({"probes": probes}, {"cnn": profile}, split=True)
    worker = stats["rank1"]
    assert split["cnn"] == pytest.approx((2 * worker["forward"] / f, 2 * worker["backward"] / b))
    assert probe_scales({}, {"cnn": profile}) == {}  # a pass from before the probes


def _two_rank_cnn(tmp_path: Path, strategy: str, steps: int, option: str) -> Path:
    """A local 2-process cnn run of ``strategy`` with one ``--set`` option; its run directory."""
    out = tmp_path / "run"
    args = ["train", "--strategy", strategy, "--procs", "2", "--model", "cnn", "--dataset", "digits",
            "--steps", str(steps), "--batch-size", "32", "--optimizer", "sgd", "--out", str(out),
            "--no-report", "--set", option]
    assert main(args) == 0
    return out


def test_executor_time_splits_a_pipeline_step(tmp_path: Path) -> None:
    """A real 2-stage gpipe run's trace: its receives are kept as ``comm:recv``, and each stage's own
    time is its step less its compute and its blocking receives, per forward or backward action."""
    from polytrain.testbed.probes import actions_per_step, executor_time

    out = _two_rank_cnn(tmp_path, "gpipe", 6, "microbatches=4")
    spans = pa.span_stats(out)
    assert set(spans) == {"rank0", "rank1"} and all("comm:recv" in s for s in spans.values())
    times = pa.step_times(out)
    run = {"scenario": 0, "model": "cnn", "hosts": 2, "nic": "local", "strategy": "gpipe",
           "options": {"microbatches": 4}, "spans": spans, "step_times": times, "measured_step_s": 0.1}
    before = {**run, "spans": {r: {k: v for k, v in s.items() if not k.startswith("comm:")}
                               for r, s in spans.items()}}
    rows = executor_time([run, before])  # a run without comm spans (before they were kept): left out
    assert [r["stage"] for r in rows] == ["rank0", "rank1"] and rows[0]["repeats"] == 1
    for row in rows:
        s = spans[row["stage"]]
        own = statistics.mean(times) - s["forward"] - s["backward"] - s["optimizer"] - s["comm:recv"]
        assert row["own_ms"] == pytest.approx(own * 1e3)
        assert row["own_per_action_ms"] == pytest.approx(own * 1e3 / 8, abs=1e-3)
    # the pass's pipeline probes → the executor's time per action per model, the compute probe ignored
    probe = {k: v for k, v in run.items() if k != "scenario"}
    ps_probe = {**probe, "strategy": "ps", "options": {"servers": 1}, "model": "vgg16"}
    measured = probe_action_overheads({"probes": [probe, ps_probe]})
    assert measured == {"cnn": pytest.approx(statistics.median(r["own_per_action_ms"] for r in rows) / 1e3)}
    assert probe_action_overheads({}) == {}  # a pass from before the pipeline probes
    assert actions_per_step("1f1b", {"microbatches": 8}) == 16
    assert actions_per_step("mesh", {"dp": 2, "pp": 2}) == 4 and actions_per_step("pipedream", {}) == 2


def test_step_probe_gives_the_runtimes_time_per_pass(tmp_path: Path) -> None:
    """A real local-sgd run that never averages (the step probe's job): its steady steps hold no
    exchange (the one average, after the last step, is left out), so the step less its compute is
    the runtime's own time, half of it per pass."""
    from polytrain.testbed.probes import probe_pass_overheads, steady_steps

    out = _two_rank_cnn(tmp_path, "local-sgd", 8, "period=0")
    spans = pa.span_stats(out)
    assert set(spans) == {"rank0", "rank1"}
    times = pa.step_times(out)
    probe = {"model": "cnn", "hosts": 2, "strategy": "local-sgd", "options": {"period": 0},
             "spans": spans, "step_times": times, "measured_step_s": 0.1}
    assert steady_steps(probe) == times[:-1]  # the last step's average left out
    compute = statistics.median(s["forward"] + s["backward"] + s["optimizer"] for s in spans.values())
    own = (statistics.mean(times[:-1]) - compute) / 2
    ps_probe = {**probe, "strategy": "ps", "options": {"servers": 1}}  # not a step probe: ignored
    slower = {**probe, "step_times": [t + 0.002 for t in times]}
    measured = probe_pass_overheads({"probes": [probe, ps_probe, slower, slower]})
    assert measured == {"cnn": pytest.approx(max(0.0, own + 0.001))}  # the median probe
    assert probe_pass_overheads({}) == {}  # a pass from before the step probes


def test_collective_hop_is_the_median_collective_step() -> None:
    """`collective_hop`: the median per-step time over the all-reduce and all-gather cases;
    the p2p chain (one message in flight) is not a collective step."""
    from polytrain.testbed.probes import collective_hop, hop_table, messages

    rows = [
        {"op": "allreduce", "hosts": 4, "message_bytes": 1024, "hop_s": 1.2e-3},
        {"op": "allreduce", "hosts": 8, "message_bytes": 512, "hop_s": 1.4e-3},
        {"op": "allgather", "hosts": 4, "message_bytes": 1024, "hop_s": 1.0e-3},
        {"op": "p2p", "hosts": 4, "message_bytes": 4096, "hop_s": 0.0},
    ]
    assert collective_hop({"hops": hop_table(rows)}) == pytest.approx(1.2e-3)
    ops = ("allreduce", "allgather", "p2p", "direct", "shift", "relay", "posted_shift")
    assert [messages(op, 8) for op in ops] == [14, 7, 8, 7, 1, 8, 1]


def test_span_stats_keeps_the_ddp_hooks_all_reduce_per_step(tmp_path: Path) -> None:
    """The DDP hook's all-reduce span carries the step whose backward ran it, so a run's trace
    statistics hold its time per step beside the compute (it ends inside that step)."""
    out = _two_rank_cnn(tmp_path, "allreduce", 6, "bucket_mb=25")
    spans = pa.span_stats(out)
    times = pa.step_times(out)
    for rank in ("rank0", "rank1"):
        assert 0 < spans[rank]["comm:allreduce"] < max(times)
    events = [json.loads(line) for line in (out / "ranks" / "rank0.jsonl").read_text().splitlines()]
    calls = [e for e in events if e.get("event") == "span" and e.get("name") == "allreduce"]
    assert sorted({e["step"] for e in calls}) == list(range(1, 7))  # one bucket per step, each tagged
