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
    element (tensors shaped like a shard) and the optimizer's per-tensor scalars (e.g. Adam's step);
    under mixed precision the fp32 master shards apart (``master``)."""
    model_params = list(sm.model.parameters())
    params = _storages(iter(model_params if sm.mixed else [*model_params, *sm.shards]))
    grads = _storages(iter([*(p.grad for p in sm.model.parameters()), *(s.grad for s in sm.shards)]))
    per_elem: list[torch.Tensor] = []
    scalars: list[torch.Tensor] = []
    for s in sm.shards:
        for v in optimizer.state.get(s, {}).values():
            if isinstance(v, torch.Tensor):
                (per_elem if v.shape == s.shape else scalars).append(v)
    out = {"params": params, "grads": grads, "optimizer": _storages(iter(per_elem)),
           "optimizer_scalars": _storages(iter(scalars))}
    if sm.mixed:
        out["master"] = _storages(iter(sm.shards))
    return out


def formula_bytes(stage: int, padded: int, world: int, k: int, elem: int = 4,
                  mixed: bool = False) -> dict[str, int]:
    """The held bytes for Ψ' = ``padded`` elements, K = ``k`` bytes of optimizer state per element.

    fp32 (ZeRO's): (4+4+K/W)Ψ', (4+(4+K)/W)Ψ', (4+4+K)Ψ'/W. Mixed precision (``elem`` = e bytes
    per low-precision element): the units eΨ' at stages 1–2 (stage 3 keeps none between steps),
    fp32 master shards 4Ψ'/W, gradients eΨ' at stage 1 plus the fp32 shard 4Ψ'/W the optimizer
    reads, optimizer state KΨ'/W — at stage 3 (4+4+K)Ψ'/W, ZeRO's (2+2+K')Ψ'/W with K' = 4+K."""
    shard = padded // world
    if not mixed:
        return {"params": elem * (padded if stage < 3 else shard),
                "grads": elem * (padded if stage == 1 else shard),
                "optimizer": k * shard}
    return {"params": elem * padded if stage < 3 else 0, "master": 4 * shard,
            "grads": (elem * padded if stage == 1 else 0) + 4 * shard, "optimizer": k * shard}

