"""polytrain's ring all-reduce vs gloo's own on the emulated testbed (needs root): bus bandwidth
against the link rate, and ring / builtin, in the same processes.

    sudo .venv/bin/python benchmarks/ring_testbed.py [--hosts 2,4,8] [--nics 100mbit,1gbit]
        [--repeats 5] [--mib 100mbit=8,1gbit=32] [--segment-elems 262144] [--name ring_testbed]

One process per emulated host (``polytrain.testbed.hosts``), one float32 tensor; per case,
``--repeats`` timed calls of each implementation, interleaved (``ring_testbed_rank.py``). Bus
bandwidth = 2(W−1)/W · bytes / time (nccl-tests' definition), time = the slowest rank's. The
link ceiling for bulk TCP is 95.6 % of the rate (the shaper counts frame headers; see
``polytrain/testbed/hosts.py``). CPU-bound is judged from what was measured during the timed
calls: the machine's CPU busy fraction (``/proc/stat``) and the ranks' CPU seconds per wall
second (summed over ranks, as a share of the machine's cores; the busy fraction also counts
other jobs on the machine and the kernel's shaping); a case is marked CPU-bound when the
machine was ≥ 90 % busy during the ring's calls.
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

from harness import fmt_spread, spread, write_results  # noqa: E402

from polytrain.comm.ring import DEFAULT_SEGMENT_ELEMS  # noqa: E402
from polytrain.testbed.hosts import Testbed  # noqa: E402
from polytrain.testbed.netns import parse_rate  # noqa: E402
from polytrain.testbed.torchrun import run_torchrun, testbed_record  # noqa: E402

CPU_BOUND_BUSY = 0.90


def run_case(hosts: int, nic: str, mib: int, repeats: int, seg: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="ring-testbed-"))
    with Testbed(hosts, nic) as tb:
        before = tb.interface_bytes()
        rc = run_torchrun(tb, [str(HERE / "ring_testbed_rank.py"), str(work), str(mib), str(repeats),
                               str(seg)], 1, timeout=900, log_dir=work / "logs")
        after = tb.interface_bytes()
        record = testbed_record(tb)
    if rc != 0:
        raise SystemExit(f"{hosts} hosts {nic}: ranks failed (rc {rc}); logs in {work / 'logs'}")
    res = json.loads((work / "times.json").read_text())
    res["tx_wire"] = {h: after[h]["tx_wire"] - before[h]["tx_wire"] for h in after}
    res["testbed"] = record
    return res


def row_of(hosts: int, nic: str, res: dict[str, Any]) -> dict[str, Any]:
    rate = parse_rate(nic)
    nbytes = res["mib"] * 2**20
    bus = {k: [2 * (hosts - 1) / hosts * nbytes * 8 / c["wall_s"] for c in res["calls"] if c["kind"] == k]
           for k in ("builtin", "ring")}
    busy = {k: [c["machine_busy"] for c in res["calls"] if c["kind"] == k] for k in bus}
    cpu = {k: [c["rank_cpu_s_mean"] * hosts / c["wall_s"] / (os.cpu_count() or 1)
               for c in res["calls"] if c["kind"] == k] for k in bus}
    ratios = [r / b for r, b in zip(bus["ring"], bus["builtin"], strict=True)]  # per interleaved pair
    bound = statistics.median(busy["ring"]) >= CPU_BOUND_BUSY
    return {"hosts": hosts, "nic": nic, "MiB": res["mib"],
            "ring / link": fmt_spread([b / rate for b in bus["ring"]], 2),
            "builtin / link": fmt_spread([b / rate for b in bus["builtin"]], 2),
            "ring / builtin": f"{spread(bus['ring'])['median'] / spread(bus['builtin'])['median']:.2f} "
                              f"(pairs {min(ratios):.2f}–{max(ratios):.2f})",
            "ring bus Mbit/s": fmt_spread([b / 1e6 for b in bus["ring"]], 1),
            "machine CPU busy (ring, builtin)": f"{statistics.median(busy['ring']):.0%}, "
                                               f"{statistics.median(busy['builtin']):.0%}",
            "ranks' share of the cores (ring, builtin)": f"{statistics.median(cpu['ring']):.0%}, "
                                                         f"{statistics.median(cpu['builtin']):.0%}",
            "CPU-bound": "yes" if bound else "no", "sums equal": res["ok"]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hosts", default="2,4,8")
    p.add_argument("--nics", default="100mbit,1gbit")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--mib", default="100mbit=8,1gbit=32", help="tensor MiB per rate")
    p.add_argument("--segment-elems", type=int, default=DEFAULT_SEGMENT_ELEMS)
    p.add_argument("--name", default="ring_testbed")
    a = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mib = {k: int(v) for k, v in (kv.split("=") for kv in a.mib.split(","))}
    rows, raw = [], {}
    for nic in a.nics.split(","):
        for hosts in (int(h) for h in a.hosts.split(",")):
            res = run_case(hosts, nic, mib[nic], a.repeats, a.segment_elems)
            raw[f"{hosts} {nic}"] = res
            rows.append(row_of(hosts, nic, res))
            print(rows[-1], flush=True)
    write_results(a.name, rows, list(rows[0]), extra={"runs": raw, "segment_elems": a.segment_elems},
                  notes=f"{a.repeats} timed calls of each implementation per case, interleaved in the "
                        "same processes after 2 warm-ups each; median (min–max). 'ring / builtin' is "
                        "the ratio of medians (and the range of per-pair ratios). Bulk TCP tops out at "
                        "0.956 of the link (frame headers). CPU-bound = the machine's 2 cores were "
                        f"≥ {CPU_BOUND_BUSY:.0%} busy during the ring's calls (/proc/stat).")


if __name__ == "__main__":
    main()
