"""Seeded global batches: step s of every strategy sees the same B samples.

The sample stream is the concatenation of one permutation per epoch (permutation e seeded by
(seed, e)); step s (1-based) takes stream positions [(s−1)·B, s·B). A strategy with D
data-parallel parts gives part p the slice [p·B/D, (p+1)·B/D) of that global batch, so the union
over parts is exactly the single-process batch — the basis of every equality oracle.
"""

from __future__ import annotations

import torch

from polytrain.errors import ConfigError


class GlobalBatches:
    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int, seed: int) -> None:
        self.x, self.y = x, y
        self.n = x.shape[0]
        self.batch_size = batch_size
        self.seed = seed
        self._perms: dict[int, torch.Tensor] = {}

    def _perm(self, epoch: int) -> torch.Tensor:
        if epoch not in self._perms:
            if len(self._perms) > 4:
                self._perms.pop(min(self._perms))
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perms[epoch] = torch.randperm(self.n, generator=g)
        return self._perms[epoch]

    def indices(self, step: int) -> torch.Tensor:
        """Sample indices of global batch ``step`` (1-based), shape (B,)."""
        start = (step - 1) * self.batch_size
        epoch, offset = divmod(start, self.n)
        if offset + self.batch_size <= self.n:  # within one epoch: a view, no copy
            return self._perm(epoch)[offset : offset + self.batch_size]
        out = []
        pos = start
        while pos < start + self.batch_size:
            epoch, offset = divmod(pos, self.n)
            take = min(self.n - offset, start + self.batch_size - pos)
            out.append(self._perm(epoch)[offset : offset + take])
            pos += take
        return torch.cat(out)

    def shard(self, step: int, part: int = 0, parts: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """Part ``part`` of ``parts`` of global batch ``step``: x (B/parts, ...), y (B/parts, ...)."""
        if self.batch_size % parts:
            raise ConfigError(
                f"The global batch ({self.batch_size}) must split evenly over {parts} data-parallel "
                f"parts; choose --batch-size as a multiple of {parts} "
                f"(e.g. {parts * max(1, round(self.batch_size / parts))})."
            )
        b = self.batch_size // parts
        idx = self.indices(step)[part * b : (part + 1) * b]
        return self.x[idx], self.y[idx]
