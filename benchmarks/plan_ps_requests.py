"""A parameter server's own time per worker request on the testbed, measured at length and at several
worker counts: what `Scene.ps_request_s` prices (a server takes its workers' requests one at a time,
so a BSP step pays workers × the time per request beyond its messages and its update).

    sudo .venv/bin/python benchmarks/plan_ps_requests.py [--models cnn,gpt-mini,vgg16] [--workers 1,2,4]
        [--nic 1gbit] [--steps 60] [--repeats 5]
        [--frozen benchmarks/results/plan_accuracy_1129f_1130e.json]
        [--profiles-from benchmarks/results/plan_accuracy_raw_1129f.json] [--name plan_ps_requests]

Per model and worker count W: the real runtime (`polytrain testbed -- train --strategy ps --set servers=1`,
one server and W workers, one emulated host each), ``--steps`` steps (the first 2 left out), models
and W counts interleaved over ``--repeats`` rounds. Each run's median step less its price with no request
time — `plan_accuracy_model.predict` with the ``--frozen`` fit's numbers, the compute scale its
round's one-worker run of the model measured (its worker's traced forward and backward over the
profile, as a pass's ps probe does) and the time per collective step of that fit — is the excess;
excess / W is the time per request. If the form holds, excess grows in proportion to W and excess / W holds
still across W. The summary's table (model → W → time per request) prices the testbed's servers
by their workers (`plan_accuracy_model.request_at`; `plan_accuracy.py --requests-from`).
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
    p.add_argument("--models", default="cnn", help="comma-separated: cnn, gpt-mini, vgg16")
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--nic", default="1gbit")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--frozen", type=Path, default=HERE / "results" / "plan_accuracy_1129f_1130e.json")
    p.add_argument("--profiles-from", type=Path, default=HERE / "results" / "plan_accuracy_raw_1129f.json",
                   help="the raw runs whose stored profiles price the runs (the fit's pass; raw files "
                        "are not kept in git: regenerate with plan_accuracy.py --raw PATH)")
    p.add_argument("--name", default="plan_ps_requests")
    a = p.parse_args()
    from plan_accuracy_model import stored_profiles

    calibration = json.loads(a.frozen.read_text())["summary"]["calibration"]
    profiles = stored_profiles(json.loads(a.profiles_from.read_text()))  # the fit's own profiles
    models = a.models.split(",")
    unknown = [m for m in models if m not in profiles]
    if unknown:
        raise SystemExit(f"--models {a.models}: no stored profile for {', '.join(unknown)} "
                         f"(known: {', '.join(sorted(profiles))})")
    counts = [int(w) for w in a.workers.split(",")]
    if 1 not in counts:
        raise SystemExit(f"--workers {a.workers}: include 1 (each round's one-worker run measures "
                         "the compute scale)")
    runs: list[dict[str, Any]] = []
    for rep in range(a.repeats):
        for model in models:
            for w in counts if rep % 2 == 0 else counts[::-1]:
                run = run_one(model, 1 + w, a.nic, "ps", {"servers": 1}, a.steps)
                if "measured_step_s" not in run:
                    raise SystemExit(f"{model}, {w} workers: the run failed: {run.get('error')}")
                run.update(workers=w, round=rep)
                runs.append(run)
                print(f"round {rep + 1}/{a.repeats}: {model}, {w} workers, step "
                      f"{run['measured_step_s'] * 1e3:.2f} ms", flush=True)
            mine = [r for r in runs if r["round"] == rep and r["model"] == model]
            scale = probe_scales({"probes": [r for r in mine if r["workers"] == 1]}, profiles, split=True)
            params = (scale, calibration["extra_alpha_s"], calibration["cores_per_host"],
                      calibration["action_overhead_s"], calibration["pass_overhead_s"], calibration["call_s"])
            for r in mine:
                r["excess_s"] = excess_over_price(r, profiles, params, calibration["hop_s"])
    rows = []
    for model in models:
        for w in counts:
            mine = [r for r in runs if r["workers"] == w and r["model"] == model]
            step = [r["measured_step_s"] * 1e3 for r in mine]
            excess = [r["excess_s"] * 1e3 for r in mine]
            per = [x / w for x in excess]
            rows.append({
                "model": model, "workers": w, "hosts": 1 + w, "nic": a.nic, "steps": a.steps,
                "step_ms": f"{statistics.median(step):.2f} ({min(step):.2f}–{max(step):.2f})",
                "excess_ms": f"{statistics.median(excess):.2f} ({min(excess):.2f}–{max(excess):.2f})",
                "per_request_ms": f"{statistics.median(per):.3f} ({min(per):.3f}–{max(per):.3f})",
                "per_request_s": statistics.median(per) / 1e3, "repeats": len(mine),
            })
    table = request_table(rows)
    cols = ["model", "workers", "hosts", "nic", "steps", "step_ms", "excess_ms", "per_request_ms", "repeats"]
    notes = (f"One server, W workers (one emulated host each) at {a.nic}; {a.steps} steps per run, the "
             f"first 2 left out; models and W interleaved over {a.repeats} rounds; shown: median (min–max) "
             f"over runs. excess = the run's median step less its price with no request time (fit of "
             f"{a.frozen.name}, the compute scale of the round's one-worker run of the model); per "
             f"request = excess / W. The summary's table (model → W → seconds per request, the median, "
             f"never below 0) is what `plan_accuracy_model.request_at` prices a server of W workers with.")
    write_results(a.name, rows, cols, notes, extra={"summary": {"per_request_s": table}, "runs": runs})


def request_table(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """model → workers (as a string, JSON's keys) → the median time per request, never below 0."""
    table: dict[str, dict[str, float]] = {}
    for r in rows:
        table.setdefault(r["model"], {})[str(r["workers"])] = max(0.0, r["per_request_s"])
    return table


if __name__ == "__main__":
    main()
