"""Where an iteration of ``polytrain aco`` goes, with one process and with two sharing one colony.

    python benchmarks/aco_phases.py [--tsp random:50,random:150,random:400] [--iterations 30]
        [--repeats 5]

Each process runs the real `polytrain.aco.run.Runner` (MMAS, ``--exchange 1``, one torch thread,
one ant per city, rank 0 writing ``iterations.jsonl`` as the CLI does) under plain torchrun, with
timers wrapped around its phases: the random numbers (``draw``: every rank draws the whole
colony's, so the shares equal one colony), the tour construction of its ants (``construct``),
waiting for the slower rank (``wait``: a barrier put in front of the exchange, so the exchange's
own figure is the transfer alone), the all-gather of the tours (``exchange``), tour lengths and the
pheromone update (``update``: every rank updates its replica), rank 0's record and the stop flag
(``record+stop``: rank 0 decides, everybody waits for its broadcast); with ``--local-search 2opt``
(the CLI's default) the 2-opt of the rank's own tours (``2-opt``). Per phase: the median over
iterations (the first 3 left out) of wall milliseconds and of the rank's CPU milliseconds, per
rank; the repeats alternate 1 and 2 processes. The added barrier costs one more small collective
per iteration, so the two-process totals here are an upper bound of the CLI's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from harness import alternating, write_results  # noqa: E402

PHASES = ("draw", "construct", "2-opt", "wait", "exchange", "update", "record+stop")
SKIP = 3  # iterations left out of the medians (first touches, gloo's first collectives)


def worker(tsp: str, iterations: int, local_search: str) -> None:
    import torch
    import torch.distributed as dist

    from polytrain.aco import colony as colony_mod
    from polytrain.aco import run as run_mod
    from polytrain.aco.config import ACOConfig
    from polytrain.aco.launch import prepare
    from polytrain.aco.results import IterationLog
    from polytrain.comm import Comm

    world = int(os.environ["WORLD_SIZE"])
    ants = int(tsp.split(":")[1])
    cfg, inst = prepare(ACOConfig.from_dict({"tsp": tsp, "ants": ants, "iterations": iterations,
                                             "procs": world, "local_search": local_search}))
    comm = None
    if world > 1:
        dist.init_process_group("gloo")
        comm = Comm(dist.get_rank(), world)
    rank = comm.rank if comm is not None else 0
    wall: dict[str, float] = defaultdict(float)
    cpu: dict[str, float] = defaultdict(float)
    rows: list[dict[str, float]] = []

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def inner(*a: Any, **k: Any) -> Any:
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                return fn(*a, **k)
            finally:
                wall[name] += time.perf_counter() - t0
                cpu[name] += time.process_time() - c0

        return inner

    gather = run_mod._gather_tours

    def exchange(*a: Any) -> Any:
        timed("wait", dist.barrier)()
        return timed("exchange", gather)(*a)

    run_mod._gather_tours = exchange
    run_mod.two_opt = timed("2-opt", run_mod.two_opt)
    stop_flag = run_mod._stop_flag
    timed_stop = timed("record+stop", stop_flag)
    draw = colony_mod.Draws.draw
    colony_mod.Draws.draw = staticmethod(timed("draw", draw))  # type: ignore[method-assign]
    colony_mod.Colony.construct = timed("construct", colony_mod.Colony.construct)  # type: ignore[method-assign]
    colony_mod.Colony.lengths = timed("update", colony_mod.Colony.lengths)  # type: ignore[method-assign]
    colony_mod.Colony.update = timed("update", colony_mod.Colony.update)  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as tmp:
        log = IterationLog(Path(tmp) / "iterations.jsonl" if rank == 0 else None)
        runner = run_mod.Runner(cfg, inst, comm, torch.device("cpu"))
        last = [time.perf_counter(), time.process_time()]

        def record(row: dict[str, Any]) -> None:
            timed("record+stop", log)(row)

        def stop_then_row(*a: Any) -> bool:
            out = bool(timed_stop(*a))
            now, c = time.perf_counter(), time.process_time()
            rows.append({"total": now - last[0], "total_cpu": c - last[1],
                         **{k: v for k, v in wall.items()}, **{k + "_cpu": v for k, v in cpu.items()}})
            wall.clear()
            cpu.clear()
            last[:] = [now, c]
            return out

        run_mod._stop_flag = stop_then_row
        runner.run(record)
        run_mod._stop_flag = stop_flag
        log.close()
    keep = rows[SKIP:]
    med = {k: 1e3 * statistics.median(r.get(k, 0.0) for r in keep)
           for k in ["total", "total_cpu", *PHASES, *(p + "_cpu" for p in PHASES)]}
    mine = {"rank": rank, **med}
    if comm is not None:
        everyone: list[Any] = [None] * world
        dist.all_gather_object(everyone, mine)
        if rank == 0:
            print(json.dumps(everyone))
        dist.destroy_process_group()
    else:
        print(json.dumps([mine]))


def run(tsp: str, procs: int, iterations: int, local_search: str) -> list[dict[str, float]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(procs),
           str(Path(__file__).resolve()), "--worker", "--tsp", tsp, "--iterations", str(iterations),
           "--local-search", local_search]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("[")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"aco_phases worker failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return list(json.loads(lines[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--tsp", default="random:50,random:150,random:400")
    ap.add_argument("--iterations", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--local-search", default="none",
                    help="none (as aco_scaling.py) or 2opt (the CLI's default)")
    ap.add_argument("--name", default="aco_phases")
    args = ap.parse_args()
    if args.worker:
        worker(args.tsp, args.iterations, args.local_search)
        return
    rows = []
    for tsp in args.tsp.split(","):
        got: dict[int, list[list[dict[str, float]]]] = {1: [], 2: []}
        for _, procs in alternating([1, 2], args.repeats):
            got[procs].append(run(tsp, procs, args.iterations, args.local_search))
            print(tsp, procs, got[procs][-1][0]["total"], flush=True)
        for procs, reps in got.items():
            for r in range(procs):
                row: dict[str, Any] = {"tsp": tsp, "local search": args.local_search, "procs": procs,
                                       "rank": r}
                for key in ["total", *PHASES, "total_cpu"]:
                    vals = [rep[r][key] for rep in reps]
                    row[f"{key} ms"] = statistics.median(vals)
                row["other ms"] = row["total ms"] - sum(row[f"{p} ms"] for p in PHASES)
                row["construct cpu ms"] = statistics.median(rep[r]["construct_cpu"] for rep in reps)
                row["repeats (total ms)"] = [rep[r]["total"] for rep in reps]
                rows.append(row)
        publish(args, rows)  # after each size: a run cut short keeps what it measured


def publish(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    write_results(
        args.name, rows,
        ["tsp", "local search", "procs", "rank", "total ms", *(f"{p} ms" for p in PHASES), "other ms",
         "total_cpu ms", "construct cpu ms"],
        notes=(f"Per iteration, one ant per city, MMAS, --exchange 1, local search {args.local_search}, "
               "one torch thread per process; "
               f"each figure the median over the repeats of the median over iterations {SKIP + 1}.."
               f"{args.iterations} of one run (ms, wall unless cpu). wait: a barrier put in front of the "
               "exchange, i.e. the time a rank waits for the other's construction; exchange: the tours' "
               "all-gather itself. Measured on the shared 2-vCPU development machine with other jobs "
               "running (load in the header)."))


if __name__ == "__main__":
    main()
