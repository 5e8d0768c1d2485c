"""What the runs' own traces say. About the pipeline executor: per pipeline pair and stage, the
step's time split into compute (forward, backward, optimizer), blocking receives, and the rest — the
executor's own time (posting sends and receives, bookkeeping between actions, waiting for its turn
on the shared cores) — per forward or backward action. Read from `plan_accuracy_runs.span_stats`,
kept with every run since 2026-11-29 noon (`comm:*` spans); the pipeline probes
(`plan_accuracy_runs.PIPE_PROBE`) are rows too. → results/<name>_executor.md. About the
data-parallel runs' compute against the profile (`in_job_compute`), and about the machine between
two passes of the same pairs (`drift`).
"""

from __future__ import annotations

import json
import statistics
from typing import Any

from plan_accuracy_model import MACHINE_CORES, MODELS, merge_repeats, probe_scales, stored_profiles

Row = dict[str, Any]
PIPELINES = ("gpipe", "1f1b", "pipedream", "layerwise", "mesh")


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


def write_executor(raw: Row, name: str) -> dict[str, Any] | None:
    """`executor_time` of a raw file → results/<name>_executor.md; None where no run has comm spans."""
    from harness import write_results

    rows = executor_time(raw["runs"], raw.get("probes", []))
    if not rows:
        return None
    by_model = {m: statistics.median(r["own_per_action_ms"] for r in rows if r["model"] == m)
                for m in sorted({r["model"] for r in rows})}
    summary = {"own_per_action_ms_median_by_model": by_model}
    cols = ["scenario", "model", "hosts", "nic", "strategy", "opts", "stage", "actions", "step_ms",
            "compute_ms", "recv_wait_ms", "own_ms", "own_per_action_ms", "repeats"]
    notes = f"Summary: {json.dumps(summary)}"
    write_results(f"{name}_executor", rows, cols, notes, extra={"summary": summary})
    return summary


DATA_PARALLEL = ("allreduce", "local-sgd", "ps")  # every worker runs the whole model on its share


def in_job_compute(runs: list[Row], profiles: dict[str, Any]) -> list[Row]:
    """Per data-parallel (scenario, strategy), its workers' forward per step as their own traces
    timed it (each run: the median over its workers; then the median over repeats, min-max kept),
    against the profile's forward of a worker's share of the batch, slowed by the cores' sharing
    among the workers that compute at once (``max(1, W / cores)``, as `Cluster.contention`): the
    ratio is the run's in-job compute scale, to set beside the probes' (`probe_scales`)."""
    groups: dict[tuple[int, str], list[Row]] = {}
    for r in runs:
        if r.get("spans") and r["strategy"] in DATA_PARALLEL:
            groups.setdefault((r["scenario"], r["strategy"]), []).append(r)
    out = []
    for (scenario, strategy), group in sorted(groups.items()):
        r = group[0]
        workers = r["hosts"] - (int(r["options"].get("servers", 1)) if strategy == "ps" else 0)
        prof = profiles[r["model"]]
        batch = (r.get("batch") or MODELS[r["model"]][1]) / workers
        priced = sum(layer.times(batch, prof.batch_size)[0] for layer in prof.layers)
        priced *= max(1.0, workers / MACHINE_CORES)
        per = [statistics.median(s["forward"] for s in g["spans"].values() if "forward" in s) for g in group]
        out.append({"scenario": scenario, "model": r["model"], "hosts": r["hosts"], "nic": r["nic"],
                    "strategy": strategy, "workers": workers, "forward_ms": statistics.median(per) * 1e3,
                    "forward_min_max_ms": [min(per) * 1e3, max(per) * 1e3], "priced_ms": priced * 1e3,
                    "in_job_scale": round(statistics.median(per) / priced, 3)})
    return out


def drift(before_raw: Row, after_raw: Row) -> tuple[list[Row], Row]:
    """The same (scenario, strategy) pairs measured in two passes (raw files): each pair's median
    step in both and their ratio, and each model's stored profile's forward + backward — how far the
    machine itself moved between the passes."""
    before, after = (merge_repeats(raw["runs"]) for raw in (before_raw, after_raw))
    earlier = {(r["scenario"], r["strategy"]): r for r in before}
    rows = [
        {"scenario": r["scenario"], "model": r["model"], "hosts": r["hosts"], "nic": r["nic"],
         "strategy": r["strategy"], "before_ms": b["measured_step_s"] * 1e3,
         "after_ms": r["measured_step_s"] * 1e3,
         "ratio": round(r["measured_step_s"] / b["measured_step_s"], 3)}
        for r in after
        if (b := earlier.get((r["scenario"], r["strategy"]))) is not None
    ]
    ratios = sorted(r["ratio"] for r in rows)
    fb = {
        label: {m: round(p.forward_backward_s * 1e3, 2) for m, p in stored_profiles(raw).items()}
        for label, raw in (("before", before_raw), ("after", after_raw))
    }
    summary = {
        "pairs": len(rows),
        "ratio_median": statistics.median(ratios),
        "ratio_min_max": [ratios[0], ratios[-1]],
        "profile_forward_backward_ms": fb,
        "before_commit": before_raw.get("commit"),
        "after_commit": after_raw.get("commit"),
    }
    return rows, summary


def write_compute(raw: dict[str, Any], profiles: dict[str, Any], name: str) -> dict[str, Any]:
    """The data-parallel pairs' in-job compute against the profile (`in_job_compute`), beside the
    probes' measured scale, → results/<name>_compute.md; returns its summary."""
    from harness import write_results

    rows = in_job_compute(raw["runs"], profiles)
    probe_rounds = {m: [] for m in profiles}  # each probe's own ratio, round by round
    for probe in raw.get("probes", []):
        one = probe_scales({"probes": [probe]}, profiles)
        probe_rounds[probe["model"]] += [round(v, 3) for v in one.values()]
    summary = {
        "probe_scales": {m: round(v, 3) for m, v in probe_scales(raw, profiles).items()},
        "probe_scales_forward_backward": {  # each over the profile's own: what `analyse` prices with
            m: [round(x, 3) for x in v] for m, v in probe_scales(raw, profiles, split=True).items()},
        "probe_scale_per_round": probe_rounds,
        "in_job_scale_median_by_model": {
            m: statistics.median(r["in_job_scale"] for r in rows if r["model"] == m)
            for m in sorted({r["model"] for r in rows})
        },
    }
    cols = ["scenario", "model", "hosts", "nic", "strategy", "workers", "forward_ms", "priced_ms",
            "in_job_scale"]
    notes = f"Summary: {json.dumps(summary)}"
    write_results(f"{name}_compute", rows, cols, notes, extra={"summary": summary})
    return summary


def write_drift(before: dict[str, Any], after: dict[str, Any], name: str) -> None:
    """Two passes of the same pairs side by side (`plan_accuracy_traces.drift`)."""
    from harness import write_results

    rows, summary = drift(before, after)
    cols = ["scenario", "model", "hosts", "nic", "strategy", "before_ms", "after_ms", "ratio"]
    write_results(f"{name}_drift", rows, cols, f"Summary: {json.dumps(summary)}", extra={"summary": summary})
