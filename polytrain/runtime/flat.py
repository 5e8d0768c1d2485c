"""A model's parameters as one flat vector (N,), and back: what parameter servers, the RL
learner and its actors send over the wire."""

from __future__ import annotations

import torch
from torch import nn


def flat_params(model: nn.Module) -> torch.Tensor:
    """The model's flat parameter vector (N,), a copy."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def flat_grads(model: nn.Module) -> torch.Tensor:
    """The model's flat gradient vector (N,); missing gradients count as zeros."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                      for p in model.parameters()])


@torch.no_grad()
def load_flat(model: nn.Module, flat: torch.Tensor) -> None:
    """Copy a flat vector (N,) into the model's parameters."""
    pos = 0
    for p in model.parameters():
        p.copy_(flat[pos : pos + p.numel()].view_as(p))
        pos += p.numel()
