"""Which codec suits which optimizer (issue 51): SGD / momentum SGD / Adam × none / topk / dgc /
onebit-adam, final accuracy and bytes, on the default cnn and digits, 2 local ranks.

    .venv/bin/python benchmarks/codecs_optimizers.py [--steps 150] [--seeds 3]

``dgc`` keeps its own momentum (0.9) under plain SGD, its design; under momentum SGD and Adam that
pair is refused before launch (double momentum), so those rows run ``dgc_momentum=0`` (top-k with
error feedback and DGC's sparsity warm-up). ``onebit-adam`` exists for Adam only. Seeds are
interleaved; median (min–max); Δ: paired by seed against the same optimizer uncompressed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

from harness import alternating, fmt_spread, write_results  # noqa: E402

LR = {"sgd": 0.1, "momentum": 0.05, "adam": 0.002}
CODECS: dict[str, list[str]] = {
    "none": [],
    "topk 1%": ["compression=topk", "ratio=0.01"],
    "dgc 1%": ["compression=dgc", "ratio=0.01", "dgc_warmup=25"],
    "dgc 1% (dgc_momentum=0)": ["compression=dgc", "ratio=0.01", "dgc_warmup=25", "dgc_momentum=0"],
    "onebit-adam": ["compression=onebit-adam", "onebit_warmup=30"],
}
PAIRS = [("sgd", "none"), ("sgd", "topk 1%"), ("sgd", "dgc 1%"),
         ("momentum", "none"), ("momentum", "topk 1%"), ("momentum", "dgc 1% (dgc_momentum=0)"),
         ("adam", "none"), ("adam", "topk 1%"), ("adam", "dgc 1% (dgc_momentum=0)"), ("adam", "onebit-adam")]


def run(opt: str, codec: str, seed: int, steps: int, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "polytrain", "train", "--strategy", "allreduce", "--procs", "2",
           "--model", "cnn", "--dataset", "digits", "--batch-size", "64", "--steps", str(steps),
           "--optimizer", opt, "--lr", str(LR[opt]), "--seed", str(seed), "--out", str(out), "--no-report",
           *[x for s in CODECS[codec] for x in ("--set", s)]]
    done = subprocess.run(cmd, cwd=HERE.parent, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    s = json.loads((out / "summary.json").read_text())
    return {"optimizer": opt, "codec": codec, "seed": seed, "accuracy": s["eval"]["accuracy"],
            "bytes_per_rank_step": s["bytes_sent"] / 2 / s["steps"]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--seeds", type=int, default=3)
    a = p.parse_args()
    tmp, runs = Path(tempfile.mkdtemp(prefix="codec-opt-")), []
    for seed, (opt, codec) in alternating(PAIRS, a.seeds):
        runs.append(run(opt, codec, seed, a.steps, tmp / f"{opt}-{codec.split()[0]}-{seed}"))
        print(runs[-1], flush=True)
    rows = []
    for opt, codec in PAIRS:
        rs = [r for r in runs if (r["optimizer"], r["codec"]) == (opt, codec)]
        base = {r["seed"]: r for r in runs if (r["optimizer"], r["codec"]) == (opt, "none")}
        b = statistics.median(r["bytes_per_rank_step"] for r in rs)
        b0 = statistics.median(r["bytes_per_rank_step"] for r in base.values())
        rows.append({"optimizer": f"{opt} (lr {LR[opt]})", "codec": codec,
                     "final accuracy": fmt_spread([r["accuracy"] for r in rs], 3),
                     "Δ paired (points)": (fmt_spread([100 * (r["accuracy"] - base[r["seed"]]["accuracy"])
                                                       for r in rs], 1) if codec != "none" else "-"),
                     "bytes/step/rank": f"{b:,.0f}", "bytes reduction": f"{b0 / b:.1f}x"})
    write_results("codecs_optimizers", rows, list(rows[0]), extra={"runs": runs},
                  notes=f"allreduce, 2 local ranks, default cnn on digits, global batch 64, {a.steps} "
                        f"steps, seeds 0..{a.seeds - 1} interleaved; median (min–max). 'dgc 1%' keeps "
                        "its momentum 0.9 (plain SGD only: with momentum or Adam it is refused); "
                        "onebit-adam warms up for 30 steps. Bytes: polytrain's count at every send.")


if __name__ == "__main__":
    main()
