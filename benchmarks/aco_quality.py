"""MMAS + 2-opt on berlin52, eil51 and kroA100: gap to the optimum over 5 seeds, 60 s each at most.

    python benchmarks/aco_quality.py [--seeds 5] [--time-limit 60]

Each run stops at the optimum (--target-gap 0) or at the time limit; one process, defaults.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

from harness import add_common_flags, hold_lock, write_results

from polytrain.aco.config import ACOConfig
from polytrain.aco.launch import run_aco

INSTANCES = ("berlin52", "eil51", "kroA100")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--time-limit", type=float, default=60.0)
    add_common_flags(ap, data=True)
    args = ap.parse_args()
    hold_lock(args.lock)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):  # seeds outermost: load drift falls on every instance alike
            for name in INSTANCES:
                s = run_aco(ACOConfig.from_dict({
                    "tsp": str(args.data_dir / f"{name}.tsp"), "seed": seed, "time_limit": args.time_limit,
                    "target_gap": 0.0, "out": f"{tmp}/{name}-{seed}"}), progress=False, plots=False)
                rows.append({"instance": name, "seed": seed, "best": s["best_length"],
                             "optimum": s["optimum"], "gap_pct": 100 * s["gap"],
                             "iterations": s["iterations"], "wall_s": s["wall_s"],
                             "time_to_1pct_s": s["time_to_1pct_s"]})
                print(rows[-1], flush=True)
    summary = []
    for name in INSTANCES:
        mine = [r for r in rows if r["instance"] == name]
        gaps = [r["gap_pct"] for r in mine]
        summary.append({"instance": name, "seed": "all", "optimum": mine[0]["optimum"],
                        "median_gap_pct": statistics.median(gaps), "best_gap_pct": min(gaps),
                        "worst_gap_pct": max(gaps), "optimal_runs": sum(g == 0 for g in gaps),
                        "median_wall_s": statistics.median(r["wall_s"] for r in mine),
                        "max_wall_s": max(r["wall_s"] for r in mine)})
    write_results("aco_quality", rows + summary,
                  ["instance", "seed", "best", "optimum", "gap_pct", "iterations", "wall_s", "median_gap_pct",
                   "best_gap_pct", "optimal_runs", "median_wall_s", "max_wall_s"],
                  notes=f"MMAS + 2-opt, 25 ants, rho 0.2, one process (1 torch thread); each run stops at "
                        f"the optimum or after {args.time_limit:g} s.")


if __name__ == "__main__":
    main()
