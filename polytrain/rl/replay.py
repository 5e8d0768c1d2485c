"""Prioritized experience replay (Schaul et al. 2016), proportional variant, FIFO eviction.

A transition ``j`` with TD error ``δ_j`` is stored with priority ``p_j = (|δ_j| + ε)^α``; it is
drawn with probability ``P(j) = p_j / Σ_k p_k`` and its loss weighted by the importance-sampling
weight ``w_j = (N·P(j))^−β / max_k (N·P(k))^−β = (p_j / p_min)^−β`` (N = stored transitions),
which corrects the bias of non-uniform sampling fully when β reaches 1. ``α = 0`` is uniform
replay (every weight 1).

Rows are plain float32 vectors (see :class:`polytrain.rl.core.TransitionRow`); the buffer does not know
what they mean. Every stored row gets a fresh id: a priority update that arrives after its slot
was overwritten (FIFO, at capacity) is dropped instead of landing on the newer transition.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polytrain.rl.sumtree import MinTree, SumTree

PRIORITY_EPS = 1e-3  # keeps a transition with zero TD error drawable


def beta_at(update: int, beta0: float, beta_steps: int) -> float:
    """β annealed linearly from ``beta0`` to 1 over ``beta_steps`` learner updates."""
    if beta_steps <= 0:
        return 1.0
    return beta0 + (1.0 - beta0) * min(1.0, update / beta_steps)


@dataclass
class Batch:
    """A sampled batch: ids (B,) int64, rows (B, width) float32, weights (B,) float32."""

    ids: np.ndarray
    rows: np.ndarray
    weights: np.ndarray


class PrioritizedReplay:
    def __init__(self, capacity: int, width: int, alpha: float, seed: int = 0) -> None:
        self.capacity = capacity
        self.width = width
        self.alpha = alpha
        self.rows = np.zeros((capacity, width), dtype=np.float32)
        self.ids = np.full(capacity, -1, dtype=np.int64)
        self.sums = SumTree(capacity)
        self.mins = MinTree(capacity)
        self.next_id = 0  # ids ever added; slot of id k is k % capacity
        self.max_priority = 1.0  # for add() without priorities (new data is drawn at least once)
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return min(self.next_id, self.capacity)

    def _priority(self, td_abs: np.ndarray) -> np.ndarray:
        return (np.abs(np.asarray(td_abs, dtype=np.float64)) + PRIORITY_EPS) ** self.alpha

    def add(self, rows: np.ndarray, td_abs: np.ndarray | None = None) -> np.ndarray:
        """Store rows (n, width), evicting the oldest at capacity; returns their ids."""
        rows = np.asarray(rows, dtype=np.float32).reshape(-1, self.width)
        skip = max(0, len(rows) - self.capacity)  # as if added one by one: the first ones evicted
        rows = rows[skip:]
        n = len(rows)
        ids = np.arange(self.next_id + skip, self.next_id + skip + n, dtype=np.int64)
        slots = ids % self.capacity
        if td_abs is None:
            prio = np.full(n, self.max_priority)
        else:
            prio = self._priority(np.asarray(td_abs)[skip:])
            self.max_priority = max(self.max_priority, float(prio.max(initial=0.0)))
        self.rows[slots] = rows
        self.ids[slots] = ids
        self.sums.update(slots, prio)
        self.mins.update(slots, prio)
        self.next_id += skip + n
        return ids

    def sample(self, batch: int, beta: float, batches: int = 1) -> Batch:
        """``batch`` rows drawn by priority, with their normalised importance weights; with
        ``batches`` = K, K independent such batches one after the other (K·batch rows)."""
        if len(self) == 0:
            raise ValueError("cannot sample from an empty replay")
        slots = self.sums.sample(batch, self.rng, batches)
        weights = self.weights(slots, beta).astype(np.float32)
        return Batch(self.ids[slots].copy(), self.rows[slots].copy(), weights)

    def weights(self, slots: np.ndarray, beta: float) -> np.ndarray:
        """``(p_j / p_min)^−β``: the PER weights divided by the largest weight in the buffer."""
        p = self.sums.leaf(slots)
        return (p / self.mins.root) ** (-beta)

    def probabilities(self, slots: np.ndarray) -> np.ndarray:
        return self.sums.leaf(slots) / self.sums.root

    def update(self, ids: np.ndarray, td_abs: np.ndarray) -> int:
        """New priorities from fresh TD errors; returns how many were still stored."""
        ids = np.asarray(ids, dtype=np.int64)
        slots = ids % self.capacity
        live = self.ids[slots] == ids
        if not live.any():
            return 0
        prio = self._priority(np.asarray(td_abs)[live])
        self.max_priority = max(self.max_priority, float(prio.max()))
        self.sums.update(slots[live], prio)
        self.mins.update(slots[live], prio)
        return int(live.sum())
