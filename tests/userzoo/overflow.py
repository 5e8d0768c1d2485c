"""A model whose gradient overflows once: the fp16 loss scaler's test (an injected inf)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class _InfOnce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, poison: bool) -> torch.Tensor:  # type: ignore[override]
        ctx.poison = poison
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return (grad * float("inf") if ctx.poison else grad), None


class InfGradAt(nn.Module):
    """Identity forward; the backward of its ``at``-th training call returns an inf gradient."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.calls = at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or not torch.is_grad_enabled():
            return x
        self.calls += 1
        return _InfOnce.apply(x, self.calls == self.at)


def make(num_classes: int = 10, width: int = 32, inf_at: int = 3) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, width), InfGradAt(inf_at), nn.ReLU(),
                         nn.Linear(width, num_classes))


class _InfFirst(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, b: torch.Tensor, poison: bool) -> torch.Tensor:  # type: ignore[override]
        ctx.poison = poison
        return b.view_as(b)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        if ctx.poison:
            grad = grad.clone()
            grad[0] = float("inf")
        return grad, None


class InfBiasAt(nn.Module):
    """Adds a bias whose gradient's first element is inf on the ``at``-th training call: sharded
    over ranks, only the rank that holds element 0 sees the overflow."""

    def __init__(self, n: int, at: int) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(n))
        self.at, self.calls = at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or not torch.is_grad_enabled():
            return x + self.bias
        self.calls += 1
        return x + _InfFirst.apply(self.bias, self.calls == self.at)


def make_one_element(num_classes: int = 10, width: int = 32, inf_at: int = 3) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, width), nn.ReLU(), nn.Linear(width, num_classes),
                         InfBiasAt(num_classes, inf_at))
