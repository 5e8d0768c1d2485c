"""Prioritized replay oracles: sum-tree sampling frequencies, exact sums, IS weights, FIFO."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy import stats

from polytrain.rl.replay import PRIORITY_EPS, PrioritizedReplay, beta_at
from polytrain.rl.sumtree import MinTree, SumTree


def _internal_nodes_are_exact(tree: SumTree | MinTree) -> None:
    for node in range(1, tree.size):
        both = tree.combine(tree.tree[2 * node], tree.tree[2 * node + 1])
        assert tree.tree[node] == both, f"node {node} is not exactly combine(children)"


@pytest.mark.slow  # long (seconds of training/sampling), not multi-process
def test_sampling_frequencies_match_priorities() -> None:
    """Chi-square goodness of fit (fixed seed): P(leaf) = p / Σp, empty leaves never drawn."""
    priorities = np.array([1.0, 2.0, 3.0, 4.0, 0.0, 10.0, 0.5])  # capacity 7 -> 8 leaves
    tree = SumTree(len(priorities))
    tree.update(np.arange(len(priorities)), priorities)
    rng = np.random.default_rng(1234)
    draws = np.concatenate([tree.sample(1, rng) for _ in range(20_000)]  # independent draws
                           + [tree.sample(100, rng) for _ in range(200)]  # stratified batches
                           + [tree.sample(50, rng, batches=8) for _ in range(50)])  # 8 per descent
    counts = np.bincount(draws, minlength=tree.size)
    assert counts[4] == 0 and counts[7:].sum() == 0  # zero priority / no such leaf
    keep = priorities > 0
    expected = priorities[keep] / priorities.sum() * len(draws)
    _, p = stats.chisquare(counts[: len(priorities)][keep], expected)
    assert p > 1e-3, f"frequencies {counts} do not match priorities (p={p:.2g})"


def test_k_batches_in_one_descent_are_each_stratified() -> None:
    """sample(n, batches=K): K batches one after the other, each with one draw per stratum."""
    tree = SumTree(100)
    tree.update(np.arange(100), np.ones(100))  # uniform: stratum j of n=10 holds leaves 10j..10j+9
    leaves = tree.sample(10, np.random.default_rng(0), batches=4)
    assert leaves.shape == (40,)
    for batch in leaves.reshape(4, 10):
        assert (batch // 10).tolist() == list(range(10))


def test_updates_keep_sums_exact() -> None:
    rng = np.random.default_rng(0)
    sums, mins = SumTree(1000), MinTree(1000)
    values = np.zeros(1000)
    for _ in range(300):
        leaves = rng.integers(0, 1000, size=64)  # with repeats, as a batch can have
        new = rng.random(64) * 10 ** rng.uniform(-3, 3)
        sums.update(leaves, new)
        mins.update(leaves, new)
        values[leaves] = new  # the last write of a repeated leaf wins, as in the tree
    _internal_nodes_are_exact(sums)
    _internal_nodes_are_exact(mins)
    assert np.array_equal(sums.leaf(np.arange(1000)), values)
    assert math.isclose(sums.root, math.fsum(values), rel_tol=1e-12)
    touched = values[values > 0]
    assert mins.root == touched.min()


def test_importance_weights_follow_the_formula() -> None:
    alpha, beta = 0.6, 0.4
    td = np.array([0.5, 2.0, 0.0, 1.0, 7.0])
    replay = PrioritizedReplay(capacity=8, width=3, alpha=alpha, seed=0)
    replay.add(np.arange(15, dtype=np.float32).reshape(5, 3), td)
    p = (np.abs(td) + PRIORITY_EPS) ** alpha
    prob = p / p.sum()
    n = len(td)
    w = (n * prob) ** -beta
    expected = w / w.max()  # normalised by the largest weight in the buffer (the PER paper)
    slots = np.arange(n)
    np.testing.assert_allclose(replay.probabilities(slots), prob, rtol=1e-12)
    np.testing.assert_allclose(replay.weights(slots, beta), expected, rtol=1e-12)
    batch = replay.sample(64, beta)
    np.testing.assert_allclose(batch.weights, expected[batch.ids], rtol=1e-6)
    np.testing.assert_array_equal(batch.rows, np.arange(15, dtype=np.float32).reshape(5, 3)[batch.ids])


def test_uniform_when_alpha_is_zero() -> None:
    replay = PrioritizedReplay(capacity=4, width=1, alpha=0.0)
    replay.add(np.zeros((4, 1)), np.array([0.0, 1.0, 5.0, 100.0]))
    np.testing.assert_allclose(replay.probabilities(np.arange(4)), 0.25)
    np.testing.assert_allclose(replay.weights(np.arange(4), 1.0), 1.0)


def test_fifo_eviction_and_stale_priority_updates() -> None:
    replay = PrioritizedReplay(capacity=4, width=1, alpha=1.0)
    ids = replay.add(np.arange(6, dtype=np.float32).reshape(6, 1), np.ones(6))
    assert list(ids) == [2, 3, 4, 5]  # more rows than capacity: the oldest never land
    more = replay.add(np.array([[6.0], [7.0]]), np.ones(2))
    assert len(replay) == 4 and list(more) == [6, 7]
    assert sorted(replay.rows[:, 0].tolist()) == [4.0, 5.0, 6.0, 7.0]  # 2 and 3 evicted first
    # ids 2, 3 were overwritten by 6, 7: their late priorities must not land on the new rows
    assert replay.update(np.array([2, 3, 4]), np.array([50.0, 50.0, 9.0])) == 1
    assert replay.sums.leaf(np.array([2, 3])).tolist() == [1.0 + PRIORITY_EPS] * 2
    assert replay.sums.leaf(np.array([0]))[0] == pytest.approx(9.0 + PRIORITY_EPS)


def test_beta_anneals_linearly_to_one() -> None:
    assert beta_at(0, 0.4, 1000) == 0.4
    assert beta_at(500, 0.4, 1000) == pytest.approx(0.7)
    assert beta_at(1000, 0.4, 1000) == 1.0
    assert beta_at(5000, 0.4, 1000) == 1.0


@pytest.mark.parametrize("initial", ["actor", "max"])
def test_replay_server_stores_an_add_at_the_actors_or_the_max_priority(initial: str, tmp_path: Any) -> None:
    """ADD = rows | |TD| (actor priorities, Ape-X) or rows alone (max priority, PER) | episodes."""
    import torch

    from polytrain.metrics.recorder import Recorder
    from polytrain.rl.config import make_rl_config
    from polytrain.rl.protocol import Kind, Msg
    from polytrain.rl.replay_server import ReplayServer
    from polytrain.rl.roles import RoleContext, layout_ranks

    cfg = make_rl_config({"algo": "apex", "actors": 2, "initial_priority": initial, "alpha": 1.0})
    server = ReplayServer(RoleContext(cfg, 1, layout_ranks(cfg), Recorder(1), tmp_path))
    rows = np.arange(3 * 11, dtype=np.float32)  # 3 CartPole rows of width 11
    td = np.array([0.5, 2.0, 4.0], dtype=np.float32)
    episodes = np.array([21.0, 21.0], dtype=np.float32)  # one finished episode (return, length)
    floats = np.concatenate([rows, td, episodes] if initial == "actor" else [rows, episodes])
    server.add(2, Msg(Kind.ADD, [3, 3, 1, 0, 0], floats=torch.from_numpy(floats)))
    stored = server.replay.sums.leaf(np.arange(3))
    expected = td + PRIORITY_EPS if initial == "actor" else np.ones(3)  # max priority: 1 at first
    np.testing.assert_allclose(stored, expected, rtol=1e-6)
    assert np.array_equal(server.replay.rows[:3].reshape(-1), rows)
    assert server.episodes == 1 and server.window.mean == 21.0
