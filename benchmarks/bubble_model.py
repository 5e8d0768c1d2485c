"""A pipeline-friendly model for the bubble benchmark: two balanced halves joined by a narrow cut.

Each half is 64 -> 1024 -> 1024 -> 64 (the second ends 1024 -> 10): ~1.1 M multiply-adds per
sample per stage, while only 64 floats per sample cross the cut. The textbook bubble
(P-1)/(M+P-1) assumes free transfers; this model makes them nearly free, so what remains between
the measured and the textbook bubble is the runtime's own doing.
"""

from __future__ import annotations

from torch import nn


def make(spec: object) -> list[nn.Module]:
    def half(out: int) -> list[nn.Module]:
        return [nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, out)]

    return [nn.Flatten(), *half(64), nn.ReLU(), *half(10)]
