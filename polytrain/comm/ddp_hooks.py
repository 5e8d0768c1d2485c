"""DDP communication hooks that route each gradient bucket through polytrain's accounted comm.

* :func:`builtin_hook` — the backend's own all-reduce (asynchronous, overlaps backward);
* :func:`ring_hook` — polytrain's explicit ring (:mod:`polytrain.comm.ring`), blocking inside the
  hook, each of its 2(W−1) phases recorded as a ``comm`` span on the timeline;
* :func:`codec_hook` — a codec per bucket (:mod:`polytrain.comm.exchange`: one flat encoding of
  the bucket for casts and sparsifiers, one per parameter for quantisers): dense codecs reduce in
  place, the others all-gather variable-size payloads;
* :func:`onebit_hook` — 1-bit Adam's (:mod:`polytrain.comm.onebit_adam`): the builtin all-reduce
  during the warm-up, then each rank's local gradient untouched (the optimizer exchanges the
  compressed momentum instead);
* :func:`powersgd` — PyTorch's own ``powerSGD_hook`` (Vogels, Karimireddy & Jaggi, "PowerSGD:
  Practical Low-Rank Gradient Compression for Distributed Optimization", NeurIPS 2019), not
  rewritten: its all-reduces are counted through the accounted comm.

All return the bucket's mean over ranks (onebit_hook, once warm: the local gradient). DDP checks
a hook's annotation at run time, which a postponed (string) annotation fails, so the hooks
(GradBucket -> Future[Tensor]) are unannotated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from polytrain._torch_compat import hooks_dist
from polytrain.comm.accounted import Comm
from polytrain.comm.codecs.engine import Engine
from polytrain.comm.exchange import Item, compressed_mean
from polytrain.comm.ring import record_ring, ring_all_reduce
from polytrain.metrics.recorder import Recorder


def done_future(tensor: torch.Tensor) -> torch.futures.Future:
    """A completed future holding ``tensor`` (what a blocking hook returns to DDP)."""
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(tensor)
    return fut


def builtin_hook(comm: Comm, world: int, rec: Recorder) -> Any:
    """Mean of the bucket over ranks with the backend's all-reduce (accounted, overlapped)."""

    def hook(_state, bucket):  # type: ignore[no-untyped-def]
        buf = bucket.buffer()
        buf.div_(world)
        start, index = rec.now(), bucket.index()
        # the step whose backward runs the hook, so per-step trace statistics can see the call
        step = {} if rec.current_step is None else {"step": rec.current_step}
        return comm.all_reduce_future(
            buf, on_done=lambda: rec.add_span("allreduce", "comm", start, rec.now(), bucket=index, **step))

    return hook


def onebit_hook(comm: Comm, world: int, rec: Recorder, compressing: Callable[[], bool]) -> Any:
    """The builtin mean while ``compressing()`` is false (1-bit Adam's warm-up), else the local
    gradient as it is: no bytes, the optimizer's step exchanges the momentum."""
    warm = builtin_hook(comm, world, rec)

    def hook(state, bucket):  # type: ignore[no-untyped-def]
        return done_future(bucket.buffer()) if compressing() else warm(state, bucket)

    return hook


def ring_hook(comm: Comm, world: int, rec: Recorder) -> Any:
    """Mean of the bucket over ranks with polytrain's explicit ring all-reduce (blocking)."""

    def hook(_state, bucket):  # type: ignore[no-untyped-def]
        buf = bucket.buffer()
        buf.div_(world)
        record_ring(rec, ring_all_reduce(buf, comm), bucket=bucket.index())
        return done_future(buf)

    return hook


def codec_hook(comm: Comm, world: int, rec: Recorder, engine: Engine, names: dict[int, tuple[int, str]],
               collective: str) -> Any:
    """Mean of the bucket over ranks through ``engine``'s codec (see :func:`compressed_mean`).

    ``names``: id(parameter) -> (index in the model, name). A DDP bucket's buffer holds its
    parameters' gradients back to back, in ``bucket.parameters()`` order."""

    def hook(_state, bucket):  # type: ignore[no-untyped-def]
        buf = bucket.buffer()
        items, pos = [], 0
        for p in bucket.parameters():
            index, name = names[id(p)]
            items.append(Item(index, name, buf[pos : pos + p.numel()].view(p.shape)))
            pos += p.numel()
        means = compressed_mean(engine, comm, items, collective=collective, rec=rec)
        pos = 0
        for mean in means:
            buf[pos : pos + mean.numel()].copy_(mean)
            pos += mean.numel()
        return done_future(buf)

    return hook


class _CountingDist:
    """``torch.distributed`` as PyTorch's DDP hooks see it, with every all-reduce counted."""

    def __init__(self, real: Any, comm: Comm, op: str) -> None:
        self._real, self._comm, self._op = real, comm, op

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def all_reduce(self, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        self._comm._count_ring_allreduce(tensor, self._op)
        return self._real.all_reduce(tensor, *args, **kwargs)


def powersgd(comm: Comm, rank: int) -> tuple[Any, Any]:
    """(state, hook) of PyTorch's PowerSGD with matrix rank ``rank``, its traffic accounted
    under op ``powersgd`` (the same ring count as the builtin all-reduce). The first step runs
    a plain all-reduce (``start_powerSGD_iter=2``: DDP rebuilds its buckets after step 1)."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    hooks_dist(_CountingDist(dist, comm, "powersgd"))  # polytrain._torch_compat: why
    state = powerSGD_hook.PowerSGDState(process_group=comm.group, matrix_approximation_rank=rank,
                                        start_powerSGD_iter=2)
    return state, powerSGD_hook.powerSGD_hook


def counted_ddp(model: torch.nn.Module, comm: Comm, **kwargs: Any) -> Any:
    """``DistributedDataParallel(model)`` whose buffer broadcast goes through the accounted comm.

    DDP's default sends rank 0's buffers (BatchNorm running statistics) to every rank before each
    training forward, outside any comm hook — bytes no counter would see. Here DDP's own broadcast
    is off and a forward pre-hook does the same broadcast through ``comm`` (op ``buffers``), so the
    semantics are DDP's and the bytes are counted where sent. A model without buffers sends nothing.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(model, broadcast_buffers=False, **kwargs)
    sync_buffers(model, comm)
    return ddp


def sync_buffers(model: torch.nn.Module, comm: Comm) -> None:
    """Before each training forward, rank 0's buffers (BatchNorm statistics) reach every rank
    through ``comm`` (op ``buffers``): DDP's ``broadcast_buffers`` semantics, counted where sent.
    A model without buffers, or a world of one, sends nothing."""
    buffers = [b for b in model.buffers() if b.numel() > 0]
    if not buffers or comm.world == 1:
        return
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for b in buffers:
        by_dtype.setdefault(b.dtype, []).append(b)

    def sync(module: torch.nn.Module, _args: Any) -> None:
        if not module.training:
            return
        for group in by_dtype.values():  # one coalesced broadcast per dtype, as DDP does
            flat = torch.cat([b.reshape(-1) for b in group])
            comm.broadcast(flat, 0, op="buffers")
            at = 0
            for b in group:
                b.copy_(flat[at : at + b.numel()].view_as(b))
                at += b.numel()

    model.register_forward_pre_hook(sync)
