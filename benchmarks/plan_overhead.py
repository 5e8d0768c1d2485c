"""What W ranks on the testbed's shared cores add to a training step beyond the profile's compute:
the planner's per-pass overhead measured on its own, not fitted (`plan_accuracy.py` fits it).

Each run is `local-sgd` with ``period=0`` (the replicas average once, after the last step), so
the steps measured exchange nothing: a step is one forward, one backward and one optimizer step
of W ranks sharing the machine's cores. Against the planner's price of that step with no per-pass
overhead (the stored profiles of `plan_accuracy_raw.json`, the compute scale and the share of a
core per emulated host that `plan_accuracy.md` fitted), the excess per pass is

    (measured step − predicted step without overhead) / (2 · contention(W))

— what the planner's ``pass_overhead_s`` would have to be for this model and W. A per-pass
overhead that is one number would come out the same for every model and W.

    .venv/bin/python benchmarks/plan_overhead.py --repeats 3   # as root
    .venv/bin/python benchmarks/plan_overhead.py --concurrency 1,2,4 --repeats 3
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import plan_accuracy as pa  # noqa: E402
from harness import add_common_flags, alternating, hold_lock, write_results  # noqa: E402

FITTED = {"scale": 1.0803848264467948, "alpha": 2e-4, "per_host": 0.03}  # the fit of 5c6dea9 (before 3d0a6be)
BATCH = {"cnn": 64, "vgg16": 64, "gpt-mini": 32}


def predicted_without_overhead(model: str, hosts: int, profiles: dict[str, Any]) -> tuple[float, float]:
    """(the planner's step without per-pass overhead, the cores' contention) for ``hosts`` ranks."""
    from polytrain.cost.estimate import local_sgd
    from polytrain.cost.scene import Scene
    from polytrain.plan.predict import run_cluster

    cluster = run_cluster(hosts, {"hosts": hosts, "rate_bits_per_s": 1e9})
    from polytrain.plan.calibration import emulate

    cluster = emulate(dataclasses.replace(cluster, procs_per_host=1),
                      cores=max(0.25, pa.MACHINE_CORES - FITTED["per_host"] * hosts),
                      burst_bytes=cluster.burst_bytes)
    scene = Scene(profiles[model], cluster, BATCH[model], FITTED["scale"])
    # the planner's own local-sgd step, its one average spread over so many steps that it is nil
    return local_sgd(scene, hosts, 10**9).step_s, cluster.contention(hosts)


def _compute_worker(model: str, batch: int, iters: int, start: Any, out: Any) -> None:
    """One process, one torch thread: ``iters`` forward + backward + SGD steps of ``model`` at
    ``batch``, begun when every process is ready; the median step goes to ``out``."""
    import time

    import torch

    torch.set_num_threads(1)
    from polytrain.runtime.job import Job

    job = Job.from_config(pa.model_config(model))
    net = job.build_model()
    opt = job.make_optimizer(net.parameters())
    x, y = job.dataset.x_train[:batch], job.dataset.y_train[:batch]
    times = []
    start.wait()
    for _ in range(iters):
        t = time.perf_counter()
        opt.zero_grad()
        job.loss(net(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t)
    out.put(statistics.median(times[2:]))


def concurrency(models: list[str], counts: list[int], iters: int, repeats: int) -> None:
    """The same compute in n processes at once against alone: how much one rank slows when n share
    the machine's cores — the cores' parallel efficiency, which `Cluster.contention` takes as 1."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    runs: list[dict[str, Any]] = []
    for rep, (model, n) in alternating([(m, n) for m in models for n in counts], repeats):
        start, out = ctx.Barrier(n), ctx.Queue()
        procs = [ctx.Process(target=_compute_worker, args=(model, BATCH[model] // 2, iters, start, out))
                 for _ in range(n)]
        for proc in procs:
            proc.start()
        steps = [out.get() for _ in procs]
        for proc in procs:
            proc.join()
        runs.append({"model": model, "procs": n, "repeat": rep, "step_s": statistics.median(steps)})
        print(json.dumps(runs[-1]), flush=True)
    rows = []
    for model in models:
        alone = statistics.median(r["step_s"] for r in runs if (r["model"], r["procs"]) == (model, 1))
        for n in counts:
            per = sorted(r["step_s"] / alone for r in runs if (r["model"], r["procs"]) == (model, n))
            rows.append({"model": model, "procs": n, "batch": BATCH[model] // 2,
                         "slowdown": f"{statistics.median(per):.2f} ({per[0]:.2f}–{per[-1]:.2f})",
                         "linear_sharing": f"{max(1.0, n / pa.MACHINE_CORES):.2f}", "repeats": len(per)})
    notes = (f"n processes at once, one torch thread each, {iters} forward + backward + SGD steps of the "
             "model at half the plan_accuracy batch (a 2-rank data-parallel share), the median step after "
             "two; slowdown: the median over processes of that step over the same step alone (median of "
             f"the alone runs), median (min–max) of {repeats} interleaved repeats. linear_sharing: what "
             "the planner's contention assumes (n / cores, at least 1). No testbed, nothing else running.")
    write_results("plan_overhead_concurrency", rows,
                  ["model", "procs", "batch", "slowdown", "linear_sharing", "repeats"], notes,
                  extra={"runs": runs})


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="cnn,gpt-mini,vgg16")
    p.add_argument("--hosts", default="2,4,8")
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--concurrency", default="",
                   help="instead: the same compute in n processes at once, e.g. 1,2,4 (no testbed)")
    p.add_argument("--iters", type=int, default=30, help="--concurrency: steps per process")
    add_common_flags(p)
    a = p.parse_args()
    hold_lock(a.lock)
    if a.concurrency:
        concurrency(a.models.split(","), [int(n) for n in a.concurrency.split(",")], a.iters, a.repeats)
        return
    os.environ["POLYTRAIN_CACHE"] = str(pa.PROFILES)
    profiles = pa.stored_profiles(json.loads(pa.RAW.read_text()))
    cells = [(m, int(h)) for m in a.models.split(",") for h in a.hosts.split(",")]
    runs: list[dict[str, Any]] = []
    for rep, (model, hosts) in alternating(cells, a.repeats):
        row = pa.run_one(model, hosts, "1gbit", "local-sgd", {"period": 0}, a.steps)
        if "error" in row:
            raise SystemExit(f"{model} on {hosts} hosts failed: {row['error']}")
        steady = row["step_times"][:-1]  # the last step ends with the one average
        runs.append({"model": model, "hosts": hosts, "repeat": rep, "step_s": statistics.mean(steady),
                     "load_start": row["load_start"]})
        print(json.dumps(runs[-1]), flush=True)
    rows = []
    for model, hosts in cells:
        per = sorted(r["step_s"] for r in runs if (r["model"], r["hosts"]) == (model, hosts))
        pred, k = predicted_without_overhead(model, hosts, profiles)
        med = statistics.median(per)
        rows.append({"model": model, "hosts": hosts, "contention": round(k, 2),
                     "measured_ms": f"{med * 1e3:.1f} ({per[0] * 1e3:.1f}–{per[-1] * 1e3:.1f})",
                     "predicted_no_overhead_ms": round(pred * 1e3, 1),
                     "excess_ms": round((med - pred) * 1e3, 1),
                     "per_pass_overhead_ms": round((med - pred) / (2 * k) * 1e3, 2),
                     "repeats": len(per)})
    notes = ("local-sgd period=0 on W emulated hosts at 1 Gbit/s (no exchange before the last step), "
             f"{a.steps} steps, the first two and the last left out, mean step per run; median (min–max) "
             f"of {a.repeats} interleaved repeats. Predicted: the planner's local-sgd step at the run's "
             "per-rank batch (forward and backward × contention, optimizer), with no per-pass overhead "
             f"(compute scale {FITTED['scale']:.2f}, {FITTED['per_host']} of a core per emulated host: "
             "plan_accuracy.md's fit). per_pass_overhead = excess / (2 × contention): the "
             "pass_overhead_s this cell implies (plan_accuracy.md fitted 2 ms).")
    write_results("plan_overhead", rows, ["model", "hosts", "contention", "measured_ms",
                                          "predicted_no_overhead_ms", "excess_ms", "per_pass_overhead_ms",
                                          "repeats"], notes, extra={"runs": runs})


if __name__ == "__main__":
    main()
