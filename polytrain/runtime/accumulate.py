"""``--grad-accum K``: one optimizer step from K micro-steps of B/K samples each.

The global batch stays B: a rank's part of it (B/D rows for D data-parallel parts) is cut into K
equal micro-batches, each runs forward and backward with its loss divided by K, and the
gradients add up in ``.grad``. With equal micro-batches the mean of the K micro-batch means is
the batch mean, so the accumulated gradient is the full batch's (the oracle: K x B/K equals B).
Memory for activations drops to one micro-batch's.

Where gradients travel during backward (DDP's hooks), every micro-step but the last runs under
``no_sync()`` (FSDP2: ``set_requires_gradient_sync(False)``): one all-reduce per optimizer step,
not K. Strategies that reduce after backward
(``before_update``) do so once anyway. Pipelines do not come here: they multiply their
micro-batches per step by K instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch

from polytrain.errors import ConfigError


def check_accum(batch: int, parts: int, k: int, strategy: str) -> None:
    """Refuse a batch that does not cut into ``parts`` x ``k`` equal micro-batches."""
    if k > 1 and batch % (parts * k):
        unit = parts * k
        lower = max(unit, batch - batch % unit)
        raise ConfigError(
            f"Strategy '{strategy}' with --grad-accum {k} cuts each of its {parts} data-parallel "
            f"part(s) of the batch into {k} micro-batches, so --batch-size must be a multiple of "
            f"{unit} (got {batch}). Use --batch-size {lower} or {lower + unit}, or another "
            "--grad-accum.")


def micro_batches(x: torch.Tensor, y: torch.Tensor, k: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``k`` equal row slices of (x, y); rows must divide by ``k`` (checked before launch)."""
    if x.shape[0] % k:
        raise ConfigError(f"--grad-accum {k} does not divide this rank's {x.shape[0]} rows; "
                          f"use a --batch-size that is a multiple of {k} x the data-parallel ranks.")
    yield from zip(x.chunk(k), y.chunk(k), strict=True)


def _quiet(forward: Any, last: bool) -> AbstractContextManager[Any]:
    """DDP's ``no_sync`` (FSDP2's gradient sync off) on all but the last micro-step."""
    if last:
        return nullcontext()
    if hasattr(forward, "no_sync"):
        return forward.no_sync()  # type: ignore[no-any-return]
    if hasattr(forward, "set_requires_gradient_sync"):
        return _unsynced(forward)
    return nullcontext()


@contextmanager
def _unsynced(module: Any) -> Iterator[None]:
    """FSDP2: backward keeps unsharded gradients and reduce-scatters nothing."""
    module.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)


def accumulate(forward: Any, x: torch.Tensor, y: torch.Tensor, k: int,
               loss_of: Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor],
               backward: Callable[[torch.Tensor], None]) -> float:
    """Forward and backward of (x, y) as ``k`` micro-steps; returns the batch's mean loss.

    ``loss_of(forward, x, y)``: one micro-batch's loss; ``backward(loss)``: its backward (e.g.
    scaled for fp16). With ``k`` = 1 this is one ordinary forward and backward."""
    total = 0.0
    for j, (xm, ym) in enumerate(micro_batches(x, y, k)):
        with _quiet(forward, j == k - 1):
            loss = loss_of(forward, xm, ym)
            backward(loss / k if k > 1 else loss)
        total += float(loss.detach())
    return total / k
