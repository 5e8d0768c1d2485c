"""One rank of ``testbed_p2p.py`` (run by torchrun inside an emulated host; not a CLI).

    testbed_p2p_rank.py OUT_DIR SIZES_BYTES REPEATS

Ranks 0 and 1 (on two emulated hosts) play ping-pong with gloo ``send``/``recv`` of a float32
tensor of each size in SIZES_BYTES (comma-separated): 3 warm-up round trips, then REPEATS timed
ones; a message's time is half a round trip. Rank 0 writes OUT_DIR/p2p.json. Other ranks idle.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist


def main() -> None:
    out, sizes, repeats = Path(sys.argv[1]), [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    result = []
    for size in sizes:
        t = torch.zeros(max(1, size // 4))
        times = []
        for i in range(3 + repeats):
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(t, 1)
                dist.recv(t, 1)
            elif rank == 1:
                dist.recv(t, 0)
                dist.send(t, 0)
            if i >= 3:
                times.append((time.perf_counter() - t0) / 2)
        result.append({"bytes": t.numel() * 4, "one_way_s": times})
    if rank == 0:
        (out / "p2p.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
