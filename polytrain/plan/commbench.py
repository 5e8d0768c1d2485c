"""α–β of the local backend, measured: a quick real 2-process gloo run on loopback.

Rank 0 and rank 1 ping-pong messages of a few sizes (one-way time = round trip / 2) and all-reduce
tensors of the same sizes; a least-squares line time = α + S/β through the medians gives each
pattern's α (seconds) and β (bytes/s). For the all-reduce on 2 ranks the ring moves S bytes each
way (2(n−1)/n = 1), so its β is comparable to the point-to-point one. About two seconds.

The two processes meet as a local training run's ranks do: through a ``FileStore`` in a private
(0700) temporary directory, removed afterwards, with gloo on the loopback interface; no store
listens on a socket (:func:`polytrain.launch.stores.rank_store_env`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from polytrain.env import restored
from polytrain.launch.stores import rank_store, rank_store_env

SIZES = (4_096, 262_144, 2_097_152, 8_388_608)  # bytes


def fit_alpha_beta(sizes: list[float], seconds: list[float]) -> dict[str, float]:
    """Least squares ``seconds = α + size/β``; α clamped at 0 and β at a positive value."""
    n = len(sizes)
    mx, my = sum(sizes) / n, sum(seconds) / n
    var = sum((x - mx) ** 2 for x in sizes)
    slope = sum((x - mx) * (y - my) for x, y in zip(sizes, seconds, strict=True)) / var if var else 0.0
    slope = max(slope, 1e-15)
    return {"alpha_s": max(0.0, my - slope * mx), "bytes_per_s": 1.0 / slope}


def _time(fn: Any, repeats: int) -> float:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def _worker(rank: int, repeats: int, queue: Any) -> None:
    torch.set_num_threads(1)
    store = rank_store(timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    p2p, ar = [], []
    for size in SIZES:
        t = torch.zeros(size // 4)

        def ping(t: torch.Tensor = t) -> None:
            if rank == 0:
                dist.send(t, 1)
                dist.recv(t, 1)
            else:
                dist.recv(t, 0)
                dist.send(t, 0)

        ping()
        p2p.append(_time(ping, repeats) / 2)
        dist.all_reduce(t)
        dist.barrier()
        ar.append(_time(lambda t=t: dist.all_reduce(t), repeats))
    if rank == 0:
        queue.put(
            {
                "p2p": fit_alpha_beta(list(SIZES), p2p),
                "allreduce": fit_alpha_beta(list(SIZES), ar),
                "samples": {"sizes": list(SIZES), "p2p_s": p2p, "allreduce_s": ar},
            }
        )
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # why: a clean exit of a gloo child can abort in torch's teardown


@contextlib.contextmanager
def private_store() -> Iterator[None]:
    """While inside: the environment that gives processes started now (spawn) a FileStore in a
    private temporary directory (0700), removed on the way out, with the caller's restored."""
    private = Path(tempfile.mkdtemp(prefix="polytrain-profile-"))
    values = rank_store_env(private / "store")
    try:
        with restored(values):
            os.environ.update(values)
            yield
    finally:
        shutil.rmtree(private, ignore_errors=True)


def measure_comm(repeats: int = 7, timeout_s: float = 60.0) -> dict[str, Any]:
    """``{"p2p": {alpha_s, bytes_per_s}, "allreduce": {...}, "samples": ...}`` of gloo on loopback."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, repeats, queue)) for r in range(2)]
    with private_store():
        for p in procs:
            p.start()
        try:
            result: dict[str, Any] = queue.get(timeout=timeout_s)
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
    return result
