"""Speed-up of ``polytrain aco --procs 2`` over one process at equal total ants.

    python benchmarks/aco_scaling.py [--tsp random:50,random:150,random:400] [--ants 0] [--iterations 10]
        [--repeats 7]

Both share one colony (``--exchange 1``: each process builds half of the ants' tours, the tours
are all-gathered every iteration), so both do the same work and find the same tours; the
figure is the time per iteration measured inside the run (process start-up excluded), plus the
bytes each exchange moves. The repeats alternate 1 and 2 processes.
"""

from __future__ import annotations

import argparse
import tempfile

from harness import alternating, spread, write_results

from polytrain.aco.config import ACOConfig
from polytrain.aco.launch import run_aco


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tsp", default="random:200", help="one instance or several, comma-separated")
    ap.add_argument("--ants", type=int, default=0, help="ants per iteration; 0: one per city")
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--local-search", default="none")
    args = ap.parse_args()
    rows = []
    for tsp in args.tsp.split(","):  # several sizes: from which one on do two processes pay off
        ants = args.ants or (int(tsp.split(":")[1]) if tsp.startswith("random:") else 100)
        per: dict[int, list[float]] = {1: [], 2: []}
        sent: dict[int, float] = {}
        with tempfile.TemporaryDirectory() as tmp:
            for r, procs in alternating([1, 2], args.repeats):
                s = run_aco(ACOConfig.from_dict({
                    "tsp": tsp, "ants": ants, "iterations": args.iterations, "procs": procs,
                    "local_search": args.local_search, "out": f"{tmp}/{procs}-{r}"}), progress=False,
                    plots=False)
                per[procs].append(s["time_per_iteration_s"])
                sent[procs] = s["bytes_per_exchange"]
                print(tsp, procs, s["time_per_iteration_s"], s["best_length"], flush=True)
        base = spread(per[1])["median"]
        for procs, vals in per.items():
            sp = spread(vals)
            rows.append({"procs": procs, "tsp": tsp, "ants": ants, "s_per_iteration": sp["median"],
                         "min": sp["min"], "max": sp["max"], "speedup": base / sp["median"],
                         "bytes_per_exchange": sent[procs], "repeats": vals})
    write_results("aco_scaling", rows, ["procs", "tsp", "ants", "s_per_iteration", "min", "max", "speedup",
                                        "bytes_per_exchange"],
                  notes="--exchange 1 (one shared colony), MMAS, one torch thread per process, "
                        f"local search {args.local_search}; median (min, max) of the repeats.")


if __name__ == "__main__":
    main()
