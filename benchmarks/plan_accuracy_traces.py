"""What the runs' own traces say about the pipeline executor: per pipeline pair and stage, the
step's time split into compute (forward, backward, optimizer), blocking receives, and the rest — the
executor's own time (posting sends and receives, bookkeeping between actions, waiting for its turn
on the shared cores) — per forward or backward action. Read from `plan_accuracy_runs.span_stats`,
kept with every run since 2026-11-29 noon (`comm:*` spans); the pipeline probes
(`plan_accuracy_runs.PIPE_PROBE`) are rows too. → results/<name>_executor.md.
"""

from __future__ import annotations

import json
import statistics
from typing import Any

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
