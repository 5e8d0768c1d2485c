"""ACO islands on the emulated cluster: bytes per exchange and time to a 2 % gap with 2 and 4 hosts.

    sudo python benchmarks/aco_testbed.py [--hosts 2,4] [--nic 1gbit] [--tsp kroA100.tsp]

Every emulated host (network namespace, shaped link) runs one rank of
``python -m polytrain aco`` under torchrun (a real multi-node rendezvous), one colony per host
(``--exchange 10``: pheromone averaged and best tour shared every 10 iterations), 25 ants in
all, MMAS + 2-opt; the run stops at a 2 % gap or after ``--time-limit``. The hosts' interface
counters are read before and after, beside polytrain's own accounted bytes.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from harness import write_results

from polytrain.launch.testbed import Testbed, run_torchrun


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", default="2,4")
    ap.add_argument("--nic", default="1gbit")
    ap.add_argument("--tsp", default="/work/shared/data/tsplib/kroA100.tsp")
    ap.add_argument("--exchange", type=int, default=10)
    ap.add_argument("--ants", type=int, default=24)
    ap.add_argument("--time-limit", type=float, default=120.0)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for hosts in [int(h) for h in args.hosts.split(",")]:
            out = Path(tmp) / f"h{hosts}"
            with Testbed(hosts, args.nic) as tb:
                before = tb.interface_bytes()
                job = ["-m", "polytrain", "aco", "--tsp", args.tsp, "--exchange", str(args.exchange),
                       "--ants", str(args.ants), "--target-gap", "0.02", "--time-limit", str(args.time_limit),
                       "--no-plots", "--out", str(out)]
                code = run_torchrun(tb, job, 1, timeout=args.time_limit + 300)
                after = tb.interface_bytes()
            if code:
                raise SystemExit(f"{hosts} hosts: the job failed (exit {code})")
            s = json.loads((out / "summary.json").read_text())
            wire = sum(after[h]["tx"] - before[h]["tx"] for h in after)
            rows.append({"hosts": hosts, "nic": args.nic, "ants": args.ants, "exchange": args.exchange,
                         "best": s["best_length"], "gap_pct": 100 * s["gap"], "iterations": s["iterations"],
                         "time_to_2pct_s": s["time_to_2pct_s"], "wall_s": s["wall_s"],
                         "exchanges": s["exchanges"], "bytes_sent": s["bytes_sent"],
                         "bytes_per_exchange": s["bytes_per_exchange"], "nic_tx_bytes": wire})
            print(rows[-1], flush=True)
    write_results("aco_testbed", rows, ["hosts", "nic", "ants", "exchange", "best", "gap_pct", "iterations",
                                        "time_to_2pct_s", "exchanges", "bytes_per_exchange", "bytes_sent",
                                        "nic_tx_bytes"],
                  notes="One rank per emulated host; bytes_sent: polytrain's accounting, all ranks "
                        "(nic_tx_bytes: the hosts' interface counters, which also carry the rendezvous, "
                        "control traffic and TCP/IP headers). One run per host count (seed 0).")


if __name__ == "__main__":
    main()
