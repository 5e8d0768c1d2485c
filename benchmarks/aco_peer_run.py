"""One run of a peer ACO library (scikit-opt's ACA_TSP or acopy) on a distance matrix; prints JSON.

Run by benchmarks/aco_peers.py in a separate virtual environment holding the peers (they are
not polytrain dependencies; scikit-opt also installs a top-level ``tests`` package that would
shadow polytrain's):

    python3 -m venv .venv-peers && .venv-peers/bin/pip install scikit-opt acopy   # once
    .venv-peers/bin/python benchmarks/aco_peer_run.py sko|acopy MATRIX.json ANTS iters|time VALUE SEED

scikit-opt 0.6.6's ACA_TSP uses ``numpy.int``, removed in NumPy 1.24; the alias is restored
(``numpy.int = int``) before it runs, changing nothing else.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


def run_sko(d: np.ndarray, ants: int, mode: str, value: float, seed: int) -> dict[str, Any]:
    np.int = int  # type: ignore[attr-defined]
    from sko.ACA import ACA_TSP

    np.random.seed(seed)
    n = len(d)

    def length(route: np.ndarray) -> float:
        return float(d[route, np.roll(route, -1)].sum())

    aca = ACA_TSP(func=length, n_dim=n, size_pop=ants, max_iter=1, distance_matrix=d)
    t0, its = time.perf_counter(), 0
    while (its < value) if mode == "iters" else (time.perf_counter() - t0 < value):
        aca.run(max_iter=1)
        its += 1
    return {"best": float(aca.best_y), "iterations": its, "wall_s": time.perf_counter() - t0}


def run_acopy(d: np.ndarray, ants: int, mode: str, value: float, seed: int) -> dict[str, Any]:
    import acopy
    import networkx as nx

    random.seed(seed)
    n = len(d)
    g = nx.Graph()
    for i in range(n):
        for j in range(i + 1, n):
            g.add_edge(i, j, weight=float(d[i, j]))
    solver = acopy.Solver(rho=0.03, q=1)
    count = {"its": 0}

    class Counter(acopy.plugins.SolverPlugin):  # type: ignore[misc]
        def on_iteration(self, state: Any) -> None:
            count["its"] += 1

    solver.add_plugin(Counter())
    if mode == "time":
        solver.add_plugin(acopy.plugins.TimeLimit(value))
    t0 = time.perf_counter()
    best = solver.solve(g, acopy.Colony(alpha=1, beta=3), gen_size=ants,
                        limit=int(value) if mode == "iters" else None)
    return {"best": float(best.cost), "iterations": count["its"], "wall_s": time.perf_counter() - t0}


def main(argv: list[str]) -> None:
    tool, path, ants, mode, value, seed = argv
    d = np.array(json.loads(Path(path).read_text()), dtype=float)
    fn = run_sko if tool == "sko" else run_acopy
    print(json.dumps(fn(d, int(ants), mode, float(value), int(seed))))


if __name__ == "__main__":
    main(sys.argv[1:])
