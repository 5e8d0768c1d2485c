"""What a stage measures while it runs a schedule: its compute window and its activation memory.

`Window`: a segment's compute on one stage (see its docstring). `MemoryMeter`: a saved-tensor
hook counts the storages autograd keeps for each micro-batch's backward (parameters and weight
versions excluded), plus the stashed input and output, per (stage, micro-batch) — a rank with
virtual stages shares one meter among its chunks, so its peak is the rank's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Window:
    """The compute of one segment on one stage: first start, last end, busy seconds, the seconds
    spent waiting for messages after the first compute began, and each action's compute seconds
    in the order run (``[op, mb, seconds]``; an optimizer step after a backward counts in that
    backward), from which `metrics` replays the schedule without the runtime."""

    start: float = float("inf")
    end: float = float("-inf")
    busy: float = 0.0
    wait: float = 0.0
    ops: list[list[Any]] = field(default_factory=list)

    def to_json(self) -> list[float]:
        return [self.start, self.end, self.busy, self.wait] if self.end >= self.start else []


class MemoryMeter:
    """Activation bytes held per in-flight micro-batch, and the peak with stashed weights."""

    def __init__(self) -> None:
        self.live: dict[tuple[int, int], int] = {}  # (stage, micro-batch) -> bytes held
        self.peak_activation = 0
        self.peak_total = 0
        self.peak_in_flight = 0

    @contextmanager
    def track(self, exclude: set[int]) -> Iterator[dict[int, int]]:
        """Count storages autograd saves inside the block (storage pointer -> bytes)."""
        saved: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            storage = t.untyped_storage()
            if storage.data_ptr() not in exclude:
                saved[storage.data_ptr()] = storage.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield saved

    def hold(self, mb: tuple[int, int], saved: dict[int, int], *tensors: torch.Tensor) -> None:
        for t in tensors:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        self.live[mb] = sum(saved.values())
        self.peak_in_flight = max(self.peak_in_flight, len(self.live))

    def release(self, mb: tuple[int, int]) -> None:
        self.live.pop(mb, None)

    def note(self, stash_bytes: int) -> None:
        act = sum(self.live.values())
        self.peak_activation = max(self.peak_activation, act)
        self.peak_total = max(self.peak_total, act + stash_bytes)
