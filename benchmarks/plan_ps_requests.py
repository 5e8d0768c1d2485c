"""A parameter server's own time per worker request on the testbed, measured at length and at several
worker counts: what `Scene.ps_request_s` prices (a server takes its workers' requests one at a time,
so a BSP step pays workers × the time per request beyond its messages and its update).

    sudo .venv/bin/python benchmarks/plan_ps_requests.py [--model cnn] [--workers 1,2,4]
        [--nic 1gbit] [--steps 60] [--repeats 5]
        [--frozen benchmarks/results/plan_accuracy_1129f_1130.json]
        [--profiles-from benchmarks/results/plan_accuracy_raw_1129f.json] [--name plan_ps_requests]

Per worker count W: the real runtime (`polytrain testbed -- train --strategy ps --set servers=1`,
one server and W workers, one emulated host each), ``--steps`` steps (the first 2 left out), W
counts interleaved over ``--repeats`` rounds. Each run's median step less its price with no request
time — `plan_accuracy_model.predict` with the ``--frozen`` fit's numbers, the compute scale its
round's one-worker run measured (its worker's traced forward and backward over the profile, as a
pass's ps probe does) and the time per collective step of that fit — is the excess; excess / W is
the time per request. If the form holds, excess grows in proportion to W and excess / W holds
still across W; the pass's ps probes (W = 1, 12 steps) read the same number from one short run each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from harness import write_results  # noqa: E402
from plan_accuracy_model import excess_over_price, probe_scales  # noqa: E402
from plan_accuracy_runs import run_one  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="cnn")
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--nic", default="1gbit")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--frozen", type=Path, default=HERE / "results" / "plan_accuracy_1129f_1130.json")
    p.add_argument("--profiles-from", type=Path, default=HERE / "results" / "plan_accuracy_raw_1129f.json",
                   help="the raw runs whose stored profiles price the runs (the fit's pass)")
    p.add_argument("--name", default="plan_ps_requests")
    a = p.parse_args()
    from plan_accuracy_model import stored_profiles

    calibration = json.loads(a.frozen.read_text())["summary"]["calibration"]
    profiles = stored_profiles(json.loads(a.profiles_from.read_text()))  # the fit's own profiles
    counts = [int(w) for w in a.workers.split(",")]
    if 1 not in counts:
        raise SystemExit(f"--workers {a.workers}: include 1 (each round's one-worker run measures "
                         "the compute scale)")
    runs: list[dict[str, Any]] = []
    for rep in range(a.repeats):
        for w in counts if rep % 2 == 0 else counts[::-1]:
            run = run_one(a.model, 1 + w, a.nic, "ps", {"servers": 1}, a.steps)
            if "measured_step_s" not in run:
                raise SystemExit(f"{w} workers: the run failed: {run.get('error')}")
            run.update(workers=w, round=rep)
            runs.append(run)
            print(f"round {rep + 1}/{a.repeats}: {w} workers, step {run['measured_step_s'] * 1e3:.2f} ms",
                  flush=True)
        mine = [r for r in runs if r["round"] == rep]
        scale = probe_scales({"probes": [r for r in mine if r["workers"] == 1]}, profiles, split=True)
        params = (scale, calibration["extra_alpha_s"], calibration["cores_per_host"],
                  calibration["action_overhead_s"], calibration["pass_overhead_s"], calibration["call_s"])
        for r in mine:
            r["excess_s"] = excess_over_price(r, profiles, params, calibration["hop_s"])
    rows = []
    for w in counts:
        mine = [r for r in runs if r["workers"] == w]
        step = [r["measured_step_s"] * 1e3 for r in mine]
        excess = [r["excess_s"] * 1e3 for r in mine]
        per = [x / w for x in excess]
        rows.append({
            "model": a.model, "workers": w, "hosts": 1 + w, "nic": a.nic, "steps": a.steps,
            "step_ms": f"{statistics.median(step):.2f} ({min(step):.2f}–{max(step):.2f})",
            "excess_ms": f"{statistics.median(excess):.2f} ({min(excess):.2f}–{max(excess):.2f})",
            "per_request_ms": f"{statistics.median(per):.3f} ({min(per):.3f}–{max(per):.3f})",
            "per_request_s": statistics.median(per) / 1e3, "repeats": len(mine),
        })
    cols = ["model", "workers", "hosts", "nic", "steps", "step_ms", "excess_ms", "per_request_ms", "repeats"]
    notes = (f"One server, W workers (one emulated host each) at {a.nic}; {a.steps} steps per run, the "
             f"first 2 left out; W interleaved over {a.repeats} rounds; shown: median (min–max) over "
             f"runs. excess = the run's median step less its price with no request time (fit of "
             f"{a.frozen.name}, the compute scale of the round's one-worker run); per request = excess / W.")
    write_results(a.name, rows, cols, notes, extra={"runs": runs})


if __name__ == "__main__":
    main()
