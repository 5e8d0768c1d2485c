"""What each collective puts on the wire, against the ring formulas (needs root).

    sudo .venv/bin/python benchmarks/collective_wire.py [--hosts 4] [--nic 1gbit]
        [--chunk-elems 262145] [--calls 10] [--lock FILE]

One rank per emulated host (``polytrain.testbed.hosts``) runs each collective ``--calls`` times
on float32 tensors of chunk S = ``--chunk-elems`` (full tensor W·S) and reads its own
interface's tx counter around them (``collective_wire_rank.py``): gloo's ``all_reduce``,
``reduce_scatter_tensor``, ``all_gather_into_tensor``, and the same through polytrain's
accounted ``Comm``. Beside each: the bandwidth-optimal ring's bytes per rank per call (all-reduce
2(W−1)·S·4, reduce-scatter and all-gather (W−1)·S·4) and what ``Comm`` counted. The NIC counters
include TCP/IP headers (about +0.3 % at 1gbit) and the barriers around each batch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from harness import write_results  # noqa: E402


def ring_bytes(collective: str, world: int, s: int) -> int:
    """Bytes one rank sends per call in a bandwidth-optimal ring (float32)."""
    chunks = 2 * (world - 1) if "all_reduce" in collective else world - 1
    return chunks * s * 4


def measure(a: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="collective-wire-"))
    code = ("import sys; from pathlib import Path; from polytrain.testbed.hosts import Testbed; "
            "from polytrain.testbed.torchrun import run_torchrun\n"
            f"with Testbed({a.hosts}, {a.nic!r}) as tb:\n"
            f"    rc = run_torchrun(tb, [{str(HERE / 'collective_wire_rank.py')!r}, {str(work)!r}, "
            f"'{a.chunk_elems}', '{a.calls}'], 1, timeout=900, log_dir={str(work / 'logs')!r})\n"
            "sys.exit(rc)")
    lock = ["flock", a.lock] if a.lock else []  # one testbed at a time on this machine
    p = subprocess.run([*lock, sys.executable, "-c", code], cwd=HERE.parent)
    if p.returncode:
        raise SystemExit(f"ranks failed (rc {p.returncode}); logs in {work / 'logs'}")
    return dict(json.loads((work / "wire.json").read_text()))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--nic", default="1gbit")
    p.add_argument("--chunk-elems", type=int, default=262145)
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--lock", default=os.environ.get("TESTBED_LOCK", ""),
                   help="hold this lock file (flock) while the testbed is up (default: $TESTBED_LOCK)")
    a = p.parse_args()
    res = measure(a)
    world, s = res["world"], res["chunk_elems"]
    rows = []
    for r in res["rows"]:
        ring = ring_bytes(r["collective"], world, s)
        tx = statistics.median(r["tx_per_call"])
        rows.append({"collective": r["collective"], "ring MB/call/rank": round(ring / 1e6, 3),
                     "NIC tx MB/call/rank": f"{tx / 1e6:.3f} ({min(r['tx_per_call']) / 1e6:.3f}–"
                                            f"{max(r['tx_per_call']) / 1e6:.3f})",
                     "NIC / ring": round(tx / ring, 3),
                     "Comm counted MB/call": round(r["counted_per_call"] / 1e6, 3)
                     if r["collective"].startswith("Comm") else "-",
                     "tx_per_call": r["tx_per_call"]})
    cols = ["collective", "ring MB/call/rank", "NIC tx MB/call/rank", "NIC / ring", "Comm counted MB/call"]
    write_results(f"collective_wire_{a.nic}", rows, cols, notes=(
        f"{world} emulated hosts, one rank each, links shaped to {a.nic}; float32, chunk S = {s} "
        f"elements (full tensor W·S), {a.calls} calls per collective after one warm-up, a barrier on "
        "either side. NIC tx: each rank's interface tx counter (headers and the two barriers "
        "included) over the calls, median (min–max) over the ranks. ring: the bandwidth-optimal "
        "ring's bytes per rank. Comm counted: what polytrain's accounted Comm counted per call. "
        "Measured on the shared 2-vCPU development machine with other jobs running (load average "
        "in the JSON)."))


if __name__ == "__main__":
    main()
