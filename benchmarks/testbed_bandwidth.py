"""All-reduce bus bandwidth on the emulated cluster vs the configured link rate (needs root).

    sudo .venv/bin/python benchmarks/testbed_bandwidth.py [--repeats 5]

A gloo all-reduce of a 4 MiB tensor, 1 process per emulated host, 8 timed after 2 warm-ups; bus
bandwidth = 2(n−1)/n · bytes / time (nccl-tests' definition), slowest rank. Also the interface
counters against the payload, to show what the link really carried. Each (hosts, rate) is
measured ``--repeats`` times, the cases taking turns (the order reversed every repeat); median
(min–max).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from harness import alternating, fmt_spread, write_results  # noqa: E402

from polytrain.testbed.netns import parse_rate  # noqa: E402
from tests.test_testbed import measure_allreduce  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    cases = [(hosts, nic) for hosts in (2, 4) for nic in ("100mbit", "1gbit")]
    runs: dict[str, list[dict[str, float]]] = {f"{h} {n}": [] for h, n in cases}
    for _, (hosts, nic) in alternating(cases, a.repeats):
        res = measure_allreduce(hosts, nic, Path(tempfile.mkdtemp()))
        bw = min(r["busbw_bits"] for r in res["ranks"])
        runs[f"{hosts} {nic}"].append({"busbw": bw, "nic": max(res["tx"].values()) / res["payload"],
                                       "wire": max(res["wire"].values()) / res["payload"]})
        print(hosts, nic, runs[f"{hosts} {nic}"][-1], flush=True)
    rows = []
    for hosts, nic in cases:
        rs = runs[f"{hosts} {nic}"]
        rows.append({"hosts": hosts, "nic": nic,
                     "bus bandwidth Mbit/s": fmt_spread([r["busbw"] / 1e6 for r in rs], 1),
                     "% of rate": fmt_spread([100 * r["busbw"] / parse_rate(nic) for r in rs], 1),
                     "NIC tx / payload": fmt_spread([r["nic"] for r in rs], 3),
                     "wire tx / payload": fmt_spread([r["wire"] for r in rs], 3)})
    write_results("testbed_bandwidth", rows, list(rows[0]), extra={"repeats": runs},
                  notes=f"{a.repeats} repeats, the cases taking turns; median (min–max). RATE counts "
                        "Ethernet frames with headers, so bulk TCP tops out at 95.6% of it.")

if __name__ == "__main__":
    main()
