"""polytrain's own overhead: (a) `single` vs a plain hand-written loop, (b) `allreduce` vs a
plain DDP script under torchrun — same model, data, global batch and processes. Target: ratio of
polytrain's throughput to the plain one >= 0.95. Throughput is measured over the training steps
(process start-up excluded on both sides).

Separate processes of the very same job differ by up to ±15% on a shared 2-core VM (a process
lands in a fast or a slow state and keeps it), so one pair of runs proves nothing. Runs come in
pairs (plain, polytrain), the order alternating from pair to pair; the table gives the ratio of
the medians, the median of the per-pair ratios with its spread, and the same for the median time
of one step (immune to a few stalled steps). ``--append`` adds this call's pairs to the earlier
ones, so that many pairs can be gathered in short calls.

    python benchmarks/overhead.py [--steps 300] [--pairs 5] [--model cnn|vgg16] [--procs 1|2]
                                  [--append]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from harness import RESULTS, write_results  # noqa: E402

CASES = [
    ("cnn/digits", "cnn", "digits", []),
    ("vgg16(w=8)/synthetic 32x32", "vgg16", "synthetic-images", ["model.width=8"]),
]
WHAT = {1: "single vs plain loop", 2: "allreduce vs plain DDP"}


def _plain(model: str, dataset: str, sets: list[str], steps: int, procs: int) -> tuple[float, float]:
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
    rec = json.loads([x for x in out.splitlines() if x.startswith("{")][-1])
    return float(rec["samples_per_s"]), float(rec["median_step_s"])


def _polytrain(model: str, dataset: str, sets: list[str], steps: int, procs: int) -> tuple[float, float]:
    import polytrain

    with tempfile.TemporaryDirectory() as tmp:
        s = polytrain.train(strategy="single" if procs == 1 else "allreduce", procs=procs,
                            model=model, dataset=dataset, steps=steps, out=f"{tmp}/run",
                            sets=sets)
        ends = [0.0]  # the rank's clock starts at its first step
        for line in (Path(tmp) / "run" / "ranks" / "rank0.jsonl").read_text().splitlines():
            if line.startswith('{"event": "step"'):
                ends.append(float(json.loads(line)["t"]))
    return float(s["throughput_samples_per_s"]), statistics.median(
        b - a for a, b in itertools.pairwise(ends))


def _summary(label: str, procs: int, pairs: list[dict[str, Any]]) -> dict[str, Any]:
    def med(key: str) -> float:
        return statistics.median(p[key] for p in pairs)

    ratios = sorted(p["ratio"] for p in pairs)
    step_ratios = sorted(p["step_ratio"] for p in pairs)
    q = len(ratios) // 4
    return {"case": label, "comparison": WHAT[procs], "pairs": len(pairs),
            "plain samples/s": med("plain"), "polytrain samples/s": med("polytrain"),
            "ratio of medians": med("polytrain") / med("plain"),
            "paired ratio": statistics.median(ratios),
            "paired middle half": f"{ratios[q]:.3f}-{ratios[-1 - q]:.3f}",
            "step ms plain": 1e3 * med("plain_step_s"), "step ms polytrain": 1e3 * med("polytrain_step_s"),
            "step ratio": statistics.median(step_ratios),
            "polytrain ahead": f"{sum(r >= 1 for r in ratios)}/{len(ratios)}",
            "target": ">= 0.95"}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--pairs", "--repeats", dest="pairs", type=int, default=5)
    p.add_argument("--model", help="only this case's model (cnn or vgg16); results go to overhead_<model>")
    p.add_argument("--procs", type=int, choices=[1, 2], help="only single (1) or allreduce (2)")
    p.add_argument("--append", action="store_true", help="add to the pairs already in the results")
    a = p.parse_args()
    name = "overhead" if not (a.model or a.procs) else f"overhead_{a.model or 'all'}_{a.procs or 'all'}"
    runs: list[dict[str, Any]] = []
    if a.append and (RESULTS / f"{name}.json").exists():
        runs = json.loads((RESULTS / f"{name}.json").read_text()).get("pairs", [])
    for label, model, dataset, sets in CASES:
        if a.model and model != a.model:
            continue
        for procs in (1, 2):
            if a.procs and procs != a.procs:
                continue
            done = sum(r["case"] == label and r["procs"] == procs for r in runs)
            for i in range(a.pairs):
                sides = [("plain", _plain), ("polytrain", _polytrain)]
                if (done + i) % 2:
                    sides.reverse()  # alternate who goes first: drift falls on both alike
                pair: dict[str, Any] = {"case": label, "procs": procs, "steps": a.steps}
                for side, fn in sides:
                    pair[side], pair[f"{side}_step_s"] = fn(model, dataset, sets, a.steps, procs)
                pair["ratio"] = pair["polytrain"] / pair["plain"]
                pair["step_ratio"] = pair["plain_step_s"] / pair["polytrain_step_s"]
                print(json.dumps(pair), flush=True)
                runs.append(pair)
    rows = [_summary(label, procs, mine) for label, *_ in CASES for procs in (1, 2)
            if (mine := [r for r in runs if r["case"] == label and r["procs"] == procs])]
    out = write_results(name, rows, list(rows[0]), notes=(
        "Pairs of runs (plain, polytrain), the order alternating from pair to pair, each run "
        f"{a.steps} steps of global batch 64 with Adam in fresh processes; throughput over the "
        "training steps (start-up excluded on both sides). `ratio of medians`: polytrain's median "
        "throughput / the plain one's; `paired ratio`: median over pairs of polytrain/plain, with "
        "the middle half of the pairs' ratios; `step ratio`: the same with the median time of one "
        "step in each run (plain/polytrain, so > 1 means polytrain is faster). Single runs of the "
        "same job vary by up to ±15% on this shared 2-core VM."),
        appended=a.append, extra={"pairs": runs})
    print(out)


if __name__ == "__main__":
    main()
