"""Compressed parameter-server pulls: bytes and accuracy with and without them, on loopback.

    python benchmarks/ps_pulls.py [--repeats 5] [--steps 200]

`ps` with 1 server and 2 workers (`--procs 3`), mlp on digits, batch 64, SGD lr 0.1: uncompressed;
worker pushes as topk 1 % + zstd with the server's replies compressed the same way (the default,
``compress_pulls=true``); and the same pushes with dense replies (``compress_pulls=false``). Bytes
per step are polytrain's counts at the sends (``bytes_by_op``: ``ps_pull`` summed over the servers,
``ps_push`` over the workers, each divided by the steps); accuracy is the final test accuracy.
Repeat r uses seed r + 1; the cases alternate, their order reversed every other repeat; median
(min–max) over the repeats.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness import alternating, fmt_spread, write_results

TOPK = ["compression=topk", "ratio=0.01", "entropy=zstd"]
CASES: dict[str, list[str]] = {
    "uncompressed": [],
    "topk 1% zstd, compressed pulls": TOPK,
    "topk 1% zstd, dense pulls": [*TOPK, "compress_pulls=false"],
}


def run(case: str, seed: int, steps: int, out: Path) -> dict[str, float]:
    sets = [x for s in CASES[case] for x in ("--set", s)]
    cmd = [
        sys.executable,
        "-m",
        "polytrain",
        "train",
        "--strategy",
        "ps",
        "--procs",
        "3",
        "--model",
        "mlp",
        "--dataset",
        "digits",
        "--steps",
        str(steps),
        "--batch-size",
        "64",
        "--optimizer",
        "sgd",
        "--lr",
        "0.1",
        "--seed",
        str(seed),
        *sets,
        "--out",
        str(out),
        "--no-report",
    ]
    subprocess.run(cmd, capture_output=True, text=True, check=True)
    s = json.loads((out / "summary.json").read_text())
    ranks = s["per_rank"]
    pulls = sum(r["bytes_by_op"].get("ps_pull", 0) for r in ranks if r["role"] == "server")
    pushes = sum(r["bytes_by_op"].get("ps_push", 0) for r in ranks if r["role"] == "worker")
    return {
        "pull B/step": pulls / steps,
        "push B/step": pushes / steps,
        "accuracy": float(s["eval"]["accuracy"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in CASES}
    with tempfile.TemporaryDirectory() as tmp:
        for r, case in alternating(list(CASES), args.repeats):
            runs[case].append(run(case, r + 1, args.steps, Path(tmp) / f"r{r}-case{list(CASES).index(case)}"))
            print(case, r, runs[case][-1], flush=True)
    rows: list[dict[str, Any]] = []
    for case, rs in runs.items():
        rows.append(
            {
                "case": case,
                **{
                    k: fmt_spread([x[k] for x in rs], 3 if k == "accuracy" else 0)
                    for k in ("pull B/step", "push B/step", "accuracy")
                },
            }
        )
    write_results(
        "ps_pulls",
        rows,
        list(rows[0]),
        extra={"repeats": runs},
        notes=f"ps, 1 server + 2 workers on loopback, mlp on digits, {args.steps} steps, batch 64, "
        f"SGD lr 0.1; {args.repeats} repeats (seed = repeat + 1), the cases alternating; "
        "median (min–max). Bytes: polytrain's counts at the sends.",
    )


if __name__ == "__main__":
    main()
