"""polytrain's own overhead: (a) `single` vs a plain hand-written loop, (b) `allreduce` vs a
plain DDP script under torchrun — same model, data, global batch and processes. Target: ratio of
polytrain's throughput to the plain one >= 0.95. Throughput is measured over the training steps
(process start-up excluded on both sides).

    python benchmarks/overhead.py [--steps 300] [--repeats 5] [--model cnn|vgg16] [--procs 1|2]
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from harness import write_results  # noqa: E402

CASES = [
    ("cnn/digits", "cnn", "digits", []),
    ("vgg16(w=8)/synthetic 32x32", "vgg16", "synthetic-images", ["model.width=8"]),
]


def _plain(model: str, dataset: str, sets: list[str], steps: int, procs: int) -> float:
    args = ["--model", model, "--dataset", dataset, "--steps", str(steps)]
    for s in sets:
        args += ["--set", s]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if procs == 1:
        env["OMP_NUM_THREADS"] = str(os.cpu_count())
        cmd = [sys.executable, str(HERE / "plain_loop.py"), *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
               str(procs), str(HERE / "plain_loop.py"), *args]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    line = [x for x in out.splitlines() if x.startswith("{")][-1]
    return float(json.loads(line)["samples_per_s"])


def _polytrain(model: str, dataset: str, sets: list[str], steps: int, procs: int) -> float:
    import polytrain

    with tempfile.TemporaryDirectory() as tmp:
        s = polytrain.train(strategy="single" if procs == 1 else "allreduce", procs=procs,
                            model=model, dataset=dataset, steps=steps, out=f"{tmp}/run",
                            sets=sets)
    return float(s["throughput_samples_per_s"])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--model", help="only this case's model (cnn or vgg16); results go to overhead_<model>")
    p.add_argument("--procs", type=int, choices=[1, 2], help="only single (1) or allreduce (2)")
    a = p.parse_args()
    rows = []
    for label, model, dataset, sets in CASES:
        if a.model and model != a.model:
            continue
        for procs, what in ((1, "single vs plain loop"), (2, "allreduce vs plain DDP")):
            if a.procs and procs != a.procs:
                continue
            # Interleaved (plain, polytrain, plain, ...) so that drift in the machine's speed
            # falls on both sides alike.
            plain, ours = [], []
            for _ in range(a.repeats):
                plain.append(_plain(model, dataset, sets, a.steps, procs))
                ours.append(_polytrain(model, dataset, sets, a.steps, procs))
            mp, mo = statistics.median(plain), statistics.median(ours)
            rows.append({"case": label, "comparison": what, "procs": procs,
                         "plain samples/s": mp, "plain range": f"{min(plain):,.0f}-{max(plain):,.0f}",
                         "polytrain samples/s": mo, "polytrain range": f"{min(ours):,.0f}-{max(ours):,.0f}",
                         "ratio": mo / mp, "target": ">= 0.95"})
    name = "overhead" if not (a.model or a.procs) else f"overhead_{a.model or 'all'}_{a.procs or 'all'}"
    write_results(name, rows, ["case", "comparison", "procs", "plain samples/s", "plain range",
                                     "polytrain samples/s", "polytrain range", "ratio", "target"],
                  notes=f"Median of {a.repeats} interleaved runs of {a.steps} steps each, global batch 64, "
                        "Adam; throughput over the training steps (process start-up excluded on both sides).")


if __name__ == "__main__":
    main()
