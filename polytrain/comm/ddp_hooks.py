"""DDP communication hooks that route each gradient bucket through polytrain's accounted comm.

* :func:`builtin_hook` — the backend's own all-reduce (asynchronous, overlaps backward);
* :func:`ring_hook` — polytrain's explicit ring (:mod:`polytrain.comm.ring`), blocking inside the
  hook, each of its 2(W−1) phases recorded as a ``comm`` span on the timeline.

Both return the bucket's mean over ranks. DDP checks a hook's annotation at run time, which a
postponed (string) annotation fails, so the hooks (GradBucket -> Future[Tensor]) are unannotated.
"""

from __future__ import annotations

from typing import Any

import torch

from polytrain.comm.accounted import Comm
from polytrain.comm.ring import RingStats, ring_all_reduce
from polytrain.runtime.recorder import Recorder


def done_future(tensor: torch.Tensor) -> torch.futures.Future:
    """A completed future holding ``tensor`` (what a blocking hook returns to DDP)."""
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(tensor)
    return fut


def record_ring(rec: Recorder, stats: RingStats, **fields: Any) -> None:
    """One ``comm`` span per ring phase: ``ring reduce-scatter 0`` … ``ring all-gather W-2``."""
    for p in stats.phases:
        rec.add_span(f"ring {p.phase.kind} {p.phase.step}", "comm", p.start - rec.t0, p.end - rec.t0,
                     bytes=p.bytes_sent, **fields)


def builtin_hook(comm: Comm, world: int, rec: Recorder) -> Any:
    """Mean of the bucket over ranks with the backend's all-reduce (accounted, overlapped)."""

    def hook(_state, bucket):  # type: ignore[no-untyped-def]
        buf = bucket.buffer()
        buf.div_(world)
        start, index = rec.now(), bucket.index()
        return comm.all_reduce_future(
            buf, on_done=lambda: rec.add_span("allreduce", "comm", start, rec.now(), bucket=index))

    return hook


def ring_hook(comm: Comm, world: int, rec: Recorder) -> Any:
    """Mean of the bucket over ranks with polytrain's explicit ring all-reduce (blocking)."""

    def hook(_state, bucket):  # type: ignore[no-untyped-def]
        buf = bucket.buffer()
        buf.div_(world)
        record_ring(rec, ring_all_reduce(buf, comm), bucket=bucket.index())
        return done_future(buf)

    return hook
