"""polytrain aco against the ACO libraries a Python user would pick: scikit-opt's ACA_TSP and acopy.

    python benchmarks/aco_peers.py [--part timing|quality|both] [--budget 20] [--repeats 5] [--iters 3]

1. ``timing`` (results/aco_peers): time per iteration at equal ants (A = N, Ant System rules, no
   local search): polytrain's vectorised colony (construct + update, in this process, one torch
   thread) vs each peer, the three alternating, ``--iters`` iterations per repeat.
2. ``quality`` (results/aco_peers_quality): tour length after the same wall-clock budget, repeat r
   with seed r, the three tools alternating: polytrain's default (MMAS + 2-opt, 25 ants; it stops
   early at the optimum) vs each peer with A = N ants; median (min–max) over the repeats.

The peers run in ``.venv-peers`` (see benchmarks/aco_peer_run.py) on the distance matrix polytrain
parsed, so all three solve the same numbers.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from harness import add_common_flags, alternating, fmt_spread, hold_lock, spread, write_results

from polytrain.aco.colony import Colony, Draws, Params
from polytrain.aco.config import ACOConfig
from polytrain.aco.launch import run_aco
from polytrain.aco.tsp import Instance, load_instance

HERE = Path(__file__).resolve().parent
PEER_PY = HERE.parent / ".venv-peers" / "bin" / "python"


def peer(tool: str, matrix: Path, ants: int, mode: str, value: float, seed: int = 0) -> dict:
    out = subprocess.run(
        [
            str(PEER_PY),
            str(HERE / "aco_peer_run.py"),
            tool,
            str(matrix),
            str(ants),
            mode,
            str(value),
            str(seed),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def polytrain_iters(inst: Instance, iters: int) -> float:
    col = Colony(inst, Params(variant="as", ants=inst.n, rho=0.5))
    gen = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    for _ in range(iters):
        tours = col.construct(Draws.draw(gen, inst.n, inst.n))
        col.update(tours, col.lengths(tours))
    return (time.perf_counter() - t0) / iters


def timing(args: argparse.Namespace, tmp: str) -> None:
    rows = []
    for name in args.instances.split(","):
        inst = load_instance(str(args.data_dir / f"{name}.tsp"))
        matrix = _matrix(inst, tmp, name)
        per: dict[str, list[float]] = {"polytrain": [], "sko": [], "acopy": []}
        for _, tool in alternating(list(per), args.repeats):
            if tool == "polytrain":
                per[tool].append(polytrain_iters(inst, args.iters))
            else:
                r = peer(tool, matrix, inst.n, "iters", args.iters)
                per[tool].append(r["wall_s"] / r["iterations"])
        for tool, vals in per.items():
            s = spread(vals)
            rows.append(
                {
                    "instance": name,
                    "tool": tool,
                    "ants": inst.n,
                    "s_per_iteration": s["median"],
                    "min": s["min"],
                    "max": s["max"],
                    "vs_polytrain": s["median"] / spread(per["polytrain"])["median"],
                    "repeats": vals,
                }
            )
            print(rows[-1], flush=True)
    write_results(
        "aco_peers",
        rows,
        ["instance", "tool", "ants", "s_per_iteration", "min", "max", "vs_polytrain"],
        notes=f"s_per_iteration: median (min, max) over {args.repeats} alternating repeats of "
        f"{args.iters} iterations, A = N ants, Ant System rules, no local search.",
        extra={"python": sys.version.split()[0]},
    )


def quality(args: argparse.Namespace, tmp: str) -> None:
    rows = []
    for name in args.instances.split(","):
        inst = load_instance(str(args.data_dir / f"{name}.tsp"))
        matrix = _matrix(inst, tmp, name)
        best: dict[str, list[float]] = {"polytrain": [], "sko": [], "acopy": []}
        for r, tool in alternating(list(best), args.repeats):
            if tool == "polytrain":
                cfg = ACOConfig.from_dict(
                    {
                        "tsp": str(args.data_dir / f"{name}.tsp"),
                        "time_limit": args.budget,
                        "target_gap": 0.0,
                        "seed": r,
                        "out": f"{tmp}/{name}-pt{r}",
                    }
                )
                best[tool].append(float(run_aco(cfg, progress=False, plots=False)["best_length"]))
            else:
                best[tool].append(peer(tool, matrix, inst.n, "time", args.budget, r)["best"])
            print(name, tool, r, best[tool][-1], flush=True)
        for tool, vals in best.items():
            rows.append(
                {
                    "instance": name,
                    "tool": tool,
                    "ants": 25 if tool == "polytrain" else inst.n,
                    "best_after_budget": fmt_spread(vals, 0),
                    "optimal_runs": f"{sum(v <= inst.optimum for v in vals)}/{len(vals)}",
                    "optimum": inst.optimum,
                    "repeats": vals,
                }
            )
    write_results(
        "aco_peers_quality",
        rows,
        ["instance", "tool", "ants", "best_after_budget", "optimal_runs", "optimum"],
        notes=f"Best tour length after {args.budget:g} s of wall clock, median (min–max) over "
        f"{args.repeats} runs (seed = repeat), the tools alternating. polytrain: MMAS + "
        "2-opt, 25 ants, stops at the optimum; peers: A = N ants, their default rules.",
        extra={"python": sys.version.split()[0]},
    )


def _matrix(inst: Instance, tmp: str, name: str) -> Path:
    matrix = Path(tmp) / f"{name}.json"
    matrix.write_text(json.dumps(inst.dist.tolist()))
    return matrix


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", choices=("timing", "quality", "both"), default="both")
    ap.add_argument("--budget", type=float, default=20.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--instances", default="berlin52,eil51,kroA100")
    add_common_flags(ap, data=True)
    args = ap.parse_args()
    hold_lock(args.lock)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        if args.part in ("timing", "both"):
            timing(args, tmp)
        if args.part in ("quality", "both"):
            quality(args, tmp)


if __name__ == "__main__":
    main()
