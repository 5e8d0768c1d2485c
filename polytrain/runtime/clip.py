"""``--clip-grad-norm X``: clip by the global norm of the whole model's gradient, wherever the
gradient is split.

``torch.nn.utils.clip_grad_norm_`` on one process computes ``n = ||g||_2`` over every parameter's
gradient and multiplies each by ``min(1, X / (n + 1e-6))``. Split over ranks (pipeline stages,
tensor shards, replicas), each rank holds a part of ``g``, and some parts are held by several
ranks (a replicated LayerNorm in tensor parallelism, a stage's replicas after their all-reduce,
a tied embedding on two stages). Each rank sums the squares of its gradients in fp32, each
weighted by ``1 / copies`` (how many ranks hold that same gradient), so that one all-reduce (sum)
of that one number over the ranks gives exactly ``||g||^2``; every rank then scales its own
gradients by the same factor. Where every rank holds the whole, identical gradient (data
parallelism after its all-reduce) there is nothing to communicate. A sharded gradient (ZeRO's flat
shards, FSDP2's DTensor gradients: each element on exactly one rank) is read through its local
part, each counted once.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from polytrain.comm import Comm

EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s


@dataclass
class GradSplit:
    """How this rank's gradients make up the model's.

    ``comm``: the ranks that together hold the whole gradient (None: this rank holds it all);
    ``copies``: for a parameter held by several of those ranks (by ``id``), how many hold it.
    """

    comm: Comm | None = None
    copies: dict[int, int] = field(default_factory=dict)

    def share(self, p: torch.Tensor) -> float:
        return 1.0 / self.copies.get(id(p), 1)


def local(grad: torch.Tensor) -> torch.Tensor:
    """This rank's part of a gradient: a DTensor's local shard (a view), else the tensor."""
    to_local = getattr(grad, "to_local", None)
    return to_local() if to_local is not None else grad  # type: ignore[no-any-return]


def squared_norm(params: Iterable[torch.Tensor], split: GradSplit) -> torch.Tensor:
    """This rank's share of ``||g||^2`` in fp32: one element on the gradients' device."""
    total: torch.Tensor | None = None
    for p in params:
        if p.grad is None:
            continue
        part = local(p.grad).detach().float().pow(2).sum() * split.share(p)
        total = part if total is None else total + part
    return total if total is not None else torch.zeros(())


def clip_grad_norm(params: Iterable[torch.Tensor], max_norm: float,
                   split: GradSplit | None = None) -> float:
    """Scale the gradients of ``params`` so the global norm is at most ``max_norm``; returns the
    global norm before clipping (as torch's function does). Collective over ``split.comm``."""
    split = split or GradSplit()
    params = [p for p in params if p.grad is not None]
    sq = squared_norm(params, split).reshape(1)
    if split.comm is not None and split.comm.world > 1:
        split.comm.all_reduce(sq, op="clip_norm")
    norm = sq.sqrt()
    coef = torch.clamp(max_norm / (norm + EPS), max=1.0)
    for p in params:
        assert p.grad is not None
        g = local(p.grad).detach()
        g.mul_(coef.to(g.device, g.dtype))
    return float(norm)


def clip_flat(flat: torch.Tensor, max_norm: float) -> float:
    """Scale one flat gradient vector (N,) in place to L2 norm at most ``max_norm``, as
    ``torch.nn.utils.clip_grad_norm_`` scales a model's; returns its norm before clipping. What
    a parameter-server worker pushes is its whole gradient as one such vector."""
    norm = flat.detach().float().norm()
    flat.mul_(torch.clamp(max_norm / (norm + EPS), max=1.0).to(flat.dtype))
    return float(norm)


def sharded_split(comm: Comm, model: nn.Module, sharded: Collection[str], tp: int,
                  replicas: int = 1) -> GradSplit:
    """Tensor parallelism over ``tp`` ranks (times ``replicas`` data-parallel copies, all in
    ``comm``): a parameter named in ``sharded`` is one rank's slice, any other is the same on
    every rank of its tensor group."""
    copies = {id(p): replicas * (1 if n in sharded else tp) for n, p in model.named_parameters()}
    return GradSplit(comm, copies)


def unique(params: Iterable[nn.Parameter]) -> list[nn.Parameter]:
    """``params`` without repeats (a module that holds one parameter under two names)."""
    seen: set[int] = set()
    out = []
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out
