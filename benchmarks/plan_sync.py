"""What a blocking collective costs when more ranks than cores compute between collectives: the
designed experiment behind the planner's scheduling wait, measured, not fitted.

W processes (one torch thread each, gloo over loopback, no testbed) repeat: compute for ``c``
seconds' worth of work (timed alone, in one process, before the runs), then one blocking
all-reduce of a small tensor. With C cores, a step that only shared the cores and paid the
all-reduce alone would take

    c · max(1, W / C) + t_ar(W)

where t_ar(W) is the same all-reduce with no compute between (c = 0, measured in the same run).
The excess of the measured step over that is the wait one blocking collective adds when its
ranks time-share the cores: a rank that reaches the collective early waits for ranks that are
not running, and the last message of each hop wakes a rank that must wait for a core.

    .venv/bin/python benchmarks/plan_sync.py --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from harness import add_common_flags, alternating, hold_lock, write_results  # noqa: E402

CORES = float(os.cpu_count() or 1)


def planner_allreduce_s(world: int) -> float:
    """The planner's price of this experiment's all-reduce on this machine: ``world`` processes on
    one host sharing its cores (`plan.predict.run_cluster`, `cost.network.allreduce_s`)."""
    from polytrain.cost.network import allreduce_s
    from polytrain.plan.predict import run_cluster

    return allreduce_s(1024.0, list(range(world)), run_cluster(world, None))


def _work(ops: int) -> None:
    import torch

    a = torch.ones(64, 64)
    for _ in range(ops):
        a = torch.mm(a, a).clamp_(-1, 1)


def ops_for(seconds: float) -> int:
    """How many `_work` ops take ``seconds`` in this process alone (one torch thread)."""
    import torch

    torch.set_num_threads(1)
    _work(200)
    t = time.perf_counter()
    _work(2000)
    per = (time.perf_counter() - t) / 2000
    return max(0, round(seconds / per))


def _rank(rank: int, world: int, port: int, plan: list[tuple[float, int]], iters: int, out: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    x = torch.ones(256)
    result = {}
    for c, ops in plan:
        times = []
        dist.barrier()
        for _ in range(iters):
            t = time.perf_counter()
            _work(ops)
            dist.all_reduce(x)
            times.append(time.perf_counter() - t)
        result[c] = statistics.median(times[5:])
    dist.destroy_process_group()
    out.put(result)


def run(world: int, plan: list[tuple[float, int]], iters: int, port: int) -> dict[float, float]:
    """One launch of ``world`` ranks through every compute size; per size, the median over ranks of
    each rank's median step."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, world, port, plan, iters, out)) for r in range(world)]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join()
    return {c: statistics.median(r[c] for r in results) for c, _ in plan}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--worlds", default="2,3,4,6,8")
    p.add_argument("--compute-ms", default="0,1,4,16", help="compute between collectives (0 first)")
    p.add_argument("--iters", type=int, default=40)
    p.add_argument("--repeats", type=int, default=5)
    add_common_flags(p)
    a = p.parse_args()
    hold_lock(a.lock)
    sizes = [float(c) / 1e3 for c in a.compute_ms.split(",")]
    plan = [(c, ops_for(c)) for c in sizes]
    worlds = [int(w) for w in a.worlds.split(",")]
    runs: list[dict[str, Any]] = []
    for rep, world in alternating(worlds, a.repeats):
        got = run(world, plan, a.iters, 29500 + len(runs) % 50)
        for c, step in got.items():
            runs.append({"world": world, "compute_s": c, "repeat": rep, "step_s": step})
        shown = [round(s * 1e3, 2) for s in got.values()]
        print(json.dumps({"world": world, "repeat": rep, "steps_ms": shown}), flush=True)
    rows = []
    for world in worlds:
        t_ar = statistics.median(r["step_s"] for r in runs if (r["world"], r["compute_s"]) == (world, 0.0))
        priced = planner_allreduce_s(world)
        share = max(1.0, world / CORES)
        for c in sizes:
            per = sorted(r["step_s"] for r in runs if (r["world"], r["compute_s"]) == (world, c))
            med = statistics.median(per)
            expected = c * share + t_ar
            rows.append({"world": world, "compute_ms": c * 1e3, "share": round(share, 2),
                         "measured_ms": f"{med * 1e3:.2f} ({per[0] * 1e3:.2f}–{per[-1] * 1e3:.2f})",
                         "expected_ms": round(expected * 1e3, 2),
                         "wait_ms": round((med - expected) * 1e3, 2),
                         "planner_ms": round((c * share + priced) * 1e3, 2),
                         "repeats": len(per),
                         "wait_s": med - expected, "measured_s": med})
    notes = (f"W processes on {CORES:g} cores, one torch thread each, gloo over loopback: {a.iters} "
             "iterations of (compute_ms of 64x64 matmuls, timed alone; one blocking all-reduce of 1 kB), "
             "the median iteration after five, the median over ranks; median (min–max) of "
             f"{a.repeats} interleaved launches. expected = compute × max(1, W / cores) + the all-reduce "
             "with no compute (the compute_ms 0 row); wait = measured − expected: what one blocking "
             "collective adds when its ranks time-share the cores. planner_ms: the planner's price of the "
             "same iteration on this machine (compute × contention, plus its all-reduce of 1 kB over W "
             "processes on one host: `cost.network.allreduce_s` on `plan.predict.run_cluster`), "
             "uncalibrated.")
    write_results("plan_sync", rows, ["world", "compute_ms", "share", "measured_ms", "expected_ms",
                                      "wait_ms", "planner_ms", "repeats"], notes,
                  extra={"runs": runs, "plan": plan})


if __name__ == "__main__":
    main()
