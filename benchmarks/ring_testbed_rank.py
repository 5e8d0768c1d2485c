"""One rank of ``ring_testbed.py`` (run by torchrun inside an emulated host; not a CLI).

    ring_testbed_rank.py OUT_DIR MIB REPEATS SEGMENT_ELEMS

All-reduces one float32 tensor of MIB MiB, 2 warm-ups of each, then REPEATS timed calls of each
alternating builtin (gloo's ``all_reduce``), ring (``polytrain.comm.ring.ring_all_reduce``),
builtin, ... (the order swapped every other pair). Per call: the slowest rank's wall time, this
rank's process CPU time and the machine's CPU busy fraction over the call (``/proc/stat``; the
namespaces share one kernel). Rank 0 writes OUT_DIR/times.json.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from polytrain.comm import Comm
from polytrain.comm.ring import ring_all_reduce


def _cpu_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def main() -> None:
    out, mib, repeats, seg = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    comm = Comm(rank, world)
    t = torch.randn(mib * 2**18)
    expect = t.clone()
    dist.all_reduce(expect)
    ring_all_reduce(check := t.clone(), comm, segment_elems=seg)
    ok = bool(torch.allclose(check, expect, rtol=1e-5, atol=1e-5))
    calls = {"builtin": lambda: dist.all_reduce(t),
             "ring": lambda: ring_all_reduce(t, comm, segment_elems=seg)}
    for kind in ("builtin", "ring", "builtin", "ring"):
        calls[kind]()
    rows: list[dict[str, object]] = []
    for i in range(repeats):
        for kind in (("builtin", "ring") if i % 2 == 0 else ("ring", "builtin")):
            t.normal_()
            dist.barrier()
            busy0, total0 = _cpu_ticks()
            c0, t0 = time.process_time(), time.perf_counter()
            calls[kind]()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            busy1, total1 = _cpu_ticks()
            stats = torch.tensor([wall, cpu])
            dist.all_reduce(stats[:1], op=dist.ReduceOp.MAX)
            dist.all_reduce(stats[1:], op=dist.ReduceOp.SUM)
            rows.append({"kind": kind, "repeat": i, "wall_s": float(stats[0]),
                         "rank_cpu_s_mean": float(stats[1]) / world,
                         "machine_busy": (busy1 - busy0) / max(total1 - total0, 1)})
    if rank == 0:
        (out / "times.json").write_text(json.dumps({"world": world, "mib": mib, "ok": ok,
                                                    "segment_elems": seg, "calls": rows}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
