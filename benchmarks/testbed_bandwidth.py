"""All-reduce bus bandwidth on the emulated cluster vs the configured link rate (needs root).

    sudo .venv/bin/python benchmarks/testbed_bandwidth.py

A gloo all-reduce of a 4 MiB tensor, 1 process per emulated host, 8 timed after 2 warm-ups; bus
bandwidth = 2(n−1)/n · bytes / time (nccl-tests' definition), slowest rank. Also the interface
counters against the payload, to show what the link really carried.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from harness import write_results  # noqa: E402

from polytrain.launch.netns import parse_rate  # noqa: E402
from tests.test_testbed import measure_allreduce  # noqa: E402


def main() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rows = []
    for hosts in (2, 4):
        for nic in ("100mbit", "1gbit"):
            res = measure_allreduce(hosts, nic, Path(tempfile.mkdtemp()))
            bw = min(r["busbw_bits"] for r in res["ranks"])
            rows.append({"hosts": hosts, "nic": nic, "bus bandwidth Mbit/s": bw / 1e6,
                         "% of rate": 100 * bw / parse_rate(nic),
                         "NIC tx / payload": max(res["tx"].values()) / res["payload"],
                         "wire tx / payload": max(res["wire"].values()) / res["payload"]})
    write_results("testbed_bandwidth", rows, list(rows[0]),
                  notes="RATE counts Ethernet frames with headers, so bulk TCP tops out at 95.6% of it.")


if __name__ == "__main__":
    main()
