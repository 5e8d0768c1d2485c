"""``hogwild``: lock-free SGD on one shared parameter copy (Hogwild!, Recht et al. 2011).

All W ranks run on ONE host and map the same parameters: rank 0 creates a file in /dev/shm
holding the flat parameter vector (N,) f32, writes the initial model into it, and after a
barrier every rank maps it with ``torch.from_file(shared=True)`` (our ranks are independent
processes started by the launcher, so ``Tensor.share_memory_()`` — which needs a common parent —
does not apply). Each rank's model parameters are views of that mapping: a forward reads
whatever the other ranks have written so far, and each update is written in place, with no lock:

    rank r, step s:  read (forward on part r of batch s) -> backward -> write w -= lr·g

Each rank takes its own share of every global batch (``--batch-size`` B over W ranks: B/W
samples per update), so one step of the job is W updates of B/W samples on different data.

On sparse data (``sparse-bow``: ~10 features per sample) a gradient touches few coordinates, so
only those are written (an ``index_add_`` of the non-zero entries); updates rarely collide,
which is why dropping the lock costs no accuracy. ``lock=true`` is the baseline: the write takes
an exclusive ``flock`` on a lock file next to the mapping, so writes never run concurrently (the
update is prepared from the private gradient before the lock is taken; only the write holds it).

Measured, not assumed (strategy_metrics): ``updates_per_s`` (all ranks' writes / wall time),
``overlapping_updates`` (writes whose [start, end] interval overlaps another rank's write —
the clock is CLOCK_MONOTONIC, shared by the processes of one host), and ``interleaved_updates``
(writes made on parameters another rank changed between this update's read and its write).
With ``lock=true`` overlapping_updates must be 0; without it, it shows the concurrency is real.
``write_share`` (time inside writes / (wall · ranks)) and ``lock_wait_s`` (all ranks' time spent
acquiring the lock) say how much a lock can cost: little when writes are a small share.
``mapped_files`` (distinct device/inode pairs the ranks mapped: 1) and ``shared_writes_seen``
(probe writes each rank read back from the others through its own mapping before training:
W·(W−1)) show the memory is really one copy; ``samples_per_update`` is each rank's share.

Plain SGD only (``--optimizer sgd``): per-rank optimizer state would not be shared.
"""

from __future__ import annotations

import bisect
import fcntl
import hashlib
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict

from polytrain.config import JobConfig
from polytrain.errors import ConfigError
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.loop import LoopSpec, run_loop
from polytrain.runtime.supports import Supports, refusing
from polytrain.strategies.base import Strategy
from polytrain.strategies.data.allreduce import check_divisible

SPARSE_BELOW = 0.5  # write only the non-zero entries when fewer than this fraction are non-zero


class HogwildOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lock: bool = False


def multi_host_problem(env: Mapping[str, str] | None = None) -> str | None:
    """Why this job spans several hosts (torchrun's LOCAL_WORLD_SIZE < WORLD_SIZE), or None."""
    env = os.environ if env is None else env
    local, world = env.get("LOCAL_WORLD_SIZE"), env.get("WORLD_SIZE")
    if local and world and int(local) != int(world):
        return f"torchrun runs {local} of its {world} processes on this host (LOCAL_WORLD_SIZE={local})"
    return None


def refuse_multi_host(name: str) -> None:
    problem = multi_host_problem()
    if problem:
        raise ConfigError(
            f"Strategy '{name}' shares one parameter copy in this host's memory, so all its ranks "
            f"must run on one host, but {problem}. Run it on one host (torchrun --nnodes 1, or "
            "polytrain train --procs N), or pick a multi-host strategy such as ps or allreduce."
        )


def shm_path(ctx: RankContext) -> Path:
    """The same name on every rank of this job, different for every job."""
    env = os.environ
    key = f"{ctx.run_dir.resolve()}|{env.get('MASTER_PORT', '')}|{env.get('TORCHELASTIC_RUN_ID', '')}"
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    return base / f"polytrain-hogwild-{hashlib.sha1(key.encode()).hexdigest()[:16]}"


def map_shared(model: torch.nn.Module, ctx: RankContext) -> tuple[torch.Tensor, dict[str, int]]:
    """Make every parameter of ``model`` a view of one shared (N,) mapping.

    Returns the mapping and what this rank saw of it: ``file`` (the mapped file's device and
    inode, the same on every rank when they map one file) and ``saw_writes`` (how many other
    ranks' probe writes this rank read back through its own mapping, W-1 when the memory is
    shared; no data travels but barriers).
    """
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    path = shm_path(ctx)
    if ctx.is_leader:
        flat = torch.from_file(str(path), shared=True, size=n, dtype=torch.float32)
        flat.copy_(torch.cat([p.detach().reshape(-1) for p in params]))
    ctx.comm.barrier()
    if not ctx.is_leader:
        flat = torch.from_file(str(path), shared=True, size=n, dtype=torch.float32)
    st = path.stat()
    seen = {"file": st.st_dev * 2**32 + st.st_ino, "saw_writes": probe_shared(flat, ctx)}
    ctx.comm.barrier()
    if ctx.is_leader:
        path.unlink()  # every rank holds its mapping; the name is no longer needed
    pos = 0
    for p in params:
        p.data = flat[pos : pos + p.numel()].view_as(p)
        pos += p.numel()
    return flat, seen


def probe_shared(flat: torch.Tensor, ctx: RankContext) -> int:
    """Each rank in turn writes a marker into element 0; the others read it through their own
    mapping. Returns how many other ranks' markers this rank saw; element 0 is restored."""
    first = float(flat[0])
    saw = 0
    for writer in range(ctx.world):
        marker = -1000.0 - writer  # exact in float32; no initial weight is near it
        if ctx.rank == writer:
            flat[0] = marker
        ctx.comm.barrier()
        if ctx.rank != writer and float(flat[0]) == marker:
            saw += 1
        ctx.comm.barrier()
    if ctx.is_leader:
        flat[0] = first
    return saw


class FileLock(AbstractContextManager["FileLock"]):
    """An exclusive flock shared by independently started processes of one host."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)

    def __enter__(self) -> FileLock:
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: Any) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self.fd)


Update = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]  # (flat w, indices or None, -lr·g)


@torch.no_grad()
def sgd_updates(params: Sequence[torch.Tensor], lr: float) -> list[Update]:
    """What w -= lr·g writes, prepared from this rank's private gradients (no shared access):
    a sparse gradient becomes its non-zero coordinates and their -lr·g values."""
    out: list[Update] = []
    for p in params:
        if p.grad is None:
            continue
        g, w = p.grad.reshape(-1), p.data.view(-1)
        idx = g.nonzero().squeeze(1)
        if idx.numel() < SPARSE_BELOW * g.numel():
            out.append((w, idx, g[idx].mul_(-lr)))
        else:
            out.append((w, None, g.mul(-lr)))
    return out


@torch.no_grad()
def apply_updates(updates: list[Update]) -> None:
    """The shared write itself (the only part ``lock=true`` serialises)."""
    for w, idx, vals in updates:
        if idx is None:
            w.add_(vals)
        else:
            w.index_add_(0, idx, vals)


def sgd_write(params: Sequence[torch.Tensor], lr: float) -> None:
    """w -= lr·g in place; sparse gradients write only their non-zero coordinates."""
    apply_updates(sgd_updates(params, lr))


def overlapping(writes: list[list[tuple[float, float, float]]]) -> int:
    """Writes whose [start, end] overlaps a write of another rank; writes[r] = (read, start, end)."""
    spans = sorted((s, e, r) for r, ws in enumerate(writes) for _, s, e in ws)
    active: list[tuple[float, int, int]] = []  # (end, rank, index)
    hit: set[int] = set()
    for i, (s, e, r) in enumerate(spans):
        active = [a for a in active if a[0] > s]
        for _, r2, j in active:
            if r2 != r:
                hit.update((i, j))
        active.append((e, r, i))
    return len(hit)


def interleaved(writes: list[list[tuple[float, float, float]]]) -> int:
    """Writes made after another rank finished a write during this update's read-to-write."""
    count = 0
    for r, ws in enumerate(writes):
        others = sorted(e for r2, w2 in enumerate(writes) if r2 != r for _, _, e in w2)
        for read, start, _ in ws:
            if bisect.bisect_left(others, start) > bisect.bisect_right(others, read):
                count += 1
    return count


class Hogwild(Strategy):
    name = "hogwild"
    family = "data"
    summary = "lock-free SGD of W processes on one shared parameter copy (one host)"
    Options = HogwildOptions
    multi_host = False
    supports = Supports(why=refusing({
        "clip": ("each rank writes w -= lr·g into the shared copy itself, outside the job's optimizer; "
                 "clipping here would mean each rank's gradient by its own norm before its write (per "
                 "worker, per update), which is not built"),
        "grad_accum": ("an update is one lock-free write of one B/W-sample gradient; K micro-batches "
                       "per write would make writes K times rarer, changing how often updates collide, "
                       "and is not built"),
        "precision": ("the shared copy is one fp32 mapping written in place without a lock; fp16 "
                      "would need the ranks to agree on skipping a write, which lock-free writes "
                      "cannot do")}))

    def check(self, cfg: JobConfig, world: int) -> None:
        check_divisible(cfg, world, self.name)
        if cfg.optimizer != "sgd":
            raise ConfigError(
                f"Strategy 'hogwild' writes plain SGD updates (w -= lr·g) into the shared copy; "
                f"--optimizer {cfg.optimizer} would need per-rank state. Use --optimizer sgd."
            )
        refuse_multi_host(self.name)

    def run(self, job: Job, ctx: RankContext) -> RankResult:
        opts: HogwildOptions = self.options  # type: ignore[assignment]
        refuse_multi_host(self.name)
        model = job.build_model()
        params = list(model.parameters())
        _, seen = map_shared(model, ctx)
        lock = FileLock(shm_path(ctx).with_suffix(".lock")) if opts.lock else None
        if lock is not None:  # every rank holds it open: its name can go (nothing left in /dev/shm)
            ctx.comm.barrier()
            if ctx.is_leader:
                shm_path(ctx).with_suffix(".lock").unlink()
        optimizer = torch.optim.SGD(params, lr=job.config.lr)  # for checkpoints; never stepped
        writes: list[tuple[float, float, float]] = []
        waited = 0.0  # seconds spent acquiring the lock
        share = 0  # samples per update (this rank's part of the global batch)
        rec = ctx.recorder

        def step(i: int, x: torch.Tensor, y: torch.Tensor) -> float:
            nonlocal waited, share
            share = len(x)
            read = time.monotonic()
            model.zero_grad(set_to_none=True)
            with rec.span("forward", step=i):
                loss = job.forward_loss(model, x, y)
            with rec.span("backward", step=i):
                loss.backward()
            updates = sgd_updates(params, job.config.lr)
            guard: AbstractContextManager[Any] = lock if lock is not None else nullcontext()
            ask = time.monotonic()
            with guard:
                start = time.monotonic()
                waited += start - ask
                apply_updates(updates)
                writes.append((read, start, time.monotonic()))
            if i == job.steps:
                ctx.comm.barrier()  # rank 0 evaluates the final shared copy, after every write
            return float(loss.detach())

        # quiesce: a checkpoint reads the shared copy while no rank writes (a consistent state)
        # each rank trains on its own part of every global batch
        spec = LoopSpec(model=model, optimizer=optimizer, step_fn=step, part=ctx.rank,
                        parts=ctx.world, quiesce=True)
        result = run_loop(job, ctx, spec)
        if lock is not None:
            lock.close()
        # every rank is done
        gathered = ctx.comm.gather_json({"writes": writes, "waited": waited, "share": share, **seen})
        if gathered is not None:  # with the lock (a collective)
            everyone = [g["writes"] for g in gathered]
            write_s = sum(e - s for w in everyone for _, s, e in w)
            shm_path(ctx).with_suffix(".lock").unlink(missing_ok=True)
            wall = max(w[-1][2] for w in everyone if w) - min(w[0][0] for w in everyone if w)
            total = sum(len(w) for w in everyone)
            result.strategy_metrics = {
                "lock": opts.lock, "updates": total,
                "updates_per_s": round(total / wall, 3) if wall > 0 else 0.0,
                "overlapping_updates": overlapping(everyone),
                "interleaved_updates": interleaved(everyone),
                "write_share": round(write_s / (wall * len(everyone)), 4) if wall > 0 else 0.0,
                "lock_wait_s": round(sum(g["waited"] for g in gathered), 4),
                "mapped_files": len({g["file"] for g in gathered}),
                "shared_writes_seen": sum(g["saw_writes"] for g in gathered),
                "samples_per_update": sorted({g["share"] for g in gathered}),
            }
        return result
