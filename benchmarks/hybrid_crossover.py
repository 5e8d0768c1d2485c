"""The MP–DP crossover (Pal et al. 2019; 000 §V), measured: throughput of pure data parallelism
(`allreduce`) and of hybrid `mesh` dp×pp (pp=2, dp=W/2) on the same model as the workers W grow.
Pure DP all-reduces the whole model over W ranks; the hybrid all-reduces each half over W/2 and
pays pipeline bubbles and activation traffic instead. Reports where the hybrid overtakes.

    python benchmarks/hybrid_crossover.py [--workers 2,4] [--steps 20]
    sudo .venv/bin/python benchmarks/hybrid_crossover.py --testbed --nic 1gbit --workers 2,4,8
    sudo .venv/bin/python benchmarks/hybrid_crossover.py --testbed --model vgg16 --batch 64 ...

The two strategies alternate at every W, the order reversed every repeat (``--repeats``, default 5);
median (min–max) of throughput, and hybrid / DP paired within a repeat. The results file
(``..._w2-4-8`` for ``--workers 2,4,8``) is rewritten after every W, so a run cut short keeps what
it finished.
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
              "vgg16 width 8 (~2.0 M params, 76% in fc1; the convolutions hold the compute), "
              "synthetic-images 3x32x32"),
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
    from harness import alternating, fmt_spread, spread, write_results

    p = argparse.ArgumentParser()
    p.add_argument("--workers", default="2,4")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--model", choices=sorted(MODELS), default="mlp")
    p.add_argument("--testbed", action="store_true")
    p.add_argument("--nic", default="1gbit")
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp())
    workers = [int(x) for x in a.workers.split(",")]
    rows: list[dict[str, object]] = []
    raw: dict[str, dict[str, list[float]]] = {}
    ahead: list[str] = []
    behind: list[str] = []
    name = f"hybrid_crossover_testbed_{a.nic}" if a.testbed else "hybrid_crossover"
    name += ("" if a.model == "mlp" else f"_{a.model}") + "_w" + "-".join(map(str, workers))
    for w in workers:
        runs: dict[str, list[float]] = {"allreduce": [], "mesh": []}
        for r, strategy in alternating(["allreduce", "mesh"], a.repeats):
            extra = ["--set", "pp=2", "--set", f"dp={w // 2}"] if strategy == "mesh" else []
            runs[strategy].append(run(strategy, w, a, tmp / f"{strategy}{w}-{r}", extra))
            print(w, strategy, runs[strategy][-1], flush=True)
        raw[f"workers={w}"] = runs
        paired = [h / d for h, d in zip(runs["mesh"], runs["allreduce"], strict=True)]
        (ahead if spread(paired)["median"] > 1 else behind).append(str(w))
        rows.append({"workers": w, "link": a.nic if a.testbed else "loopback",
                     "allreduce samples/s": fmt_spread(runs["allreduce"], 1),
                     "mesh dp×pp=2 samples/s": fmt_spread(runs["mesh"], 1),
                     "hybrid / DP (paired)": fmt_spread(paired, 2)})
        left = workers[len(rows):]
        # written after every W, so a run cut short (the shared machine's time limits) keeps the
        # sizes it finished; the notes say which are missing
        write_results(name, rows, list(rows[0]), extra={"repeats": raw},
                      notes=f"{MODELS[a.model][1]}, batch {a.batch}, {a.steps} steps, mesh dp=W/2 x pp=2 "
                            f"with the default 1f1b schedule and 2 micro-batches per replica; every "
                            f"emulated host shares this machine's 2 cores. {a.repeats} repeats, the "
                            f"strategies alternating; median (min–max). Hybrid faster by the median at "
                            f"W = {', '.join(ahead) or 'none'}; data parallelism at W = "
                            f"{', '.join(behind) or 'none'}."
                            + (f" Not yet measured (run in progress or cut short): W = "
                               f"{', '.join(map(str, left))}." if left else ""))


if __name__ == "__main__":
    main()
