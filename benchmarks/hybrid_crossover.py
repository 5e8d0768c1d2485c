"""The MP–DP crossover (Pal et al. 2019; 000 §V), measured: throughput of pure data parallelism
(`allreduce`) and of hybrid `mesh` dp×pp (pp=2, dp=W/2) on the same model as the workers W grow.
Pure DP all-reduces the whole model over W ranks; the hybrid all-reduces each half over W/2 and
pays pipeline bubbles and activation traffic instead. Reports where the hybrid overtakes.

    python benchmarks/hybrid_crossover.py [--workers 2,4] [--steps 20]
    sudo .venv/bin/python benchmarks/hybrid_crossover.py --testbed --nic 1gbit --workers 2,4,8
    sudo .venv/bin/python benchmarks/hybrid_crossover.py --testbed --model vgg16 --batch 64 ...
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]

MODELS = {
    "mlp": (["--model", "mlp", "--dataset", "digits", "--set", "model.hidden=1024", "--set", "model.depth=4"],
            "mlp hidden=1024 depth=4 (~3.2 M params, ~5 MFLOP per sample), digits"),
    "vgg16": (["--model", "vgg16", "--dataset", "synthetic-images", "--set", "model.width=8"],
              "vgg16 width 8 (~0.9 M params, conv-heavy), synthetic-images 3x32x32"),
}


def run(strategy: str, workers: int, a: argparse.Namespace, out: Path, extra: list[str]) -> float:
    args = ["train", "--strategy", strategy, *MODELS[a.model][0], "--steps", str(a.steps), "--batch-size",
            str(a.batch), "--procs", str(workers), "--optimizer", "sgd", "--lr", "0.05", "--out", str(out),
            "--no-report", *extra]
    cmd = [sys.executable, "-m", "polytrain"]
    if a.testbed:
        cmd += ["testbed", "--hosts", str(workers), "--nic", a.nic, "--"]
    subprocess.run(cmd + args, check=True, cwd=ROOT, capture_output=True, text=True)
    return float(json.loads((out / "summary.json").read_text())["throughput_samples_per_s"])


def main() -> None:
    from harness import write_results

    p = argparse.ArgumentParser()
    p.add_argument("--workers", default="2,4")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--model", choices=sorted(MODELS), default="mlp")
    p.add_argument("--testbed", action="store_true")
    p.add_argument("--nic", default="1gbit")
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp())
    rows, crossover = [], None
    for w in (int(x) for x in a.workers.split(",")):
        dp = run("allreduce", w, a, tmp / f"ar{w}", [])
        hy = run("mesh", w, a, tmp / f"mesh{w}", ["--set", "pp=2", "--set", f"dp={w // 2}"])
        if crossover is None and hy > dp:
            crossover = w
        rows.append({"workers": w, "link": a.nic if a.testbed else "loopback",
                     "allreduce samples/s": dp, f"mesh dp={w // 2}×pp=2 samples/s": hy,
                     "hybrid / DP": hy / dp})
    ahead = ", ".join(str(r["workers"]) for r in rows if r["hybrid / DP"] > 1)  # type: ignore[operator]
    behind = ", ".join(str(r["workers"]) for r in rows if r["hybrid / DP"] <= 1)  # type: ignore[operator]
    cols = ["workers", "link", "allreduce samples/s", "hybrid / DP"]
    for r in rows:  # the mesh column's name carries dp; give every row the same key for the table
        key = next(k for k in r if k.startswith("mesh"))
        r["mesh dp×pp=2 samples/s"] = r.pop(key)
    cols.insert(3, "mesh dp×pp=2 samples/s")
    name = f"hybrid_crossover_testbed_{a.nic}" if a.testbed else "hybrid_crossover"
    write_results(name + ("" if a.model == "mlp" else f"_{a.model}"), rows, cols,
                  notes=f"{MODELS[a.model][1]}, batch {a.batch}, {a.steps} steps, mesh with the "
                        f"default 1f1b schedule and 2 micro-batches per replica; every emulated host "
                        f"shares this machine's 2 cores. Hybrid faster at W = {ahead or 'none'}; "
                        f"data parallelism faster at W = {behind or 'none'}; first W where the hybrid "
                        f"is faster: {crossover if crossover else 'not reached'}.")


if __name__ == "__main__":
    main()
