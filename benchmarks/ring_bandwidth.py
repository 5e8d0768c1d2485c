"""polytrain's explicit ring all-reduce against gloo's own all-reduce, same processes, same tensor:
bus bandwidth (nccl-tests' definition: 2(W−1)/W · bytes / time) and the ring/builtin ratio.

    .venv/bin/python benchmarks/ring_bandwidth.py [--worlds 2,4] [--mib 1,16] [--repeats 7]

W processes on this machine over loopback (gloo), one float32 tensor of each size; per size,
2 warm-up calls of each, then ``--repeats`` timed calls alternating builtin, ring, builtin, ...
Each call's time is the slowest rank's (a barrier before each call, the max over ranks after).
Loopback has no link rate, so what is measured is the implementations against each other on a
CPU-bound path (the ring's adds happen in Python-driven torch ops, segment by segment); the
emulated testbed (``polytrain testbed``, root) is where a link rate would be the ceiling.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from harness import fmt_spread, spread, write_results  # noqa: E402


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, world: int, port: int, sizes: list[int], repeats: int, out: str) -> None:
    import json

    import torch
    import torch.distributed as dist

    from polytrain.comm import Comm
    from polytrain.comm.ring import ring_all_reduce

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    comm = Comm(rank, world)
    times: dict[str, list[list[float]]] = {}
    for mib in sizes:
        t = torch.randn(mib * 2**18)
        calls = {"builtin": lambda t=t: dist.all_reduce(t), "ring": lambda t=t: ring_all_reduce(t, comm)}
        for kind in ("builtin", "ring", "builtin", "ring"):  # warm-up
            calls[kind]()
        for i in range(2 * repeats):
            kind = ("builtin", "ring")[i % 2]
            dist.barrier()
            t0 = time.perf_counter()
            calls[kind]()
            mine = torch.tensor([time.perf_counter() - t0])
            dist.all_reduce(mine, op=dist.ReduceOp.MAX)
            times.setdefault(f"{mib}:{kind}", []).append([float(mine)])
    if rank == 0:
        Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp

    p = argparse.ArgumentParser()
    p.add_argument("--worlds", default="2,4")
    p.add_argument("--mib", default="1,16")
    p.add_argument("--repeats", type=int, default=7)
    a = p.parse_args()
    import json

    sizes = [int(x) for x in a.mib.split(",")]
    rows: list[dict[str, Any]] = []
    raw: dict[str, Any] = {}
    for world in (int(x) for x in a.worlds.split(",")):
        out = Path(tempfile.mkdtemp()) / "times.json"
        mp.spawn(_rank, args=(world, _port(), sizes, a.repeats, str(out)), nprocs=world, join=True)
        times = json.loads(out.read_text())
        raw[str(world)] = times
        for mib in sizes:
            nbytes = mib * 2**20
            bus = {k: [2 * (world - 1) / world * nbytes / t[0] / 1e6 for t in times[f"{mib}:{k}"]]
                   for k in ("builtin", "ring")}
            ratio = spread(bus["ring"])["median"] / spread(bus["builtin"])["median"]
            rows.append({"W": world, "MiB": mib, "builtin bus MB/s": fmt_spread(bus["builtin"], 0),
                         "ring bus MB/s": fmt_spread(bus["ring"], 0), "ring / builtin": f"{ratio:.2f}"})
            print(rows[-1], flush=True)
    write_results("ring_bandwidth", rows, list(rows[0]), extra={"times_s": raw},
                  notes=f"{a.repeats} timed calls of each, interleaved, after 2 warm-ups; median "
                        "(min–max) of the slowest rank's time per call; one torch thread per rank. "
                        "Loopback on the shared 2-vCPU machine: W=4 puts 4 ranks on 2 cores, so both "
                        "are CPU-bound there (load average in the JSON).")


if __name__ == "__main__":
    main()
