"""Tour construction throughput: the data-parallel colony vs the one-ant-at-a-time reference.

    python benchmarks/aco_construction.py [--sizes 52,100,500,1000] [--repeats 5]

A = N ants, MMAS rules (no candidate lists: every step weighs all N cities), one torch thread.
Both build tours from the same random numbers (and are tested to build the same tours). The
vectorised side builds the whole colony; the reference builds ``ref_ants`` of its ants (tours/s
is per tour, so a subset measures the same rate) — at N = 1000 a whole reference colony takes
minutes — and the vectorised side builds its colony as many times as makes its timing window
about as long as the reference's, so that on a shared machine both sides see the same load. The
repeats alternate the two sides.
"""

from __future__ import annotations

import argparse
import time

import torch
from harness import alternating, spread, write_results

from polytrain.aco.colony import Colony, Draws, Params
from polytrain.aco.reference import Reference
from polytrain.aco.tsp import random_instance


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="52,100,500,1000")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--candidates", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for n in [int(x) for x in args.sizes.split(",")]:
        col = Colony(random_instance(n, 0), Params(variant="mmas", ants=n, candidates=args.candidates))
        draws = Draws.draw(torch.Generator().manual_seed(0), n, n)
        ref_ants = max(1, min(n, 20_000 // n))
        ref, part = Reference(col), draws.share(0, ref_ants)
        assert torch.equal(col.construct(part), ref.construct(part))
        # equal timing windows: the vectorised side builds its colony `reps` times per repeat so
        # that both sides are timed over about the same wall time (and see the same load)
        t0 = time.perf_counter()
        ref.construct(part)
        t_ref = time.perf_counter() - t0
        t0 = time.perf_counter()
        col.construct(draws)
        reps = max(1, round(t_ref / (time.perf_counter() - t0)))
        per: dict[str, list[float]] = {"vectorised": [], "reference": []}
        cpu: dict[str, list[float]] = {"vectorised": [], "reference": []}
        for _, side in alternating(["vectorised", "reference"], args.repeats):
            t0, c0 = time.perf_counter(), time.thread_time()
            if side == "vectorised":
                for _ in range(reps):
                    col.construct(draws)
                tours = reps * n
            else:
                ref.construct(part)
                tours = ref_ants
            per[side].append(tours / (time.perf_counter() - t0))
            cpu[side].append(tours / (time.thread_time() - c0))
        v, r = spread(per["vectorised"]), spread(per["reference"])
        vc, rc = spread(cpu["vectorised"]), spread(cpu["reference"])
        rows.append({"n": n, "ants": n, "candidates": args.candidates, "ref_ants_timed": ref_ants,
                     "vec_colonies_per_repeat": reps,
                     "vectorised_tours_per_s": v["median"], "vec_min": v["min"], "vec_max": v["max"],
                     "reference_tours_per_s": r["median"], "ref_min": r["min"], "ref_max": r["max"],
                     "speedup": v["median"] / r["median"],
                     "vectorised_tours_per_cpu_s": vc["median"], "reference_tours_per_cpu_s": rc["median"],
                     "speedup_cpu": vc["median"] / rc["median"],
                     "speedup_cpu_min": vc["min"] / rc["max"], "speedup_cpu_max": vc["max"] / rc["min"],
                     "repeats": per, "repeats_cpu": cpu})
        print(rows[-1]["n"], rows[-1]["speedup"], rows[-1]["speedup_cpu"], flush=True)
    write_results("aco_construction", rows,
                  ["n", "ants", "candidates", "vectorised_tours_per_s", "vec_min", "vec_max",
                   "reference_tours_per_s", "ref_min", "ref_max", "speedup",
                   "vectorised_tours_per_cpu_s", "reference_tours_per_cpu_s", "speedup_cpu",
                   "speedup_cpu_min", "speedup_cpu_max"],
                  notes="Median (min, max) of the repeats; the two sides alternate. One torch thread. "
                        "`*_per_cpu_s`: tours per second of the timing thread's CPU time (both sides are "
                        "single-threaded, so on a shared machine this is the rate the machine alone gives); "
                        "speedup_cpu_min/max: the worst and best pairing of the repeats' extremes.")


if __name__ == "__main__":
    main()
