"""Blocking all-reduces between compute, on the testbed: tensor parallelism's pattern (a
collective after each piece of a block's compute), measured and set beside the planner's price.

    sudo .venv/bin/python benchmarks/plan_blocking.py [--hosts 2,4] [--nics 100mbit,1gbit]
        [--bytes 1024,524288] [--compute-ms 0,4,12] [--iterations 30] [--repeats 5]
        [--frozen benchmarks/results/plan_accuracy_1129f_1130e.json] [--name plan_blocking]

One process per emulated host (``polytrain.testbed.hosts``, one torch thread each); per
(hosts, nic), ``--repeats`` jobs (a fresh testbed each, the (hosts, nic) pairs interleaved), each
running every (bytes, compute) case, interleaved in rounds of 5 iterations (``plan_blocking_rank.py``).
An iteration: ``compute_ms`` of matmuls (timed by each rank alone), then one blocking all-reduce of
``bytes``; its time is the median over ranks; the first of each round of 5 is left out (it follows
a barrier). Per job and case: the mean iteration (what a training step's mean pays), the median
iteration (the typical one), the all-reduce call's mean, and the stalls (iterations whose
all-reduce call took ≥ 50 ms longer than the case's median call on some rank); per case, the
median over jobs with min–max.
Priced: the planner's iteration with the calibration of ``--frozen`` (its cores per host, time per
call and extra α): ``compute × contention(W)`` plus ``cost.network.allreduce_s`` on the testbed's
cluster with the shaper's bucket refilled for the compute's time (`cost.network.refilled`), as
`cost.estimate.tensor` prices a block's all-reduces.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from harness import write_results  # noqa: E402

from polytrain.testbed.hosts import Testbed  # noqa: E402
from polytrain.testbed.torchrun import run_torchrun, testbed_record  # noqa: E402


def run_ranks(hosts: int, nic: str, script: str, cases: list[Any], iterations: int) -> dict[str, Any]:
    """One testbed job: ``script`` (a rank script beside this one: OUT_DIR CASES_JSON ITERATIONS) on
    one process per emulated host; its OUT_DIR/times.json with the testbed's record."""
    work = Path(tempfile.mkdtemp(prefix=f"{Path(script).stem}-"))
    with Testbed(hosts, nic) as tb:
        rc = run_torchrun(tb, [str(HERE / script), str(work), json.dumps(cases), str(iterations)], 1,
                          timeout=900, log_dir=work / "logs")
        record = testbed_record(tb)
    if rc != 0:
        raise SystemExit(f"{hosts} hosts {nic}: ranks failed (rc {rc}); logs in {work / 'logs'}")
    res = json.loads((work / "times.json").read_text())
    res["testbed"] = record
    return res


def run_case(hosts: int, nic: str, cases: list[list[float]], iterations: int) -> dict[str, Any]:
    return run_ranks(hosts, nic, "plan_blocking_rank.py", cases, iterations)


def priced_s(hosts: int, nic: str, nbytes: float, compute_s: float, frozen: dict[str, Any]) -> float:
    from plan_accuracy_model import testbed_cluster

    from polytrain.cost.network import allreduce_s, refilled

    cluster = testbed_cluster(hosts, nic, frozen["extra_alpha_s"], frozen["cores_per_host"], frozen["call_s"])
    comm = allreduce_s(nbytes, range(hosts), refilled(cluster, compute_s))
    return compute_s * cluster.contention(hosts) + comm


STALL_S = 0.05  # an all-reduce call this much longer than the median call: a stall, not the link's time


def job_stats(res: dict[str, Any]) -> dict[tuple[float, float], dict[str, float]]:
    """Per (bytes, compute_ms) case of one job: mean and median iteration, the all-reduce call's
    mean (ms), and the share of iterations with a stall."""
    out = {}
    for key in sorted({(x["bytes"], x["compute_ms"]) for x in res["rows"]}):
        mine = [x for x in res["rows"] if (x["bytes"], x["compute_ms"]) == key]
        steady = [x for i, x in enumerate(mine) if i % 5 != 0]
        wall = [statistics.median(x["wall_s_ranks"]) for x in steady]
        typical = statistics.median(c for x in steady for c in x["comm_s_ranks"])
        out[key] = {"mean_ms": statistics.mean(wall) * 1e3, "median_ms": statistics.median(wall) * 1e3,
                    "allreduce_mean_ms": 1e3 * statistics.mean(
                        statistics.median(x["comm_s_ranks"]) for x in steady),
                    "stalls": sum(max(x["comm_s_ranks"]) >= typical + STALL_S for x in steady) / len(steady)}
    return out


def spread_text(values: list[float], digits: int = 1) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def rows_of(hosts: int, nic: str, jobs: list[dict[str, Any]], frozen: dict[str, Any]) -> list[dict[str, Any]]:
    per_job = [job_stats(res) for res in jobs]
    out = []
    for nbytes, compute_ms in per_job[0]:
        got = [j[(nbytes, compute_ms)] for j in per_job]
        price = priced_s(hosts, nic, nbytes, compute_ms / 1e3, frozen) * 1e3
        mean = statistics.median(g["mean_ms"] for g in got)
        out.append({"hosts": hosts, "nic": nic, "bytes": nbytes, "compute_ms": compute_ms,
                    "mean_ms": spread_text([g["mean_ms"] for g in got]),
                    "median_ms": spread_text([g["median_ms"] for g in got]),
                    "allreduce_mean_ms": spread_text([g["allreduce_mean_ms"] for g in got]),
                    "stall_share": spread_text([g["stalls"] for g in got], 2),
                    "priced_ms": round(price, 2), "error_vs_mean_%": round(100 * (price / mean - 1), 1),
                    "error_vs_median_%": round(100 * (price / statistics.median(
                        g["median_ms"] for g in got) - 1), 1), "repeats": len(got)})
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hosts", default="2,4")
    p.add_argument("--nics", default="100mbit,1gbit")
    p.add_argument("--bytes", default="1024,524288")
    p.add_argument("--compute-ms", default="0,4,12")
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--frozen", default=str(HERE / "results" / "plan_accuracy_1129f_1130e.json"))
    p.add_argument("--name", default="plan_blocking")
    p.add_argument("--analyse", action="store_true", help="only recompute the table from the jobs kept "
                   "in results/<name>.json")
    a = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    frozen = json.loads(Path(a.frozen).read_text())["summary"]["calibration"]
    cases = [[int(b), float(c)] for b in a.bytes.split(",") for c in a.compute_ms.split(",")]
    pairs = [(int(h), nic) for nic in a.nics.split(",") for h in a.hosts.split(",")]
    raw: dict[str, list[dict[str, Any]]] = {}
    if a.analyse:
        raw = json.loads((HERE / "results" / f"{a.name}.json").read_text())["runs"]
        pairs = [(int(k.split()[0]), k.split()[1]) for k in raw]
    for r in range(0 if a.analyse else a.repeats):
        for hosts, nic in pairs:  # interleaved: the machine's drift falls on every pair
            raw.setdefault(f"{hosts} {nic}", []).append(run_case(hosts, nic, cases, a.iterations))
            print(f"repeat {r + 1}/{a.repeats}: {hosts} hosts {nic} done", flush=True)
    rows = [row for hosts, nic in pairs for row in rows_of(hosts, nic, raw[f"{hosts} {nic}"], frozen)]
    write_results(a.name, rows, list(rows[0]), appended=a.analyse, extra={"runs": raw, "frozen": a.frozen},
                  notes=f"One process per emulated host; {a.repeats} jobs per (hosts, nic), interleaved; "
                        f"per job {a.iterations} iterations per case in rounds of 5, cases interleaved, "
                        "each round's first left out; per job the mean and the median iteration (median "
                        "over ranks); shown: median (min–max) over jobs. stall_share: the share of "
                        f"iterations whose all-reduce took ≥ {STALL_S * 1e3:g} ms longer than the case's "
                        "median call on some rank. priced = "
                        "the planner's iteration with the calibration frozen in "
                        f"`{Path(a.frozen).name}`.")


if __name__ == "__main__":
    main()
