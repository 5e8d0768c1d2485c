"""Tier 3: the accounted communicator on real gloo process groups (2 processes)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from polytrain.comm import CollectiveMismatch, Comm


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    comm = Comm(rank, 2, check=True)
    t = torch.full((1000,), float(rank + 1))
    comm.all_reduce(t)
    ok_sum = t[0].item() == 3.0
    if rank == 0:
        comm.send(torch.zeros(10), 1)
    else:
        comm.recv(torch.zeros(10), 0)
    gathered = comm.gather_json({"rank": rank, "x": [1, 2]})
    try:  # rank 1 calls with another shape: the check must catch it on both ranks
        comm.all_reduce(torch.zeros(5 if rank == 0 else 6))
        mismatch = "not caught"
    except CollectiveMismatch as e:
        mismatch = str(e)
    Path(out, f"r{rank}.txt").write_text(repr({
        "ok_sum": ok_sum, "sent": dict(comm.by_op()), "received": comm.bytes_received,
        "gathered": gathered, "mismatch": mismatch}))
    dist.destroy_process_group()


@pytest.mark.slow
def test_bytes_are_counted_and_mismatches_caught(tmp_path: Path) -> None:
    mp.spawn(_worker, args=(_port(), str(tmp_path)), nprocs=2, join=True)
    r0 = eval((tmp_path / "r0.txt").read_text())
    r1 = eval((tmp_path / "r1.txt").read_text())
    assert r0["ok_sum"] and r1["ok_sum"]
    # ring all-reduce of 4000 bytes on 2 ranks: each sends 2*(2-1)/2 * 4000
    assert r0["sent"] == {"allreduce": 4000, "send": 40}
    assert r1["sent"] == {"allreduce": 4000}
    assert r1["received"] == 4000 + 40
    assert r0["gathered"] == [{"rank": 0, "x": [1, 2]}, {"rank": 1, "x": [1, 2]}]
    assert r1["gathered"] is None
    for r in (r0, r1):
        assert "rank 0: allredu" in r["mismatch"] and "numel=5" in r["mismatch"]
        assert "numel=6" in r["mismatch"]
