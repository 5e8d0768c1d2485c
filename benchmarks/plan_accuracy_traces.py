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

from polytrain.testbed.probes import PIPELINES, actions_per_step, executor_time  # noqa: F401

Row = dict[str, Any]



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
