"""Point-to-point message time between two emulated hosts, against the planner's α + S/β (needs
root): what one pipeline boundary message costs on the testbed.

    sudo .venv/bin/python benchmarks/testbed_p2p.py [--hosts 2] [--nics 100mbit,1gbit]
        [--sizes 4,32768,131072,524288] [--repeats 50] [--name testbed_p2p]

One process per emulated host (``polytrain.testbed.hosts``), ranks 0 and 1 on two hosts play
ping-pong with gloo send/recv (``testbed_p2p_rank.py``); a message's time is half a round trip,
median (min–max) of ``--repeats``. Beside it: the planner's price of the same message on the
same cluster (`cost.network.p2p_s` on `plan.predict.run_cluster`) with the shapers' bucket as
ping-pong leaves it: each direction idles while the reply travels, so the bucket holds what
refilled in one message time (`cost.network.refilled`) — the fixed point t = p2p_s(S, refilled(t)).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from harness import fmt_spread, write_results  # noqa: E402

from polytrain.cost.cluster import Cluster  # noqa: E402
from polytrain.cost.network import p2p_s, refilled  # noqa: E402
from polytrain.plan.predict import run_cluster  # noqa: E402
from polytrain.testbed.hosts import Testbed  # noqa: E402
from polytrain.testbed.netns import parse_rate  # noqa: E402
from polytrain.testbed.torchrun import run_torchrun  # noqa: E402


def run_case(hosts: int, nic: str, sizes: str, repeats: int) -> list[dict[str, Any]]:
    work = Path(tempfile.mkdtemp(prefix="p2p-testbed-"))
    with Testbed(hosts, nic) as tb:
        rc = run_torchrun(tb, [str(HERE / "testbed_p2p_rank.py"), str(work), sizes, str(repeats)], 1,
                          timeout=600, log_dir=work / "logs")
    if rc != 0:
        raise SystemExit(f"{hosts} hosts {nic}: ranks failed (rc {rc}); logs in {work / 'logs'}")
    return json.loads((work / "p2p.json").read_text())


def ping_pong_s(nbytes: int, cluster: Cluster) -> float:
    """The planner's one-way time in a ping-pong: t = p2p_s(S) on the bucket refilled for t (by
    bisection; the right side falls as t grows)."""
    lo, hi = 0.0, p2p_s(nbytes, 0, 1, refilled(cluster, 0.0))
    for _ in range(60):
        mid = (lo + hi) / 2
        if p2p_s(nbytes, 0, 1, refilled(cluster, mid)) > mid:
            lo = mid
        else:
            hi = mid
    return hi


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--nics", default="100mbit,1gbit")
    p.add_argument("--sizes", default="4,32768,131072,524288")
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--name", default="testbed_p2p")
    a = p.parse_args()
    rows = []
    for nic in a.nics.split(","):
        cluster = run_cluster(a.hosts, {"hosts": a.hosts, "rate_bits_per_s": parse_rate(nic)})
        for r in run_case(a.hosts, nic, a.sizes, a.repeats):
            med = statistics.median(r["one_way_s"])
            model = ping_pong_s(r["bytes"], cluster)
            rows.append({"hosts": a.hosts, "nic": nic, "bytes": r["bytes"],
                         "measured ms": fmt_spread([1e3 * x for x in r["one_way_s"]], 3),
                         "planner ms": round(1e3 * model, 3), "measured / planner": round(med / model, 2),
                         "samples": r["one_way_s"]})
    cols = ["hosts", "nic", "bytes", "measured ms", "planner ms", "measured / planner"]
    write_results(a.name, rows, cols, notes=(
        f"Ranks 0 and 1 on two of {a.hosts} emulated hosts, gloo send/recv ping-pong, one torch thread; a "
        f"message = half a round trip; {a.repeats} timed round trips after 3 warm-ups per size, median "
        "(min–max). 'planner ms': `cost.network.p2p_s` on the run's cluster (configured latency, shaped "
        "rate) with each direction's bucket refilled for one message time, as ping-pong leaves it; "
        "without plan_accuracy's calibrated extra α."))


if __name__ == "__main__":
    main()
