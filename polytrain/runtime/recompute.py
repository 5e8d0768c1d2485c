"""``--activation-checkpointing``: keep each block's input, not its activations, and recompute
the block's forward during backward (Chen et al. 2016, "Training deep nets with sublinear memory
cost"; ``torch.utils.checkpoint``, non-reentrant).

The unit is a block: each transformer ``Block`` (gpt-mini, or any module kept in an
``nn.ModuleList``), else each top-level layer of an ``nn.Sequential`` that has parameters. Only
the instance's ``forward`` is replaced, so the module tree, the parameter names and the
state_dict stay as they were (checkpoints and exports do not see it). The recomputed forward is
the same computation on the same input, so the gradients equal those without it; the cost is one
more forward per block, the saving every block's inner activations.

Pipelines (gpipe, 1f1b) map the flag onto their own ``checkpoint=always`` (per stage).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from polytrain.models.gpt import Block


def _wrap(module: nn.Module) -> None:
    inner: Callable[..., Any] = module.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():  # evaluation: nothing to keep, nothing to recompute
            return inner(*args, **kwargs)
        return checkpoint(inner, *args, use_reentrant=False, **kwargs)

    module.forward = forward  # type: ignore[method-assign]


def blocks(model: nn.Module) -> list[nn.Module]:
    """The units checkpointed in ``model``: its transformer blocks, else its parameterised
    top-level layers (a Sequential's, or of the Sequential it wraps)."""
    found: list[nn.Module] = [m for m in model.modules() if isinstance(m, Block)]
    if not found:
        found = [m for lst in model.modules() if isinstance(lst, nn.ModuleList) for m in lst]
    if not found:
        root: nn.Module = model
        while isinstance(root, nn.Sequential) and len(root) == 1:
            root = root[0]
        found = [m for m in root.children() if any(True for _ in m.parameters())]
    return found


def apply(model: nn.Module, enabled: bool) -> int:
    """Checkpoint every block of ``model`` when ``enabled``; returns how many."""
    if not enabled:
        return 0
    units = blocks(model)
    for m in units:
        _wrap(m)
    return len(units)
