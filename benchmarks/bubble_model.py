"""A pipeline-friendly model for the bubble benchmark: ``stages`` balanced blocks joined by narrow cuts.

Each block is 64 -> 1024 -> 1024 -> 64 (the last ends 1024 -> 10): ~1.1 M multiply-adds per
sample per stage, while only 64 floats per sample cross a cut. Every block is six layers (a
Flatten or ReLU, then Linear, ReLU, Linear, ReLU, Linear), so ``partition=6,6,...`` puts one block
on each stage. The textbook bubble (P-1)/(M+P-1) assumes free transfers; this model makes them
nearly free, so what remains between the measured and the textbook bubble is the runtime's own
doing. ``--set model.stages=4`` for four blocks (default two).
"""

from __future__ import annotations

from torch import nn


def make(spec: object, stages: int = 2) -> list[nn.Module]:
    def block(first: nn.Module, out: int) -> list[nn.Module]:
        return [first, nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, out)]

    return [layer for s in range(stages)
            for layer in block(nn.Flatten() if s == 0 else nn.ReLU(), 10 if s == stages - 1 else 64)]
