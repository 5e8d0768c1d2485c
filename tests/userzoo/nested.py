"""Checkpointed blocks that hold several of zero-3's layers: each stage is a block of
``--activation-checkpointing`` (a ModuleList member) and a trunk zero-3 opens into its Linears."""

from __future__ import annotations

import torch
from torch import nn


class Stage(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(width, width), nn.Linear(width, width)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


class Net(nn.Module):
    def __init__(self, num_classes: int, width: int) -> None:
        super().__init__()
        self.inp = nn.Linear(64, width)
        self.stages = nn.ModuleList([Stage(width), Stage(width)])
        self.out = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x.flatten(1))
        for stage in self.stages:
            x = stage(x)
        return self.out(x)


def make(num_classes: int = 10, width: int = 16) -> nn.Module:
    return Net(num_classes, width)
