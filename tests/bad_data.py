"""Dataset factories that break a rule, for the bad-input table (tests/test_cli.py) and the
same-data check (tests/faults/test_bad_data.py)."""

from __future__ import annotations

import torch


def _x(n: int) -> torch.Tensor:
    return torch.zeros(n, 8)


def empty() -> tuple[torch.Tensor, torch.Tensor]:
    return _x(0), torch.zeros(0, dtype=torch.long)


def negative() -> tuple[torch.Tensor, torch.Tensor]:
    return _x(32), torch.arange(32) % 3 - 1


def mismatch() -> tuple[torch.Tensor, torch.Tensor]:
    return _x(32), torch.zeros(30, dtype=torch.long)


def floats() -> list[tuple[torch.Tensor, float]]:
    return [(torch.zeros(8), float(i % 2)) for i in range(32)]


def tiny() -> tuple[torch.Tensor, torch.Tensor]:
    return _x(3), torch.tensor([0, 1, 0])


def unseeded(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Ignores its seed: every process draws other samples."""
    del seed
    g = torch.Generator().manual_seed(int.from_bytes(__import__("os").urandom(4), "little"))
    return torch.randn(64, 8, generator=g), torch.randint(0, 2, (64,), generator=g)
