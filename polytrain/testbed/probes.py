"""What a calibration is measured from: a run directory's own records read into step times, CPU
and compute per step (`step_times`, `cpu_per_step`, `span_stats`); probe runs turned into a model's
compute scale, the pipeline executor's time per action and the other runtimes' time per pass
(`probe_scales`, `probe_action_overheads`, `probe_pass_overheads`); and the testbed's time per
message of a collective from the message-chain measurements (`collective_hop`, `testbed_hops`).
The planner's testbed benchmarks (`benchmarks/plan_*.py`) drive the runs; these read them.
"""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path
from typing import Any

Row = dict[str, Any]
PIPELINES = ("gpipe", "1f1b", "pipedream", "layerwise", "mesh")


def step_times(run_dir: Path, skip: int = 2) -> list[float]:
    """Seconds between consecutive steps of the first rank that trains, the first ``skip`` dropped."""
    steps = [e for e in map(json.loads, (run_dir / "metrics.jsonl").open()) if e.get("event") == "step"]
    first = min(e["rank"] for e in steps)  # rank 0 may be a server (ps): the first rank that steps
    t = [e["t"] for e in steps if e["rank"] == first]
    return [b - a for a, b in itertools.pairwise(t)][skip:]


def cpu_per_step(run_dir: Path, skip: int = 2) -> dict[str, float]:
    """Per rank (``rank0``, ...), the median CPU seconds its process spent per step (all threads:
    the step events' ``cpu_s``), the first ``skip`` steps dropped; empty for a run without them."""
    per: dict[int, list[float]] = {}
    for e in map(json.loads, (run_dir / "metrics.jsonl").open()):
        if e.get("event") == "step" and "cpu_s" in e:
            per.setdefault(e["rank"], []).append(e["cpu_s"])
    return {f"rank{r}": round(statistics.median(d[skip:]), 6)
            for r, c in sorted(per.items()) if len(d := [b - a for a, b in itertools.pairwise(c)]) > skip}


def span_stats(run_dir: Path, skip: int = 2) -> dict[str, dict[str, float]]:
    """Per rank (``rank1``, ...), each compute span's seconds per step — forward, backward,
    optimizer, a pipeline's actions summed over its micro-batches — and each communication span's,
    named ``comm:<name>`` (a pipeline's blocking ``comm:recv``, its ``comm:send`` from post to
    completion), the median over the steps after the first ``skip``: how fast the run's own compute
    went and how long it waited, beside its step time."""
    out: dict[str, dict[str, float]] = {}
    for path in sorted((run_dir / "ranks").glob("rank*.jsonl")):
        per: dict[str, dict[int, float]] = {}
        for e in map(json.loads, path.open()):
            timed = e.get("event") == "span" and isinstance(e.get("step"), int)
            if timed and e.get("cat") in ("compute", "comm"):
                name = e["name"] if e["cat"] == "compute" else f"comm:{e['name']}"
                steps = per.setdefault(name, {})
                steps[e["step"]] = steps.get(e["step"], 0.0) + e["end"] - e["start"]
        if not per:
            continue
        first = min(min(steps) for steps in per.values())
        kept = {name: [v for k, v in steps.items() if k >= first + skip] for name, steps in per.items()}
        out[path.stem] = {name: round(statistics.median(v), 6) for name, v in kept.items() if v}
    return out


def steady_steps(run: dict[str, Any]) -> list[float]:
    """The step intervals a run's mean is taken over. local-sgd averages after every ``period``-th
    step and after the last: whole periods ending at the last step (the run's step count is a
    multiple of the period) hold one average per period, as the planner amortises it (period 0: the
    steps before the one average after the last). A
    parameter-server worker's last step sends its push without waiting and pulls nothing: left out."""
    times = list(run["step_times"])
    if run["strategy"] == "ps" and len(times) > 1:
        times = times[:-1]  # the last step pushes without waiting and pulls nothing: not a steady step
    period = int(run["options"].get("period", 4)) if run["strategy"] == "local-sgd" else 1
    if period == 0 and len(times) > 1:
        return times[:-1]  # averages once, after the last step: priced as no exchange per step
    return times[len(times) % period :] if len(times) >= period else times


def computing_ranks(probe: dict[str, Any]) -> list[dict[str, float]]:
    """The span statistics of a probe's ranks that ran a forward and a backward (not a server)."""
    return [s for s in (probe.get("spans") or {}).values() if "forward" in s and "backward" in s]


def probe_scales(raw: dict[str, Any], profiles: dict[str, Any], split: bool = False) -> dict[str, Any]:
    """Per model, the compute scale measured instead of fitted: the median over the pass's probes
    (`plan_accuracy_runs.PROBE`, one testbed job per model before each repeat round; the pipeline
    probes left out) of the worker's forward + backward per step as its own trace timed it, over
    ``profiles``' forward + backward (the probe's global batch is the profile's); with ``split``, a
    (forward, backward) pair, each over the profile's own. Empty for a pass without probes."""
    taken: dict[str, list[tuple[float, float]]] = {}
    for probe in raw.get("probes", []):
        # the compute probe only: a ps worker beside its server (`plan_accuracy_runs.PROBE`) or a
        # single rank (`plan.calibrate.probes_for`)
        if probe.get("strategy", "ps") not in ("ps", "single"):
            continue
        worker = computing_ranks(probe)
        if worker:  # the one rank that computes: the server only applies
            taken.setdefault(probe["model"], []).append((worker[0]["forward"], worker[0]["backward"]))
    out: dict[str, Any] = {}
    for m, v in sorted(taken.items()):
        prof = profiles[m]
        if split:
            f = sum(layer.forward_s for layer in prof.layers)
            b = sum(layer.backward_s for layer in prof.layers)
            out[m] = (statistics.median(x for x, _ in v) / f, statistics.median(y for _, y in v) / b)
        else:
            out[m] = statistics.median(x + y for x, y in v) / prof.forward_backward_s
    return out


def probe_action_overheads(raw: dict[str, Any]) -> dict[str, float]:
    """Per model, the pipeline executor's own time per forward or backward action measured instead
    of fitted: the median over the pass's pipeline probes (`plan_accuracy_runs.PIPE_PROBE`, one per
    model before each repeat round) and their two stages of the step's time outside compute and
    blocking receives, per action (`plan_accuracy_traces.executor_time`). Empty for a pass without
    pipeline probes."""
    rows = executor_time([], raw.get("probes", []))  # it keeps the pipeline runs only
    return {m: statistics.median(r["own_per_action_ms"] for r in rows if r["model"] == m) / 1e3
            for m in sorted({r["model"] for r in rows})}


def probe_pass_overheads(raw: dict[str, Any]) -> dict[str, float]:
    """Per model, the data-parallel runtimes' own time per forward or backward pass measured instead
    of fitted: the median over the pass's step probes (`plan_accuracy_runs.STEP_PROBE`, local-sgd
    that never averages, one per model before each repeat round) of the mean step (`steady_steps`: the
    last step's one average left out) less its compute (forward + backward + optimizer, each rank's
    trace, the median over its ranks), over the step's two passes: what loading a batch, the loss
    and the runtime's bookkeeping cost beside the compute. Empty for a pass without step probes."""
    taken: dict[str, list[float]] = {}
    for probe in raw.get("probes", []):
        if probe.get("strategy") != "local-sgd" or "measured_step_s" not in probe:
            continue
        ranks = computing_ranks(probe)
        if not ranks:
            continue
        compute = statistics.median(s["forward"] + s["backward"] + s.get("optimizer", 0.0) for s in ranks)
        own = (statistics.mean(steady_steps(probe)) - compute) / 2
        taken.setdefault(probe["model"], []).append(max(0.0, own))
    return {m: statistics.median(v) for m, v in sorted(taken.items())}


def actions_per_step(strategy: str, options: dict[str, Any]) -> int:
    """Forward + backward actions one stage runs per step: 2 per micro-batch (flush schedules: the
    ``microbatches`` option, mesh's default its pp; stream schedules and layerwise: one mini-batch)."""
    if strategy in ("gpipe", "1f1b"):
        return 2 * int(options.get("microbatches", 4))
    if strategy == "mesh":
        pp = int(options.get("pp", 1))
        return 2 * (int(options.get("microbatches", 0)) or pp)
    return 2


def executor_time(runs: list[Row], probes: list[Row] | None = None) -> list[Row]:
    """One row per (pair, stage): medians over repeats of its compute, its blocking receives and its
    own time per step, and the own time per action; mesh pairs with dp > 1 (their dp all-reduce is
    not a span) and dp×tp (no executor) left out."""
    groups: dict[tuple[Any, ...], list[Row]] = {}
    for r in [*runs, *({**p, "scenario": "probe"} for p in probes or [])]:
        spans = r.get("spans") or {}
        opts = r.get("options", {})
        # mesh with dp > 1: its last stages wait in the dp all-reduce, which the trace does not mark
        if r.get("strategy") not in PIPELINES or "tp" in opts or int(opts.get("dp", 1)) > 1:
            continue
        if "measured_step_s" not in r:  # a failed run
            continue
        if not any(k.startswith("comm:") for s in spans.values() for k in s):
            continue  # a run from before the comm spans were kept
        key = (r["scenario"], r["model"], r["hosts"], r["nic"], r["strategy"], json.dumps(r["options"]))
        groups.setdefault(key, []).append(r)
    out = []
    for (scenario, model, hosts, nic, strategy, opts), group in groups.items():
        options = json.loads(opts)
        n = actions_per_step(strategy, options)
        for rank in sorted(group[0]["spans"], key=lambda k: int(k.removeprefix("rank"))):
            per = []
            for g in group:
                s = g["spans"].get(rank, {})
                compute = s.get("forward", 0.0) + s.get("backward", 0.0) + s.get("optimizer", 0.0)
                wait = s.get("comm:recv", 0.0)
                step = statistics.mean(g["step_times"])
                per.append((step, compute, wait, step - compute - wait))
            med = [statistics.median(x[i] for x in per) for i in range(4)]
            out.append({"scenario": scenario, "model": model, "hosts": hosts, "nic": nic,
                        "strategy": strategy, "opts": " ".join(f"{k}={v}" for k, v in options.items()),
                        "stage": rank, "actions": n, "step_ms": med[0] * 1e3, "compute_ms": med[1] * 1e3,
                        "recv_wait_ms": med[2] * 1e3, "own_ms": med[3] * 1e3,
                        "own_per_action_ms": round(med[3] / n * 1e3, 3), "repeats": len(per)})
    return out


def messages(op: str, world: int) -> int:
    return {"allreduce": 2 * (world - 1), "allgather": world - 1, "p2p": world, "direct": world - 1,
            "shift": 1, "relay": world, "posted_shift": 1}[op]


def hop_table(rows: list[dict[str, Any]]) -> dict[str, list[list[float]]]:
    """Per operation: [hosts, message bytes, hop seconds] rows (`plan_accuracy_model` interpolates)."""
    table: dict[str, list[list[float]]] = {}
    for r in rows:
        table.setdefault(r["op"], []).append([r["hosts"], r["message_bytes"], r["hop_s"]])
    return table


def collective_hop(record: dict[str, Any]) -> float:
    """The testbed's time per collective step, as the planner prices it (`Cluster.hop_s`): the median
    over the all-reduce and all-gather cases of a `plan_hops` results record (its ``hops``). The p2p
    chain is left out: one message in flight at a time, its hop is ~0 (sends are priced α–β)."""
    return statistics.median(h for op in ("allreduce", "allgather") for _, _, h in record["hops"][op])


def testbed_hops(record: dict[str, Any], wake: bool = False) -> tuple[float | None, ...]:
    """(`collective_hop`, the median hop of its direct exchanges' cases: `Cluster.direct_hop_s`; None
    for a record from before they were measured, which prices them as collective steps); with
    ``wake``, and the median hop of its shift cases of at most 32 kB (`Cluster.wake_s`: a waiting
    stage's late wake-up; the bigger messages' hops also carry their shaped link's refill)."""
    direct = [h for _, _, h in record["hops"].get("direct", [])]
    out = (collective_hop(record), statistics.median(direct) if direct else None)
    if not wake:
        return out
    shift = [h for _, size, h in record["hops"].get("shift", []) if size <= 32768]
    if not shift:
        raise ValueError("this plan_hops record has no shift case of at most 32 kB: measure with "
                         "plan_hops.py --bytes 4096,32768,...")
    return (*out, statistics.median(shift))

