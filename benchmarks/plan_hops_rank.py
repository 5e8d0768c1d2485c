"""One rank of ``plan_hops.py`` (run by torchrun inside an emulated host; not a CLI).

    plan_hops_rank.py OUT_DIR CASES_JSON ITERATIONS

CASES_JSON: a list of [op, bytes]; op is ``allreduce`` (a float32 tensor of ``bytes``), ``allgather``
(each rank gives ``bytes`` / W), ``p2p`` (a ring of blocking sends: rank 0 sends ``bytes`` to rank 1,
each rank passes what it received on, rank W−1 back to rank 0 — W messages one after another) or
``direct`` (a reduce-scatter sent directly, as `shard_collectives.reduce_scatter` does: every rank
posts its W−1 parts of ``bytes`` / W to their owners and a receive from each, then waits on all) or
``shift`` (every rank at once sends ``bytes`` to its successor and receives from its predecessor:
a pipeline's boundaries all busy together) or ``relay`` (the p2p ring sent as a pipeline's stages
send: each rank keeps a receive from its predecessor posted ahead, waits on it, passes the tensor on
with ``isend`` and posts the next receive; rank 0 starts each ring) or ``posted_shift`` (the shift
with each receive posted ahead so).
Per case ITERATIONS iterations back to back, the cases interleaved in rounds of 5 (the order
reversed every other round), a barrier before each round. Per iteration: this rank's time in the
operation (p2p: rank 0's time for the whole ring). Rank 0 writes OUT_DIR/times.json.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

ROUND = 5


def run_op(op: str, t: torch.Tensor, parts: list[torch.Tensor], rank: int, world: int) -> None:
    if op == "allreduce":
        dist.all_reduce(t)
    elif op == "allgather":
        dist.all_gather(parts, parts[rank].clone())
    elif op == "direct":
        peers = [q for q in range(world) if q != rank]
        bufs = {q: torch.empty_like(parts[rank]) for q in peers}
        works = [dist.irecv(bufs[q], q) for q in peers] + [dist.isend(parts[q], q) for q in peers]
        for w in works:
            w.wait()
    elif op == "shift":  # every rank at once to its successor, from its predecessor
        got = torch.empty_like(t)
        works = [dist.irecv(got, (rank - 1) % world), dist.isend(t, (rank + 1) % world)]
        for w in works:
            w.wait()
    elif rank == 0:
        dist.send(t, 1)
        dist.recv(t, world - 1)
    else:
        dist.recv(t, rank - 1)
        dist.send(t, (rank + 1) % world)


def posted_round(
    op: str, t: torch.Tensor, rank: int, world: int, nbytes: int, r: int
) -> list[dict[str, Any]]:
    """ROUND iterations of ``relay`` or ``posted_shift``, each rank's receive posted before the
    barrier and again as soon as the last one is consumed (as a pipeline stage's inbox keeps it):
    per iteration this rank's time (relay: the ring's)."""
    prev, nxt = (rank - 1) % world, (rank + 1) % world
    got = torch.empty_like(t)
    posted = dist.irecv(got, prev)
    dist.barrier()
    rows: list[dict[str, Any]] = []
    for i in range(ROUND):
        t0 = time.perf_counter()
        if rank == 0 or op == "posted_shift":
            sent = dist.isend(t, nxt)
            posted.wait()
        else:
            posted.wait()
            sent = dist.isend(got, nxt)
        sent.wait()
        if i + 1 < ROUND:
            got = torch.empty_like(t)
            posted = dist.irecv(got, prev)
        rows.append({"op": op, "bytes": nbytes, "round": r, "s": time.perf_counter() - t0})
    return rows


def main() -> None:
    out, cases, iterations = Path(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    tensors = {int(b): torch.randn(max(1, int(b) // 4)) for _, b in cases}
    parts = {int(b): [torch.randn(max(1, int(b) // 4 // world)) for _ in range(world)] for _, b in cases}
    for op, b in cases:  # warm-up: connections and buffers
        run_op(op, tensors[int(b)], parts[int(b)], rank, world)
    rows: list[dict[str, float | str]] = []
    for r in range(iterations // ROUND):
        for op, nbytes in cases if r % 2 == 0 else cases[::-1]:
            if op in ("relay", "posted_shift"):
                rows += posted_round(op, tensors[int(nbytes)], rank, world, nbytes, r)
                continue
            dist.barrier()
            for _ in range(ROUND):
                t0 = time.perf_counter()
                run_op(op, tensors[int(nbytes)], parts[int(nbytes)], rank, world)
                rows.append({"op": op, "bytes": nbytes, "round": r, "s": time.perf_counter() - t0})
    stats = torch.tensor([float(x["s"]) for x in rows])
    gathered = [torch.zeros_like(stats) for _ in range(world)]
    dist.all_gather(gathered, stats)
    if rank == 0:
        every = torch.stack(gathered)  # ranks x rows
        for i, x in enumerate(rows):
            x["s_ranks"] = every[:, i].tolist()
        (out / "times.json").write_text(json.dumps({"world": world, "rows": rows}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
