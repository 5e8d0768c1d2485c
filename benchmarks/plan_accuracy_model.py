"""The model side of `plan_accuracy.py`: the measured runs merged into one row per (scenario,
strategy), each row's job config, the planner's prediction for it on the testbed's cluster, and
the calibration fit (`fit`) with the figures the analysis reports (`crossover`,
`recommended_hits`, `stats`). Pure functions of the raw file's runs and stored profiles: the
analysis (`plan_accuracy.py --analyse`) needs no testbed.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import os
import statistics
from pathlib import Path
from typing import Any

from polytrain.testbed import probes

# the probes' readers live in the package (polytrain/testbed/probes.py); named here for the analyses
_computing_ranks, _window = probes.computing_ranks, probes.steady_steps
probe_scales, probe_action_overheads = probes.probe_scales, probes.probe_action_overheads
probe_pass_overheads = probes.probe_pass_overheads

# the testbed's time per collective step, or (that, per message of a direct exchange or None[, a
# waiting pipeline stage's wake-up])
Hop = float | tuple[float, float | None] | list[Any]

MODELS = {
    "cnn": (["--model", "cnn", "--dataset", "digits"], 64),
    "vgg16": (["--model", "vgg16", "--set", "model.width=8", "--dataset", "synthetic-images"], 64),
    "gpt-mini": (["--model", "gpt-mini", "--dataset", "chars"], 32),
}
MACHINE_CORES = float(os.cpu_count() or 1)  # every emulated host shares this machine's cores


def merge_repeats(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (scenario, strategy): the median over repeats of each run's mean step time,
    with min-max and every repeat's value kept; peak RSS is the largest seen. Failed runs (no
    measurement) are left out."""
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for r in runs:
        if "measured_step_s" not in r:
            continue
        groups.setdefault((r["scenario"], r["strategy"]), []).append(r)
    rows = []
    for (_, _), group in sorted(groups.items()):
        # each run's mean step (after warm-up): what the planner predicts, periodic syncs included
        per = [statistics.mean(_window(g)) for g in group]
        rows.append(
            {
                **group[0],
                "measured_step_s": statistics.median(per),
                "repeat_step_s": per,
                "measured_min_ms": min(per) * 1e3,
                "measured_max_ms": max(per) * 1e3,
                "repeats": len(per),
                "peak_rss_bytes": max(g["peak_rss_bytes"] for g in group),
                "load_start": statistics.median(g["load_start"] for g in group),
            }
        )
    return rows


def _config(row: dict[str, Any]) -> Any:
    key = (row["model"], row["strategy"], row["hosts"], json.dumps(row["options"], sort_keys=True))
    return _config_of(*key, row.get("batch"))


@functools.cache  # the fit prices every row thousands of times
def _config_of(model: str, strategy: str, hosts: int, options: str, batch: int | None = None) -> Any:
    from polytrain.config import load_config

    row = {"model": model, "strategy": strategy, "hosts": hosts, "options": json.loads(options)}

    args, default_batch = MODELS[row["model"]]
    over = {
        "model": args[1],
        "dataset": args[-1],
        "batch_size": batch or default_batch,
        "optimizer": "sgd",
        "strategy": row["strategy"],
        "procs": row["hosts"],
    }
    sets = [args[3]] if row["model"] == "vgg16" else []
    sets += [f"{k}={v}" for k, v in row["options"].items()]
    cfg = load_config(None, over, sets)
    # the strategy's own check, as `train` runs it before any process: a scenario it refuses is
    # an error here, not a prediction of a run that cannot start
    from polytrain.strategies.base import make_strategy

    make_strategy(cfg.strategy, cfg.options).check(cfg, hosts)
    return cfg


def model_config(model: str) -> Any:
    return _config({"model": model, "strategy": "single", "hosts": 1, "options": {}})


def testbed_calibration(
    hosts: int, per_host: float, call: float, hop: Hop = 0.0,
    models: dict[str, dict[str, Any]] | None = None,
) -> Any:
    """The calibration a testbed run of ``hosts`` emulated hosts is priced with (on
    `testbed_hardware`, what ``polytrain plan --cluster HARDWARE --calibration FILE`` reads): the
    machine's cores less ``per_host`` per
    host shared by all ranks, ``call`` seconds per collective call, ``hop`` seconds per collective
    step (measured by `plan_hops.py`), or (that, seconds per message of a direct exchange, None:
    the same; and a waiting pipeline stage's late wake-up; `plan_hops.testbed_hops`); ``models``:
    each model's terms (`plan.calibration.ModelTerms`)."""
    from polytrain.plan.calibration import ModelTerms
    from polytrain.plan.predict import testbed_calibration as construction

    collective, direct, wake = (*hop, 0.0)[:3] if isinstance(hop, list | tuple) else (hop, None, 0.0)
    cal = construction(cores=max(0.25, MACHINE_CORES - per_host * hosts), call_s=call, hop_s=collective,
                       direct_hop_s=direct, wake_s=wake or 0.0)
    return cal.model_copy(update={"models": {m: ModelTerms(**t) for m, t in (models or {}).items()}})


def testbed_hardware(hosts: int, nic: str, alpha: float) -> Any:
    """The testbed's hardware at ``nic`` with ``alpha`` added to every message's α."""

    from polytrain.cost.cluster import parse_rate
    from polytrain.plan.predict import testbed_hardware as described

    hw = described(hosts, {"hosts": hosts, "rate_bits_per_s": 8 * parse_rate(nic, "nic")})
    return dataclasses.replace(hw, procs_per_host=1, latency_s=hw.latency_s + alpha,
                               intra_latency_s=hw.intra_alpha + alpha)


def testbed_cluster(
    hosts: int, nic: str, alpha: float, per_host: float, call: float, hop: Hop = 0.0
) -> Any:
    """The emulated cluster a testbed run is priced on (`testbed_calibration` on `testbed_hardware`)."""
    return testbed_calibration(hosts, per_host, call, hop).cluster(testbed_hardware(hosts, nic, alpha))


def predict(
    rows: list[dict[str, Any]],
    profiles: dict[str, Any],
    scale: float | dict[str, float],
    alpha: float,
    per_host: float = 0.0,
    overhead: float | dict[str, float] = 0.0,
    pass_overhead: float | dict[str, float] = 0.0,
    call: float = 0.0,
    hop: Hop = 0.0,
    ps_request: float | dict[str, Any] = 0.0,
) -> None:
    """Predict every row in place, as ``polytrain plan --calibration`` prices it: the row's
    calibration (`testbed_calibration`) makes the scene, the strategy prices itself with the row's
    options (`plan.commands.price_one`, the function ``plan --strategy S --set ...`` calls).
    ``per_host``: the share of a core each emulated host's own processes take, so the ranks share
    ``MACHINE_CORES - per_host * hosts`` cores; ``scale`` (the compute scale), ``overhead`` (the
    pipeline executor's per action) and ``pass_overhead``: one number, or one per model; ``call``:
    a rank's own time per collective call; ``hop``: per collective step, measured, never fitted;
    ``ps_request``: a parameter server's own time per worker request, one number or one per model —
    a number (measured by the pass's parameter-server probes, `probe_ps_requests`) or a table by
    workers per server (`load_requests`, `request_at`) — never fitted."""
    for r in rows:
        cfg = _config(r)
        r["predicted_step_s"], r["predicted_memory_bytes"] = price_row(
            r, profiles, cfg, scale, alpha, per_host, overhead, pass_overhead, call, hop, ps_request)
        r["error"] = r["predicted_step_s"] / r["measured_step_s"] - 1


def row_calibration(r: dict[str, Any], scale: Any, alpha: float, per_host: float, overhead: Any,
                    pass_overhead: Any, call: float, hop: Hop, ps_request: Any) -> tuple[Any, Any]:
    """(the hardware, the calibration) row ``r`` is priced with."""
    per_pass = pass_overhead[r["model"]] if isinstance(pass_overhead, dict) else pass_overhead
    per_action = overhead[r["model"]] if isinstance(overhead, dict) else overhead
    k = scale[r["model"]] if isinstance(scale, dict) else scale
    forward, backward = (k, k) if isinstance(k, float | int) else k  # one scale, or (forward, backward)
    request = ps_request.get(r["model"], 0.0) if isinstance(ps_request, dict) else ps_request
    if isinstance(request, dict):  # a table by workers per server (`plan_ps_requests.py`)
        request = request_at(request, r["hosts"] - int(r.get("options", {}).get("servers", 1)))
    terms = {"compute_scale": backward, "forward_scale": forward, "action_overhead_s": per_action,
             "pass_overhead_s": per_pass, "ps_request_s": request}
    cal = testbed_calibration(r["hosts"], per_host, call, hop, {r["model"]: terms})
    return testbed_hardware(r["hosts"], r["nic"], alpha), cal


def price_row(r: dict[str, Any], profiles: dict[str, Any], cfg: Any, *params: Any) -> tuple[float, float]:
    """(predicted step seconds, peak memory bytes) of row ``r``: `row_calibration`'s scene priced by
    the function ``polytrain plan --strategy`` calls."""
    from polytrain.plan.commands import price_one

    hardware, cal = row_calibration(r, *params)
    scene = cal.scene(profiles[r["model"]], hardware, cfg.batch_size)
    c = price_one(scene, cfg.strategy, [f"{k}={v}" for k, v in r.get("options", {}).items()], None)
    return c.estimate.step_s, c.estimate.peak_memory_bytes


# the calibrated numbers, in `predict`'s order, each with the grid it is chosen from
GRIDS: tuple[tuple[float, ...], ...] = (
    tuple(0.1 * 1.12**i for i in range(32)),  # compute scale
    (0.0, 2e-4, 5e-4, 1e-3, 2e-3),  # extra α per message
    (0.0, 0.03, 0.06, 0.1, 0.15, 0.2, 0.25),  # share of a core per emulated host
    (0.0, 2.5e-4, 5e-4, 7.5e-4, 1e-3, 2e-3),  # pipeline executor, per action
    (0.0, 2.5e-4, 5e-4, 7.5e-4, 1e-3, 1.5e-3, 2e-3, 4e-3),  # other runtimes, per forward/backward pass
    (0.0, 5e-4, 1e-3, 1.5e-3, 2e-3, 3e-3, 4e-3),  # a rank's own time per collective call
)
# where the searches start (each number snapped to its grid): compute scale, per-action overhead and
# time per collective call low and high, as those three trade against each other
STARTS = [(s, 0.0, 0.0, a, 0.0, c) for s in (0.8, 1.0, 1.25) for a in (0.0, 1e-3) for c in (0.0, 2e-3)]


def fit(rows: list[dict[str, Any]], profiles: dict[str, Any],
        pass_overheads: dict[str, float] | None = None,
        scales: dict[str, Any] | None = None,
        action_overheads: dict[str, float] | None = None, hop: Hop = 0.0,
        ps_request: float | dict[str, float] = 0.0) -> tuple[Any, ...]:
    """(compute scale, extra α, cores taken per emulated host, per-action overhead of the pipeline
    executor, per-pass overhead of the other runtimes, time per collective call) minimising the
    mean |log(pred/meas)| on ``rows``: coordinate descent over `GRIDS` — each number in turn set to
    its grid value that scores best (the first of equal scores), sweeps repeated until none moves —
    from each of `STARTS`, the best end kept; ``pass_overheads``, ``scales`` (compute scales,
    `probe_scales`) and ``action_overheads`` (`probe_action_overheads`): measured per model, not
    fitted; ``hop``: the testbed's time per collective step (`plan_hops.py`), measured, held;
    ``ps_request``: a parameter server's own time per request (`probe_ps_requests`), measured, held."""
    grids: list[tuple[Any, ...]] = list(GRIDS)
    if scales is not None:
        grids[0] = (scales,)
    if action_overheads is not None:
        grids[3] = (action_overheads,)
    if pass_overheads is not None:
        grids[4] = (pass_overheads,)

    def score(y: list[Any]) -> float:
        predict(rows, profiles, *y, hop=hop, ps_request=ps_request)
        return statistics.mean(abs(math.log(r["predicted_step_s"] / r["measured_step_s"])) for r in rows)

    ends = []
    for start in STARTS:
        # each number starts at its grid value nearest the start (a measured dict: its only value)
        x = [g[0] if len(g) == 1 else min(g, key=lambda v, s=s: abs(v - s))
             for g, s in zip(grids, start, strict=True)]
        best, moved = score(x), True
        while moved:
            moved = False
            for i, grid in enumerate(grids):
                for v in grid:
                    y = [*x[:i], v, *x[i + 1:]]
                    s = score(y)
                    if s < best - 1e-12:
                        best, x, moved = s, y, True
        ends.append((best, x))
    return tuple(min(ends, key=lambda e: e[0])[1])


def crossover(rows: list[dict[str, Any]], key: str) -> int | None:
    """First host count (VGG-16, 1gbit) at which owt or mesh steps faster than allreduce."""
    for hosts in (2, 4, 8):
        here = {
            r["strategy"]: r[key]
            for r in rows
            if r["model"] == "vgg16" and r["nic"] == "1gbit" and r["hosts"] == hosts
        }
        hybrid = min((here[s] for s in ("owt", "mesh") if s in here), default=math.inf)
        if "allreduce" in here and hybrid < here["allreduce"]:
            return hosts
    return None


def recommended_hits(rows: list[dict[str, Any]], scenarios: set[int]) -> tuple[int, int, list[str]]:
    hits, lines = 0, []
    for i in sorted(scenarios):
        here = [r for r in rows if r["scenario"] == i]
        pick = min(here, key=lambda r: r["predicted_step_s"])
        fastest = min(here, key=lambda r: r["measured_step_s"])
        ok = pick["measured_step_s"] <= 1.05 * fastest["measured_step_s"]
        hits += ok
        lines.append(
            f"scenario {i}: recommended {pick['strategy']}, measured fastest {fastest['strategy']}"
            f" ({pick['measured_step_s'] / fastest['measured_step_s']:.2f}x its step) "
            f"{'hit' if ok else 'MISS'}"
        )
    return hits, len(scenarios), lines


def add_display_columns(rows: list[dict[str, Any]]) -> None:
    """The results table's columns of a predicted row: milliseconds, error in %, options as text."""
    for r in rows:
        r["measured_ms"], r["predicted_ms"] = r["measured_step_s"] * 1e3, r["predicted_step_s"] * 1e3
        r["error_%"] = round(100 * r["error"], 1)
        r["opts"] = " ".join(f"{k}={v}" for k, v in r["options"].items())


def stats(errors: list[float]) -> dict[str, float]:
    a = [abs(e) for e in errors]
    return {"median_abs_error": statistics.median(a), "max_abs_error": max(a), "n": len(a)}


def stored_profiles(raw: dict[str, Any]) -> dict[str, Any]:
    """Per model, the median of its stored profiles (`cost.profile.median_of`): a pass profiles
    before each repeat round, so the median follows the machine over the pass (a file with one
    profile per model, as every pass before 2026-11-29 05:00, gives that profile unchanged)."""
    from polytrain.cost.profile import Profile, median_of

    taken: dict[str, list[Any]] = {}
    for entry in raw.get("profiles", []):
        taken.setdefault(entry["model"], []).append(Profile.from_json(entry["profile"]))
    return {m: median_of(ps) for m, ps in taken.items()}


def probe_ps_requests(raw: dict[str, Any], profiles: dict[str, Any], params: tuple[Any, ...],
                      hop: Hop = 0.0) -> dict[str, float]:
    """Per model, a parameter server's own time per worker request measured instead of fitted: the
    median over the pass's parameter-server probes (`plan_accuracy_runs.PROBE`: one worker, one
    server, 2 hosts at 1 Gbit/s, one request per step) of the probe's step less its price with
    none (`predict` with ``params``, the other numbers of the analysis); 0 where the step is the
    quicker. Empty for a pass without probes."""
    taken: dict[str, list[float]] = {}
    for probe in raw.get("probes", []):
        if probe.get("strategy") != "ps" or "measured_step_s" not in probe:
            continue
        beyond = excess_over_price(probe, profiles, params, hop)
        taken.setdefault(probe["model"], []).append(max(0.0, beyond))
    return {m: statistics.median(v) for m, v in sorted(taken.items())}


def load_requests(paths: list[Path]) -> dict[str, dict[int, float]]:
    """model → workers per server → a server's own time per request, from `plan_ps_requests.py`
    results files: per (model, workers) the median over all their runs of the run's excess over
    its price / workers (runs of the same measurement pooled), never below 0."""
    pooled: dict[tuple[str, int], list[float]] = {}
    for path in paths:
        for r in json.loads(Path(path).read_text())["runs"]:
            pooled.setdefault((r["model"], int(r["workers"])), []).append(r["excess_s"] / r["workers"])
    table: dict[str, dict[int, float]] = {}
    for (model, workers), v in sorted(pooled.items()):
        table.setdefault(model, {})[workers] = max(0.0, statistics.median(v))
    return table


def request_at(table: dict[Any, float], workers: int) -> float:
    """The time per request of a server of ``workers`` workers from a table by workers (keys int or
    their strings, as JSON keeps them): the measured value where there is one, linear between the
    two measured counts around it, the nearest measured count's beyond them."""
    points = sorted((int(w), float(v)) for w, v in table.items())
    if not points:
        return 0.0
    if workers <= points[0][0]:
        return points[0][1]
    for (w0, v0), (w1, v1) in itertools.pairwise(points):
        if workers <= w1:
            return v0 + (v1 - v0) * (workers - w0) / (w1 - w0)
    return points[-1][1]


def excess_over_price(run: dict[str, Any], profiles: dict[str, Any], params: tuple[Any, ...],
                      hop: Hop = 0.0) -> float:
    """A run's measured step less its price with no parameter-server request time (`predict` with
    ``params``: compute scale, extra α, cores per host, per action, per pass, per call)."""
    row = dict(run)
    predict([row], profiles, *params, hop=hop)
    return float(row["measured_step_s"] - row["predicted_step_s"])


# the compute scales' source in a fit's summary when the probes measured forward and backward apart
SPLIT = "probes, forward and backward apart"
# the executor's per-action time's source in a fit's summary when the pipeline probes measured it
PIPE_PROBES = "pipeline probes"
# the runtimes' per-pass time's source in a fit's summary when the step probes measured it
STEP_PROBES = "step probes"
# a parameter server's time per request's source in a fit's summary when the ps probes measured it
PS_PROBES = "parameter-server probes"
