"""One rank of ``plan_blocking.py`` (run by torchrun inside an emulated host; not a CLI).

    plan_blocking_rank.py OUT_DIR CASES_JSON ITERATIONS

CASES_JSON: a list of [bytes, compute_ms]. Per case, ITERATIONS iterations of (compute_ms of
64x64 matmuls, timed by each rank alone, one after another, before any case; one blocking ``all_reduce`` of a
float32 tensor of ``bytes``), the cases interleaved round by round (the order reversed every other
round) so the machine's drift falls on all of them. Per iteration: the slowest rank's wall time and
this rank's time inside the all-reduce. Rank 0 writes OUT_DIR/times.json.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

ROUND = 5  # iterations of one case before the next case's


def _matmuls_per_ms() -> float:
    a = torch.randn(64, 64)
    for _ in range(50):
        a @ a
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.2:
        a @ a
        n += 1
    return n / ((time.perf_counter() - t0) * 1e3)


def main() -> None:
    out, cases, iterations = Path(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    per_ms = 0.0
    for i in range(world):  # one rank at a time, the others waiting in the barrier
        if i == rank:
            per_ms = _matmuls_per_ms()
        dist.barrier()
    a = torch.randn(64, 64)
    tensors = {int(b): torch.randn(max(1, int(b) // 4)) for b, _ in cases}
    for t in tensors.values():  # warm-up: connections and buffers
        dist.all_reduce(t)
    rows: list[dict[str, float]] = []
    for r in range(iterations // ROUND):
        order = cases if r % 2 == 0 else cases[::-1]
        for nbytes, compute_ms in order:
            t, n = tensors[int(nbytes)], int(per_ms * compute_ms)
            dist.barrier()
            for _ in range(ROUND):
                t0 = time.perf_counter()
                for _ in range(n):
                    a @ a
                t1 = time.perf_counter()
                dist.all_reduce(t)
                t2 = time.perf_counter()
                rows.append({"bytes": nbytes, "compute_ms": compute_ms, "round": r,
                             "wall_s": t2 - t0, "compute_s": t1 - t0, "comm_s": t2 - t1})
    stats = torch.tensor([[x["wall_s"], x["compute_s"], x["comm_s"]] for x in rows])
    gathered = [torch.zeros_like(stats) for _ in range(world)]
    dist.all_gather(gathered, stats)
    if rank == 0:
        every = torch.stack(gathered)  # ranks x rows x 3
        for i, x in enumerate(rows):
            x["wall_s_ranks"] = every[:, i, 0].tolist()
            x["compute_s_ranks"] = every[:, i, 1].tolist()
            x["comm_s_ranks"] = every[:, i, 2].tolist()
        (out / "times.json").write_text(json.dumps({"world": world, "matmuls_per_ms": per_ms, "rows": rows}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
