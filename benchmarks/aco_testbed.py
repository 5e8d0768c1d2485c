"""ACO islands on the emulated cluster: bytes per exchange and time to a 2 % gap with 2 and 4 hosts.

    sudo python benchmarks/aco_testbed.py [--hosts 2,4] [--nic 1gbit] [--tsp kroA100.tsp] [--repeats 5]

Every emulated host (network namespace, shaped link) runs one rank of
``python -m polytrain aco`` under torchrun (a real multi-node rendezvous), one colony per host
(``--exchange 10``: pheromone averaged and best tour shared every 10 iterations), 24 ants in
all, MMAS + 2-opt; the run stops at a 2 % gap or after ``--time-limit``. The hosts' interface
counters are read before and after, beside polytrain's own accounted bytes. Repeat r uses seed r;
the host counts alternate (their order reversed every other repeat); the table gives the median
(min–max) over the repeats and the JSON every repeat.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from harness import add_common_flags, alternating, fmt_spread, hold_lock, write_results

from polytrain.testbed.hosts import Testbed
from polytrain.testbed.torchrun import run_torchrun


def one_run(hosts: int, seed: int, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    with Testbed(hosts, args.nic) as tb:
        before = tb.interface_bytes()
        job = [
            "-m",
            "polytrain",
            "aco",
            "--tsp",
            args.tsp,
            "--exchange",
            str(args.exchange),
            "--ants",
            str(args.ants),
            "--target-gap",
            "0.02",
            "--time-limit",
            str(args.time_limit),
            "--seed",
            str(seed),
            "--no-plots",
            "--out",
            str(out),
        ]
        code = run_torchrun(tb, job, 1, timeout=args.time_limit + 300)
        after = tb.interface_bytes()
    if code:
        raise SystemExit(f"{hosts} hosts, seed {seed}: the job failed (exit {code})")
    s = json.loads((out / "summary.json").read_text())
    wire = sum(after[h]["tx"] - before[h]["tx"] for h in after)
    return {
        "hosts": hosts,
        "seed": seed,
        "best": s["best_length"],
        "gap_pct": 100 * s["gap"],
        "iterations": s["iterations"],
        "time_to_2pct_s": s["time_to_2pct_s"],
        "wall_s": s["wall_s"],
        "exchanges": s["exchanges"],
        "bytes_sent": s["bytes_sent"],
        "bytes_per_exchange": s["bytes_per_exchange"],
        "nic_tx_bytes": wire,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", default="2,4")
    ap.add_argument("--nic", default="1gbit")
    ap.add_argument("--tsp", default="kroA100.tsp", help="a .tsp file, or a name in --data-dir")
    ap.add_argument("--exchange", type=int, default=10)
    ap.add_argument("--ants", type=int, default=24)
    ap.add_argument("--time-limit", type=float, default=120.0)
    ap.add_argument("--repeats", type=int, default=5)
    add_common_flags(ap, data=True)
    args = ap.parse_args()
    hold_lock(args.lock)
    if not Path(args.tsp).exists():
        args.tsp = str(args.data_dir / args.tsp)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r, hosts in alternating([int(h) for h in args.hosts.split(",")], args.repeats):
            runs.append(one_run(hosts, r, args, Path(tmp) / f"h{hosts}-s{r}"))
            print(runs[-1], flush=True)
    rows = []
    for hosts in dict.fromkeys(run["hosts"] for run in runs):
        mine = [run for run in runs if run["hosts"] == hosts]
        reached = [run["time_to_2pct_s"] for run in mine if run["time_to_2pct_s"] is not None]
        rows.append(
            {
                "hosts": hosts,
                "nic": args.nic,
                "ants": args.ants,
                "exchange": args.exchange,
                "runs": len(mine),
                "reached_2pct": len(reached),
                "time_to_2pct_s": fmt_spread(reached) if reached else "not reached",
                "iterations": fmt_spread([run["iterations"] for run in mine], 0),
                "gap_pct": fmt_spread([run["gap_pct"] for run in mine], 2),
                "bytes_per_exchange": fmt_spread([run["bytes_per_exchange"] for run in mine], 0),
                "nic_tx_per_exchange": fmt_spread(
                    [run["nic_tx_bytes"] / max(run["exchanges"], 1) for run in mine], 0
                ),
            }
        )
    write_results(
        "aco_testbed",
        rows,
        list(rows[0]),
        extra={"repeats": runs},
        notes="One rank per emulated host; repeat r uses seed r, the host counts alternating. "
        "bytes_per_exchange: polytrain's accounting, all ranks; nic_tx_per_exchange: the "
        "hosts' interface counters over the whole run (rendezvous, control traffic and "
        "TCP/IP headers included) divided by the exchanges. Median (min–max) over the "
        "repeats; time_to_2pct_s over the runs that reached a 2 % gap.",
    )


if __name__ == "__main__":
    main()
