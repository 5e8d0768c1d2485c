"""Explicit ring all-reduce: the schedule as plain data, and ring == dist.all_reduce over gloo."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from polytrain.comm import Comm
from polytrain.comm.ring import (
    chunk_bounds,
    half_schedule,
    ring_all_reduce,
    ring_reduce_scatter,
    ring_schedule,
)


def test_schedule_simulated_sums_every_chunk() -> None:
    """Replaying the schedule on W lists of chunk contents yields the full sum everywhere."""
    for world in (2, 3, 4, 5, 8):
        held = [[{r} for _ in range(world)] for r in range(world)]  # held[rank][chunk] = ranks summed
        plans = [ring_schedule(r, world) for r in range(world)]
        assert all(len(p) == 2 * (world - 1) for p in plans)
        for i in range(2 * (world - 1)):
            msgs = [(p[i], set(held[r][p[i].send_chunk])) for r, p in enumerate(plans)]
            for r in range(world):
                phase, payload = msgs[(r - 1) % world]
                assert phase.send_chunk == plans[r][i].recv_chunk
                mine = held[r][phase.send_chunk]
                held[r][phase.send_chunk] = mine | payload if phase.kind == "reduce-scatter" else payload
        assert all(c == set(range(world)) for row in held for c in row)


def test_half_schedules_leave_rank_r_with_chunk_r() -> None:
    """Replayed alone, the shifted reduce-scatter leaves rank r with the full sum of chunk r, and
    the shifted all-gather spreads every rank's chunk r to all (torch's tensor layouts)."""
    for world in (2, 3, 4, 5):
        held = [[{r} for _ in range(world)] for r in range(world)]
        plans = [half_schedule("reduce-scatter", r, world) for r in range(world)]
        for i in range(world - 1):
            msgs = [(p[i], set(held[r][p[i].send_chunk])) for r, p in enumerate(plans)]
            for r in range(world):
                phase, payload = msgs[(r - 1) % world]
                assert phase.send_chunk == plans[r][i].recv_chunk
                held[r][phase.send_chunk] |= payload
        assert all(held[r][r] == set(range(world)) for r in range(world))
        for kind in ("reduce-scatter", "all-gather"):  # each phase forwards what the last received
            for r in range(world):
                p = half_schedule(kind, r, world)
                assert all(p[i].send_chunk == p[i - 1].recv_chunk for i in range(1, world - 1))
        have = [{r} for r in range(world)]  # chunks each rank holds
        plans = [half_schedule("all-gather", r, world) for r in range(world)]
        for i in range(world - 1):
            sent = [p[i].send_chunk for p in plans]
            assert all(c in h for c, h in zip(sent, have, strict=True))  # held before this phase
            for r in range(world):
                assert plans[r][i].recv_chunk == sent[(r - 1) % world]
                have[r].add(plans[r][i].recv_chunk)
        assert all(h == set(range(world)) for h in have)


def test_chunks_cover_the_tensor_and_may_be_empty() -> None:
    assert chunk_bounds(2, 5) == [(0, 0), (0, 0), (0, 1), (1, 1), (1, 2)]
    assert chunk_bounds(10, 3) == [(0, 3), (3, 6), (6, 10)]
    with pytest.raises(ValueError, match="world size >= 2"):
        ring_schedule(0, 1)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


SIZES = [(1,), (4,), (7,), (33, 3), (1001,)]


def _check(comm: Comm, group: object, shape: tuple[int, ...], dtype: torch.dtype, seg: int) -> None:
    gen = torch.Generator().manual_seed(1000 * comm.rank + sum(shape))
    if dtype.is_floating_point:
        t = torch.randn(shape, generator=gen, dtype=dtype) * 1e3
    else:
        t = torch.randint(-(2**40), 2**40, shape, generator=gen, dtype=dtype)
    want = t.clone()
    dist.all_reduce(want, group=group)
    before = comm.by_op().get("ring", 0)
    stats = ring_all_reduce(t, comm, segment_elems=seg)
    if dtype.is_floating_point:
        torch.testing.assert_close(t, want, rtol=1e-5, atol=1e-3)
    else:
        assert torch.equal(t, want), (comm.world, shape)
    w, n = comm.world, t.numel()
    assert len(stats.phases) == 2 * (w - 1)
    assert [p.phase.kind for p in stats.phases] == ["reduce-scatter"] * (w - 1) + ["all-gather"] * (w - 1)
    assert comm.by_op().get("ring", 0) - before == stats.bytes_sent
    sizes = [b - a for a, b in chunk_bounds(n, w)]
    expect = sum(sizes[p.phase.send_chunk] for p in stats.phases) * t.element_size()
    assert stats.bytes_sent == expect
    if n % w == 0:
        assert stats.bytes_sent == 2 * (w - 1) * n * t.element_size() // w


def _worker(rank: int, port: int, world: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    groups = {w: dist.new_group(list(range(w))) for w in range(2, world + 1)}
    for w, group in groups.items():
        if rank >= w:
            continue
        comm = Comm(rank, w, group=group)
        for shape in SIZES:
            for dtype in (torch.float32, torch.int64):
                _check(comm, group, shape, dtype, 16)  # 1001 elements: many segments per chunk
        # a non-contiguous tensor is summed in place too
        t = torch.arange(12, dtype=torch.float32).reshape(3, 4).t() * (rank + 1)
        ring_all_reduce(t, comm)
        assert torch.equal(t, torch.arange(12, dtype=torch.float32).reshape(3, 4).t() * (w * (w + 1) / 2))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
def test_ring_equals_builtin_all_reduce_w2_to_w5() -> None:
    mp.spawn(_worker, args=(_port(), 5), nprocs=5, join=True)


def _check_halves(comm: Comm, group: object, s: int) -> None:
    """Comm's reduce_scatter / all_gather_into on CPU (polytrain's ring over p2p) equal torch's
    gloo collectives bit for bit on integers, send (W−1)·S elements per rank as counted, and two
    asynchronous calls in flight complete in order."""
    w, r = comm.world, comm.rank
    gen = torch.Generator().manual_seed(100 * r + s)
    full = torch.randint(-(2**40), 2**40, (w * s,), generator=gen, dtype=torch.int64)
    mine = torch.randint(-(2**40), 2**40, (s,), generator=gen, dtype=torch.int64)
    want_rs, want_ag = torch.empty(s, dtype=torch.int64), torch.empty(w * s, dtype=torch.int64)
    dist.reduce_scatter_tensor(want_rs, full.clone(), group=group)
    dist.all_gather_into_tensor(want_ag, mine, group=group)
    kept = full.clone()
    before = comm.bytes_sent
    rs, ag = torch.empty(s, dtype=torch.int64), torch.empty(w * s, dtype=torch.int64)
    works = [comm.reduce_scatter(rs, full, async_op=True), comm.all_gather_into(ag, mine, async_op=True)]
    full.zero_()  # the caller may reuse its input once the call returns
    for work in works:
        assert work.wait()
    assert torch.equal(rs, want_rs) and torch.equal(ag, want_ag), (w, s)
    assert comm.bytes_sent - before == 2 * (w - 1) * s * 8
    out = torch.empty(s, dtype=torch.int64)
    ring_reduce_scatter(out, kept, comm, segment_elems=3)  # many segments per chunk
    assert torch.equal(out, want_rs)
    x = torch.randn(w * s, generator=gen)
    got, want = torch.empty(s), torch.empty(s)
    comm.reduce_scatter(got, x)
    dist.reduce_scatter_tensor(want, x, group=group)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _halves_worker(rank: int, port: int, world: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    groups = {w: dist.new_group(list(range(w))) for w in range(2, world + 1)}
    for w, group in groups.items():
        if rank < w:
            comm = Comm(rank, w, group=group)
            for s in (1, 7, 1001):
                _check_halves(comm, group, s)
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
def test_comm_reduce_scatter_and_all_gather_are_the_ring_w2_to_w4() -> None:
    mp.spawn(_halves_worker, args=(_port(), 4), nprocs=4, join=True)
