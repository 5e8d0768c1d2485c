"""What a testbed job's steps cost the machine's cores: per run, the step time beside each rank's
process CPU per step (all its threads, the step events' ``cpu_s``), its traced compute and its
blocking receives — how much of the 2 cores the ranks get, and whether a slow run waited or burnt
more CPU for the same work.

    sudo .venv/bin/python benchmarks/plan_cpu.py
        [--pairs cnn:4:1f1b:microbatches=8,cnn:2:gpipe:microbatches=4] [--nic 1gbit] [--steps 30]
        [--repeats 3] [--name plan_cpu]

Pairs interleaved over ``--repeats`` rounds; each run via `plan_accuracy_runs.run_one` (the first 2
steps left out). Per run: step (median), CPU per step summed over ranks, that over the step (the
cores the ranks used), and per rank CPU, compute (forward + backward) and receive wait per step.
The step is the first stepping rank's: cores_used means the job's pace only where the ranks step
together (a pipeline, a collective each step) — not for ranks that never synchronise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from harness import write_results  # noqa: E402
from plan_accuracy_runs import run_one  # noqa: E402


def parse_pair(text: str) -> tuple[str, int, str, dict[str, Any]]:
    model, hosts, strategy, *opts = text.split(":")
    return model, int(hosts), strategy, dict(o.split("=", 1) for o in opts)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--pairs", default="cnn:4:1f1b:microbatches=8,cnn:2:gpipe:microbatches=4")
    p.add_argument("--nic", default="1gbit")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--name", default="plan_cpu")
    a = p.parse_args()
    pairs = [parse_pair(t) for t in a.pairs.split(",")]
    rows: list[dict[str, Any]] = []
    for rep in range(a.repeats):
        for model, hosts, strategy, opts in pairs:
            r = run_one(model, hosts, a.nic, strategy, opts, a.steps)
            if "measured_step_s" not in r:
                raise SystemExit(f"{model} {strategy} on {hosts} hosts: the run failed: {r.get('error')}")
            step, cpu, spans = r["measured_step_s"], r["cpu_per_step"], r["spans"].values()
            total = sum(cpu.values())
            rows.append({
                "round": rep, "model": model, "hosts": hosts, "nic": a.nic, "strategy": strategy,
                "opts": " ".join(f"{k}={v}" for k, v in opts.items()), "step_ms": round(step * 1e3, 2),
                "cpu_ms": round(total * 1e3, 2), "cores_used": round(total / step, 2),
                "per_rank_cpu_ms": " ".join(f"{v * 1e3:.1f}" for v in cpu.values()),
                "per_rank_compute_ms": " ".join(
                    f"{(s.get('forward', 0) + s.get('backward', 0)) * 1e3:.1f}" for s in spans),
                "per_rank_recv_ms": " ".join(f"{s.get('comm:recv', 0) * 1e3:.1f}" for s in spans),
            })
            print(rows[-1], flush=True)
    cols = ["round", "model", "hosts", "nic", "strategy", "opts", "step_ms", "cpu_ms", "cores_used",
            "per_rank_cpu_ms", "per_rank_compute_ms", "per_rank_recv_ms"]
    notes = (f"One run per pair and round, {a.steps} steps, the first 2 left out; per rank (rank0 first) "
             "the median per step of its process CPU (all threads), its traced forward + backward and "
             "its blocking receives; cores_used = the ranks' CPU per step over the step.")
    write_results(a.name, rows, cols, notes)


if __name__ == "__main__":
    main()
