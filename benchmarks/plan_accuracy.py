"""The planner against the testbed: predicted vs measured step time, recommended vs measured fastest.

Each scenario is a model on N emulated hosts (one rank per host) with NIC rate R; each of its
strategies is trained for ``--steps`` steps with ``polytrain testbed``; the measurement is the
median step time of the first training rank over the steps after the first two (metrics.jsonl).
Predictions are what `polytrain plan --cluster HARDWARE --calibration FILE --strategy S --set ...`
prints (`plan_accuracy_model.price_row`: the row's calibration makes the scene,
`plan.commands.price_one` prices it; a test checks the two agree) on a profile of each model
(`plan.predict.cached_profile`, one thread as testbed ranks run,
10 repeats, each layer's fastest) and the testbed's cluster (hosts, rate, ranks sharing the cores).
Before each repeat round every model is profiled in a fresh process, under the same lock and load as
the runs, and the profile stored in the raw file; the analysis prices with the median of each model's
stored profiles (`cost.profile.median_of`; every pass before 2026-11-29 stored one profile per model,
which the median leaves as it is), so ``--analyse`` recomputes from the file alone.

Calibration (`plan_accuracy_model.fit`): the even-numbered scenarios (at most half) fit five
numbers — a compute scale, an extra per-message latency, the share of a core each emulated host's
own processes take beside its rank (its torchrun agent, gloo's threads, the kernel's packet
processing on its links: the ranks share the machine's cores less that times the host count), the
pipeline executor's seconds per forward/backward action and the other runtimes' seconds per
forward/backward pass — by grid search on the
mean |log(pred/meas)|; the odd-numbered ones are held back and reported separately. Also: the
recommended strategy (best predicted among those measured) against the measured fastest, and the
VGG-16 MP–DP crossover (first host count at which a hybrid, owt or mesh, beats allreduce),
predicted and measured.

    # as root (the testbed), in chunks that each hold the benchmark lock at most ~28 minutes:
    .venv/bin/python benchmarks/plan_accuracy.py --repeats 5 \
        --budget-min 28 --no-analyse            # then the same with --resume, until all are done
    .venv/bin/python benchmarks/plan_accuracy.py --analyse   # recompute from the saved raw runs
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]

from plan_accuracy_model import (  # noqa: E402
    MACHINE_CORES,
    PIPE_PROBES,
    PS_PROBES,
    SPLIT,
    STEP_PROBES,
    add_display_columns,
    crossover,
    fit,
    load_requests,
    merge_repeats,
    model_config,
    predict,
    probe_action_overheads,
    probe_pass_overheads,
    probe_ps_requests,
    probe_scales,
    recommended_hits,
    stats,
    stored_profiles,
)
from plan_accuracy_runs import PROBES, run_one  # noqa: E402
from plan_accuracy_traces import write_compute, write_drift, write_executor  # noqa: E402
from plan_hops import testbed_hops  # noqa: E402

# (model, hosts, nic, [(strategy, --set options)])
SCENARIOS: list[tuple[str, int, str, list[tuple[str, dict[str, Any]]]]] = [
    (
        "cnn",
        2,
        "100mbit",
        [("allreduce", {}), ("ps", {"servers": 1}), ("gpipe", {"microbatches": 4}), ("layerwise", {})],
    ),
    (
        "cnn",
        4,
        "1gbit",
        [("allreduce", {}), ("ps", {"servers": 2}), ("1f1b", {"microbatches": 8}), ("owt", {})],
    ),
    ("cnn", 4, "100mbit", [("allreduce", {}), ("ps", {"servers": 2}), ("owt", {}), ("layerwise", {})]),
    (
        "cnn",
        8,
        "1gbit",
        [("allreduce", {}), ("ps", {"servers": 4}), ("owt", {}), ("local-sgd", {"period": 4})],
    ),
    (
        "vgg16",
        2,
        "1gbit",
        [
            ("allreduce", {}),
            ("gpipe", {"microbatches": 4}),
            ("owt", {}),
            ("mesh", {"dp": 1, "pp": 2}),
            ("pipedream", {}),
        ],
    ),
    (
        "vgg16",
        4,
        "1gbit",
        [
            ("allreduce", {}),
            ("mesh", {"dp": 2, "pp": 2}),
            ("owt", {}),
            ("ps", {"servers": 2, "sharding": "size"}),
        ],
    ),
    ("vgg16", 8, "1gbit", [("allreduce", {}), ("mesh", {"dp": 4, "pp": 2}), ("owt", {})]),
    (
        "vgg16",
        4,
        "100mbit",
        [("allreduce", {}), ("mesh", {"dp": 2, "pp": 2}), ("owt", {}), ("1f1b", {"microbatches": 8})],
    ),
    ("vgg16", 2, "100mbit", [("allreduce", {}), ("owt", {}), ("layerwise", {}), ("ps", {"servers": 1})]),
    (
        "gpt-mini",
        2,
        "1gbit",
        [("allreduce", {}), ("tensor", {}), ("gpipe", {"microbatches": 4}), ("ps", {"servers": 1})],
    ),
    (
        "gpt-mini",
        4,
        "1gbit",
        [("allreduce", {}), ("tensor", {}), ("mesh", {"dp": 2, "tp": 2}), ("1f1b", {"microbatches": 4})],
    ),
    (
        "gpt-mini",
        4,
        "100mbit",
        [("allreduce", {}), ("tensor", {}), ("mesh", {"dp": 2, "tp": 2}), ("layerwise", {})],
    ),
]
RAW = HERE / "results" / "plan_accuracy_raw.json"
PROFILES = Path(tempfile.gettempdir()) / "plan_accuracy_profiles"


def measure(
    steps: int, only: list[int] | None, repeats: int, resume: bool, budget_s: float = math.inf,
    scenarios: list[Any] = SCENARIOS, raw: Path = RAW,
) -> list[dict[str, Any]]:
    """Run every (scenario, strategy) ``repeats`` times, repeats interleaved (repeat r of every
    scenario before repeat r+1 of any), saving after each run; with ``resume`` the runs already in
    the raw file are kept and skipped, so a measurement can go in chunks (``--scenarios``, or
    ``--budget-min``: no run starts once the longest run so far would end past the budget)."""
    from harness import command_line, git_commit

    t0, longest = time.monotonic(), 0.0

    old = json.loads(raw.read_text()) if raw.exists() and resume else {}
    rows, profiles, probes = old.get("runs", []), old.get("profiles", []), old.get("probes", [])
    done = {(r["scenario"], r["strategy"], r.get("repeat", 0)) for r in rows if "measured_step_s" in r}
    rows = [r for r in rows if "measured_step_s" in r]
    todo = list(range(len(scenarios))) if only is None else only  # in the order given
    for rep in range(repeats):
        if all((i, s, rep) in done for i in todo for s, _ in scenarios[i][3]):
            continue
        for m in sorted({scenarios[i][0] for i in todo}):  # before each round, under the runs' lock
            profiles.append({"model": m, "round": rep, "time": time.time(), "load": os.getloadavg()[0],
                             "profile": _profile(m)})
            # and its compute inside testbed jobs (`PROBES`): how fast the same work runs in a run
            for strategy, opts, hosts, nic in PROBES:
                probes.append({"model": m, "round": rep, **run_one(m, hosts, nic, strategy, opts, steps)})
        for i in todo:
            model, hosts, nic, strategies, *batch = scenarios[i]  # a 5th item: its global batch
            for strategy, opts in strategies:
                if (i, strategy, rep) in done:
                    continue
                if time.monotonic() - t0 + longest > budget_s:
                    print(f"budget reached: stopping before scenario {i} {strategy} repeat {rep}")
                    return rows
                t1 = time.monotonic()
                got = run_one(model, hosts, nic, strategy, opts, steps, *batch)
                row = {"scenario": i, "repeat": rep, **got}
                longest = max(longest, time.monotonic() - t1)
                print(json.dumps({k: v for k, v in row.items() if k != "step_times"}), flush=True)
                rows.append(row)
                record = {"steps": steps, "commit": git_commit(), "command": command_line(), "runs": rows}
                raw.write_text(json.dumps({**record, "profiles": profiles, "probes": probes}, indent=1))
    return rows


def _profile(model: str) -> dict[str, Any]:
    """A fresh profile of ``model`` (its JSON), measured in a new process with an empty cache."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "POLYTRAIN_CACHE": cache}
        subprocess.run([sys.executable, __file__, "--profile-model", model], check=True, env=env)
        (path,) = Path(cache, "profiles").glob("*.json")
        return dict(json.loads(path.read_text()))


def analyse(raw: dict[str, Any], name: str = "plan_accuracy", profiled: dict[str, Any] | None = None,
            pass_overheads: dict[str, float] | None = None, fit_scale: bool = False,
            one_scale: bool = False, fit_action: bool = False, fit_pass: bool = False,
            hops_from: Path | None = None, no_requests: bool = False,
            requests_from: list[Path] | None = None, wake: bool = False) -> None:
    """Fit on the calibration half, report both halves; ``profiled``: the raw file whose stored
    profiles to use (default ``raw``'s own); ``pass_overheads``: per model, measured
    (`plan_overhead.py`), instead of one fitted number; the compute scale is measured by the
    pass's probes (`probe_scales`) where it has them, unless ``fit_scale``: the forward's and the
    backward's apart, unless ``one_scale`` (one for both, as analyses before 2026-11-29 noon); the
    pipeline executor's time per action by the pass's pipeline probes (`probe_action_overheads`)
    where it has them, unless ``fit_action`` (one fitted number, as analyses before 2026-11-29 16:00);
    the other runtimes' time per pass by the pass's step probes (`probe_pass_overheads`) where it has
    them and ``pass_overheads`` is not given, unless ``fit_pass`` (one fitted number, as before
    2026-11-29 19:00); ``hops_from``: a `plan_hops.py` results file whose time per collective step
    (`plan_hops.collective_hop`) prices the testbed (`Cluster.hop_s`; none before 2026-11-29 22:00);
    a parameter server's own time per request by the pass's ps probes (`probe_ps_requests`), unless
    ``no_requests`` (none, as analyses before 2026-11-30 01:30) or ``requests_from``:
    `plan_ps_requests.py` results files, pooled into a table by workers per server (`load_requests`)."""
    from harness import write_results

    from polytrain.plan.predict import cached_profile

    rows = merge_repeats(raw["runs"])
    failed = [r for r in raw["runs"] if "measured_step_s" not in r]
    # each model profiled once in a fresh process (its peak-RSS growth is the runtime memory), cached
    # in PROFILES: the runs' own cache was written by rank 0 after training, which already held it all
    os.environ["POLYTRAIN_CACHE"] = str(PROFILES)
    profiles = stored_profiles(profiled or raw)
    for m in sorted({r["model"] for r in rows} - set(profiles)):  # a raw file from before they were stored
        subprocess.run([sys.executable, __file__, "--profile-model", m], check=True)
        profiles[m] = cached_profile(model_config(m))
    calib = {i for i in range(len(SCENARIOS)) if i % 2 == 0}
    held = set(range(len(SCENARIOS))) - calib
    measured = {} if fit_scale else probe_scales(raw, profiles, split=not one_scale)
    actions = {} if fit_action else probe_action_overheads(raw)
    passes = pass_overheads or ({} if fit_pass else probe_pass_overheads(raw))
    # ``wake``: a waiting pipeline stage's late wake-up too, from the record's shift cases
    hop = testbed_hops(json.loads(hops_from.read_text()), wake) if hops_from else 0.0
    calibration = [r for r in rows if r["scenario"] in calib]
    params = fit(calibration, profiles, passes or None, measured or None, actions or None, hop)
    # a parameter server's own time per request, from the pass's ps probes priced with the rest of
    # the fit; the fit then made again with it held (it prices the calibration half's ps pairs)
    requests: dict[str, Any] = {}
    if requests_from:
        requests = dict(load_requests(requests_from))
    elif not no_requests:
        requests = dict(probe_ps_requests(raw, profiles, params, hop))
    if requests:
        params = fit(calibration, profiles, passes or None, measured or None, actions or None, hop,
                     requests)
    scale, alpha, per_host, overhead, per_pass, call = params
    predict(rows, profiles, scale, alpha, per_host, overhead, per_pass, call, hop, requests)
    add_display_columns(rows)
    for r in rows:
        r["set"] = "calibration" if r["scenario"] in calib else "held back"
    held_stats = stats([r["error"] for r in rows if r["set"] == "held back"])
    calib_stats = stats([r["error"] for r in rows if r["set"] == "calibration"])
    hits, total, lines = recommended_hits(rows, {r["scenario"] for r in rows})
    held_hits, held_total, _ = recommended_hits(rows, held & {r["scenario"] for r in rows})
    mem = stats([r["predicted_memory_bytes"] / r["peak_rss_bytes"] - 1 for r in rows])
    by_strategy = {  # signed median error per strategy over all scenarios: which terms are off
        s: round(statistics.median(r["error"] for r in rows if r["strategy"] == s), 3)
        for s in sorted({r["strategy"] for r in rows})
    }
    compute = write_compute(raw, profiles, name) if raw.get("probes") else None
    executor = write_executor(raw, name)  # the executor's own time per action, from the traces
    summary = {
        "in_job_compute": compute,
        "executor_time": executor,
        "calibration": {
            "compute_scale": scale,
            "compute_scale_from": ("probes" if one_scale else SPLIT) if measured else "fit",
            "extra_alpha_s": alpha,
            "cores_per_host": per_host,
            "machine_cores": MACHINE_CORES,
            "action_overhead_s": overhead,
            "action_overhead_from": PIPE_PROBES if actions else "fit",
            "pass_overhead_s": per_pass,
            "pass_overhead_from": ("plan_overhead" if pass_overheads else STEP_PROBES) if passes else "fit",
            "call_s": call,
            "hop_s": hop,
            "hop_from": hops_from.name if hops_from else None,
            "ps_request_s": requests,
            "ps_request_from": (" + ".join(f.name for f in requests_from) if requests_from else PS_PROBES)
            if requests else None,
            "scenarios": sorted(calib),
        },
        "held_back": held_stats,
        "calibration_fit": calib_stats,
        "recommended_is_fastest": f"{hits}/{total}",
        "recommended_is_fastest_held_back": f"{held_hits}/{held_total}",
        "crossover_hosts_measured": crossover(rows, "measured_step_s"),
        "crossover_hosts_predicted": crossover(rows, "predicted_step_s"),
        "memory_vs_peak_rss": mem,
        "median_signed_error_by_strategy": by_strategy,
        "runs": sum(r["repeats"] for r in rows),
        "repeats_min_max": [min(r["repeats"] for r in rows), max(r["repeats"] for r in rows)],
        "load_start_min_max": [
            round(min(g["load_start"] for g in raw["runs"] if "measured_step_s" in g), 1),
            round(max(g["load_start"] for g in raw["runs"] if "measured_step_s" in g), 1),
        ],
        "failed_runs": failed,
        "loadavg_end": os.getloadavg(),
        "git_commit": subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
    }
    notes = "\n".join([f"Summary: {json.dumps(summary)}", "", *lines])
    cols = [
        "scenario",
        "set",
        "model",
        "hosts",
        "nic",
        "strategy",
        "opts",
        "measured_ms",
        "measured_min_ms",
        "measured_max_ms",
        "repeats",
        "predicted_ms",
        "error_%",
        "load_start",
    ]
    write_results(
        name,
        [
            {
                k: r.get(k)
                for k in [*cols, "repeat_step_s", "peak_rss_bytes", "predicted_memory_bytes", "load_end"]
            }
            for r in rows
        ],
        cols,
        notes,
    )
    path = HERE / "results" / f"{name}.json"
    record = json.loads(path.read_text())
    record["summary"] = summary
    record["steps"] = raw["steps"]
    path.write_text(json.dumps(record, indent=1))


def main() -> None:
    from harness import add_common_flags, hold_lock

    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument(
        "--analyse", action="store_true", help="only recompute from results/plan_accuracy_raw.json"
    )
    p.add_argument("--profile-model", help=argparse.SUPPRESS)  # analyse: profile in a fresh process
    p.add_argument("--raw", help="measure into / analyse this raw file "
                   "(default results/plan_accuracy_raw.json)")
    p.add_argument("--name", default="plan_accuracy", help="results file name of the analysis")
    p.add_argument("--profiles-from", help="use the profiles stored in this raw file")
    p.add_argument("--pass-overhead-from", help="analyse: each model's per-pass overhead from this "
                   "plan_overhead.json (its 2-host row), not fitted")
    p.add_argument("--fit-scale", action="store_true", help="analyse: fit the compute scale even "
                   "where the pass measured it (its probes)")
    p.add_argument("--one-scale", action="store_true", help="analyse: one measured compute scale for "
                   "forward and backward (as before 2026-11-29 noon), not each its own")
    p.add_argument("--fit-action", action="store_true", help="analyse: fit the pipeline executor's "
                   "time per action even where the pass's pipeline probes measured it")
    p.add_argument("--fit-pass", action="store_true", help="analyse: fit the runtimes' time per "
                   "pass even where the pass's step probes measured it")
    p.add_argument("--hops-from", help="analyse: price each collective step with the time this "
                   "plan_hops.py results file measured (Cluster.hop_s)")
    p.add_argument("--wake", action="store_true", help="analyse: price a waiting pipeline stage's "
                   "late wake-up with the --hops-from record's shift cases (Cluster.wake_s)")
    p.add_argument("--no-requests", action="store_true", help="analyse: no parameter-server time "
                   "per request (as before 2026-11-30 01:30), even where the pass's ps probes measure it")
    p.add_argument("--requests-from", nargs="+", help="analyse: price a parameter server's time per "
                   "request from these plan_ps_requests.py results files (their runs pooled), by "
                   "workers per server, not the ps probes")
    p.add_argument("--drift-from", help="analyse: compare each pair's measured step with this earlier "
                   "raw file's (and each model's profile), → results/<name>_drift.md")
    p.add_argument("--scenarios", help="measure only these scenario numbers, in this order, e.g. 5,3")
    p.add_argument("--repeats", type=int, default=5, help="runs per (scenario, strategy), interleaved")
    p.add_argument("--resume", action="store_true", help="keep and skip the runs already in the raw file")
    p.add_argument("--no-analyse", action="store_true", help="measure only (a chunk); analyse later")
    p.add_argument("--budget-min", type=float, default=math.inf,
                   help="start no run that could end after this many minutes (a chunk under a lock)")
    add_common_flags(p)
    a = p.parse_args()
    hold_lock(a.lock)
    if a.wake and not a.hops_from:
        p.error("--wake prices the wake-up from the --hops-from record's shift cases: give --hops-from FILE")
    if a.requests_from and a.no_requests:
        p.error("--requests-from prices the servers' request time and --no-requests prices none: give one")
    if a.profile_model:
        from polytrain.plan.predict import cached_profile

        os.environ.setdefault("POLYTRAIN_CACHE", str(PROFILES))
        cached_profile(model_config(a.profile_model), repeats=10)
        return
    if not a.analyse:
        only = [int(x) for x in a.scenarios.split(",")] if a.scenarios else None
        measure(a.steps, only, a.repeats, a.resume, 60 * a.budget_min, raw=Path(a.raw) if a.raw else RAW)
        if a.no_analyse:
            return
    raw = Path(a.raw) if a.raw else RAW
    profiled = json.loads(Path(a.profiles_from).read_text()) if a.profiles_from else None
    measured = None
    if a.pass_overhead_from:
        rows = json.loads(Path(a.pass_overhead_from).read_text())["rows"]
        measured = {r["model"]: r["per_pass_overhead_ms"] / 1e3 for r in rows if r["hosts"] == 2}
    runs = json.loads(raw.read_text())
    analyse(runs, a.name, profiled, measured, a.fit_scale, a.one_scale, a.fit_action, a.fit_pass,
            Path(a.hops_from) if a.hops_from else None, a.no_requests,
            [Path(f) for f in a.requests_from] if a.requests_from else None, a.wake)
    if a.drift_from:
        write_drift(json.loads(Path(a.drift_from).read_text()), runs, a.name)


if __name__ == "__main__":
    main()
