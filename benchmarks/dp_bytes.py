"""Bytes per worker and accuracy: ``local-sgd`` (period 1, 4, 16, one-shot) and ``malt`` (Halton,
all peers) against ``allreduce`` on the same job.

    .venv/bin/python benchmarks/dp_bytes.py [--procs 4] [--steps 200]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from harness import write_results  # noqa: E402

CASES = [("allreduce", []), ("local-sgd", ["period=1"]), ("local-sgd", ["period=4"]),
         ("local-sgd", ["period=16"]), ("local-sgd", ["period=0"]),
         ("malt", ["graph=halton", "exchange=params"]), ("malt", ["graph=halton", "exchange=grads"]),
         ("malt", ["graph=all", "exchange=params"])]


def main() -> None:
    import polytrain

    p = argparse.ArgumentParser()
    p.add_argument("--procs", type=int, default=4)
    p.add_argument("--steps", type=int, default=200)
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp())
    rows: list[dict[str, Any]] = []
    base = None
    for i, (name, sets) in enumerate(CASES):
        s = polytrain.train(strategy=name, procs=a.procs, model="mlp", dataset="digits",
                            steps=a.steps, batch_size=64, optimizer="sgd", lr=0.2,
                            out=str(tmp / str(i)), sets=sets)
        per_worker = s["bytes_sent"] / a.procs
        base = base or per_worker
        rows.append({"strategy": name, "options": " ".join(sets) or "-",
                     "MB per worker": per_worker / 1e6, "vs allreduce": per_worker / base,
                     "accuracy": s["eval"]["accuracy"], "samples/s": s["throughput_samples_per_s"]})
        print(rows[-1], flush=True)
    write_results("dp_bytes", rows, list(rows[0]),
                  notes=f"mlp on digits, {a.procs} ranks, batch 64, SGD lr 0.2, {a.steps} steps; "
                        "bytes are polytrain's counted bytes (ring all-reduce: 2(W-1)/W of the "
                        "vector per rank; MALT: one copy per peer).")


if __name__ == "__main__":
    main()
