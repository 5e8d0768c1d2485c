"""Sum-tree and min-tree over a fixed number of leaves (numpy, float64, vectorised).

A complete binary tree stored in one array: node 1 is the root, node ``i`` has children ``2i``
and ``2i+1``, and leaf ``j`` lives at ``size + j`` (``size`` = capacity rounded up to a power of
two, so every leaf sits at the same depth and a batch descends in ``log2(size)`` numpy steps)::

    tree index:          1                 sum(p0..p3)
                    2         3            p0+p1    p2+p3
                  4   5     6   7          p0 p1    p2 p3    (leaves: size=4)

Updates recompute each touched parent as ``left + right`` instead of adding a delta, so an
internal node is always *exactly* the float sum of its two children: no rounding drift
accumulates over millions of updates (tests/test_rl_replay.py checks this).
"""

from __future__ import annotations

import numpy as np


def _pow2(n: int) -> int:
    size = 1
    while size < n:
        size *= 2
    return size


class SegmentTree:
    """Shared layout; ``combine`` is ``np.add`` (sum-tree) or ``np.minimum`` (min-tree)."""

    def __init__(self, capacity: int, combine: np.ufunc, neutral: float) -> None:
        if capacity < 1:
            raise ValueError(f"a tree needs at least one leaf (got capacity {capacity})")
        self.capacity = capacity
        self.size = _pow2(capacity)
        self.combine = combine
        self.neutral = neutral
        self.tree = np.full(2 * self.size, neutral, dtype=np.float64)
        self.depth = self.size.bit_length() - 1  # levels above the leaves

    def update(self, leaves: np.ndarray, values: np.ndarray) -> None:
        """Set ``leaves`` (int array) to ``values``; a repeated leaf keeps its last value."""
        leaves = np.asarray(leaves, dtype=np.int64)
        if leaves.size == 0:
            return
        if leaves.min() < 0 or leaves.max() >= self.capacity:
            raise IndexError(f"leaf index out of range [0, {self.capacity})")
        nodes = leaves + self.size
        self.tree[nodes] = np.asarray(values, dtype=np.float64)
        # Climb one level at a time; a parent listed twice is recomputed twice from the same
        # (final) children, which is harmless and cheaper than de-duplicating every level.
        for _ in range(self.depth):
            nodes //= 2
            self.tree[nodes] = self.combine(self.tree[2 * nodes], self.tree[2 * nodes + 1])

    def leaf(self, leaves: np.ndarray) -> np.ndarray:
        return self.tree[np.asarray(leaves, dtype=np.int64) + self.size]

    @property
    def root(self) -> float:
        return float(self.tree[1])


class SumTree(SegmentTree):
    def __init__(self, capacity: int) -> None:
        super().__init__(capacity, np.add, 0.0)

    def find(self, mass: np.ndarray) -> np.ndarray:
        """For each prefix mass ``u`` in [0, total), the leaf whose cumulative range holds it."""
        u = np.array(mass, dtype=np.float64)
        nodes = np.ones(u.shape, dtype=np.int64)
        for _ in range(self.depth):  # every leaf is at the same depth
            left = self.tree[2 * nodes]
            right = u >= left
            u = np.where(right, u - left, u)
            nodes = 2 * nodes + right
        return nodes - self.size

    def sample(self, n: int, rng: np.random.Generator, batches: int = 1) -> np.ndarray:
        """``n`` leaves drawn in proportion to their values, one from each of ``n`` equal strata;
        with ``batches`` = K, K such draws (K·n leaves, batch after batch) in one descent.

        Stratifying (as the prioritized-replay paper does) keeps every draw's probability equal to
        value/total while spreading a batch over the whole range. K batches in one descent cost
        the numpy calls of one (the replay server answers a request with K batches).
        """
        total = self.root
        if not total > 0:
            raise ValueError("cannot sample from an empty sum-tree (total priority is 0)")
        edges = np.tile(np.arange(n, dtype=np.float64) * (total / n), batches)
        mass = edges + rng.random(n * batches) * (total / n)
        # Rounding can push a draw onto an empty (zero) leaf at the right edge: redraw it from
        # the leaves that carry mass, which changes nothing when there is no such accident.
        leaves = self.find(np.minimum(mass, np.nextafter(total, 0.0)))
        bad = (leaves >= self.capacity) | (self.leaf(np.minimum(leaves, self.capacity - 1)) <= 0)
        if bad.any():
            valid = np.flatnonzero(self.tree[self.size : self.size + self.capacity] > 0)
            leaves[bad] = rng.choice(valid, size=int(bad.sum()))
        return leaves


class MinTree(SegmentTree):
    def __init__(self, capacity: int) -> None:
        super().__init__(capacity, np.minimum, float("inf"))
