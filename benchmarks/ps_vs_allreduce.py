"""``ps`` (BSP, one server) against ``allreduce`` on a dense and a sparse-feature job, on the
emulated cluster with every rank on its own host (needs root): bytes and throughput.

    sudo .venv/bin/python benchmarks/ps_vs_allreduce.py [--workers 4] [--nic 100mbit] [--steps 30]
        [--repeats 5]

The survey (004 §4.3, Parallax) notes that parameter servers suit sparse models and collectives
dense ones. Dense: ``mlp`` on digits. Sparse: logistic regression on ``sparse-bow`` (2000 features,
~10 per sample), whose first-layer gradient touches only the features of the batch; ``ps`` pushes
it as (index, value) pairs, ``allreduce`` all-reduces it whole. Both run W workers; ``ps`` has
one more rank, its server. The two strategies alternate, the order reversed every repeat; time per
step is the median (min–max) over the repeats; bytes are polytrain's payload count beside the
emulated hosts' interface counters (``NIC tx``, the whole run: start-up and evaluation included).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

from harness import alternating, fmt_spread, spread, write_results  # noqa: E402
from ps_sharding import step_seconds  # noqa: E402

JOBS = {
    "dense: mlp on digits": ["--model", "mlp", "--dataset", "digits"],
    "sparse: logistic regression on sparse-bow": ["--model", "mlp", "--dataset", "sparse-bow",
                                                   "--set", "model.depth=0"],
}


def run(job: list[str], strategy: str, workers: int, nic: str, steps: int, out: Path) -> dict[str, Any]:
    procs = workers + (strategy == "ps")
    cmd = [sys.executable, "-m", "polytrain", "testbed", "--hosts", str(procs), "--nic", nic, "--",
           "train", "--strategy", strategy, "--procs", str(procs), *job, "--steps", str(steps),
           "--batch-size", str(8 * workers), "--optimizer", "sgd", "--lr", "0.1", "--out", str(out),
           "--no-report"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=HERE.parent, capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    s = json.loads((out / "summary.json").read_text())
    step_s = step_seconds(out, procs - workers)
    nic = sum(s["testbed"]["nic_bytes_tx"].values())
    return {"strategy": strategy, "MB sent per step": s["bytes_sent"] / steps / 1e6,
            "NIC tx / payload": nic / s["bytes_sent"],
            "bytes per sample": s["bytes_sent_per_sample"], "step ms": 1000 * step_s,
            "samples/s": 8 * workers / step_s,
            "sparse pushes": s["strategy_metrics"].get("sparse_pushes", "-")}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--nic", default="100mbit")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp())
    rows, raw = [], {}
    for i, (label, job) in enumerate(JOBS.items()):
        runs: dict[str, list[dict[str, Any]]] = {"allreduce": [], "ps": []}
        for r, strategy in alternating(["allreduce", "ps"], a.repeats):
            runs[strategy].append(run(job, strategy, a.workers, a.nic, a.steps, tmp / f"{i}{strategy}{r}"))
            print(label, runs[strategy][-1], flush=True)
        raw[label] = runs
        for strategy, rs in runs.items():
            rows.append({"job": label, "strategy": strategy,
                         "samples/s": fmt_spread([x["samples/s"] for x in rs], 0),
                         "step ms": fmt_spread([x["step ms"] for x in rs], 1),
                         "payload MB per step": spread([x["MB sent per step"] for x in rs])["median"],
                         "NIC tx / payload": fmt_spread([x["NIC tx / payload"] for x in rs], 3),
                         "bytes per sample": spread([x["bytes per sample"] for x in rs])["median"],
                         "sparse pushes": rs[0]["sparse pushes"]})
    write_results(f"ps_vs_allreduce_{a.nic}", rows, list(rows[0]), extra={"repeats": raw},
                  notes=f"{a.workers} workers (+1 server for ps), 8 samples per worker per step, "
                        f"{a.steps} steps, one rank per emulated host at {a.nic}, one torch thread per "
                        f"rank; {a.repeats} repeats, the strategies alternating; median (min–max). "
                        "Payload: polytrain's counted bytes of all ranks (median; per-repeat values in "
                        "the JSON). NIC tx: the hosts' interface counters over the whole run.")

if __name__ == "__main__":
    main()
