"""What a ``zero`` rank holds, counted from its tensors, and ZeRO's formula for it."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from polytrain.strategies.data.zero_shard import ShardedModel


def _storages(tensors: Iterator[torch.Tensor | None]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a view counts with its base, once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is not None and t.numel() > 0:
            st = t.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def held_bytes(sm: ShardedModel, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """What this rank holds, counted from its tensors: parameters, gradients, optimizer state per
    element (tensors shaped like a shard) and the optimizer's per-tensor scalars (e.g. Adam's step)."""
    params = _storages(iter([*(p for p in sm.model.parameters()), *sm.shards]))
    grads = _storages(iter([*(p.grad for p in sm.model.parameters()), *(s.grad for s in sm.shards)]))
    per_elem: list[torch.Tensor] = []
    scalars: list[torch.Tensor] = []
    for s in sm.shards:
        for v in optimizer.state.get(s, {}).values():
            if isinstance(v, torch.Tensor):
                (per_elem if v.shape == s.shape else scalars).append(v)
    return {"params": params, "grads": grads, "optimizer": _storages(iter(per_elem)),
            "optimizer_scalars": _storages(iter(scalars))}


def formula_bytes(stage: int, padded: int, world: int, k: int, elem: int = 4) -> dict[str, int]:
    """ZeRO's held bytes for Ψ' = ``padded`` elements of ``elem`` bytes, K = ``k`` bytes of
    optimizer state per element: (4+4+K/W)Ψ', (4+(4+K)/W)Ψ', (4+4+K)Ψ'/W for fp32."""
    shard = padded // world
    return {"params": elem * (padded if stage < 3 else shard),
            "grads": elem * (padded if stage == 1 else shard),
            "optimizer": k * shard}

