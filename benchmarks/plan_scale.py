"""How long `polytrain plan` takes for 4,096 ranks, end to end, as a user runs it.

    python benchmarks/plan_scale.py [--repeats 5] [--models cnn,vgg16,gpt-mini]

For each model: `polytrain profile --batch-size 64 --no-comm --out P` once (not timed: profiling
is this machine's measurement, not planning), then ``--repeats`` timed runs of `polytrain plan
--profile P --batch-size 8192 --json` for the cluster below, the models alternating. The time is
the command's wall clock in a fresh process — interpreter start, imports, reading the profile,
pricing every candidate and ranking them — and the candidates are counted from its JSON output.
Cluster: 512 hosts × 8 processes, 100 Gbit/s NICs, 300 GB/s inside a host, 5 µs latency.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import add_common_flags, alternating, fmt_spread, hold_lock, spread, write_results

CLUSTER = "hosts=512,procs_per_host=8,nic=100gbit,intra=300gbyte,latency=5us"
MODELS = {
    "cnn": ["--model", "cnn", "--dataset", "digits"],
    "vgg16": ["--model", "vgg16", "--set", "model.width=8", "--dataset", "synthetic-images"],
    "gpt-mini": ["--model", "gpt-mini", "--dataset", "chars"],
}


def profile(model: str, out: Path) -> Path:
    path = out / f"{model}.json"
    cmd = [sys.executable, "-m", "polytrain", "profile", *MODELS[model], "--batch-size", "64", "--no-comm"]
    subprocess.run([*cmd, "--out", str(path)], capture_output=True, text=True, check=True)
    return path


def plan(model: str, prof: Path, out: Path) -> tuple[float, int]:
    cmd = [sys.executable, "-m", "polytrain", "plan", "--profile", str(prof), "--batch-size", "8192"]
    cmd += ["--cluster", CLUSTER, "--json", "--out", str(out)]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    start = done.stdout.index("[")
    return wall, len(json.loads(done.stdout[start:]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--models", default="cnn,vgg16,gpt-mini")
    add_common_flags(ap)
    args = ap.parse_args()
    hold_lock(args.lock)
    models = args.models.split(",")
    out = Path(tempfile.gettempdir()) / "plan_scale"
    out.mkdir(parents=True, exist_ok=True)
    profiles = {m: profile(m, out) for m in models}  # untimed
    counts = {m: plan(m, profiles[m], out / m)[1] for m in models}  # untimed warm-up
    walls: dict[str, list[float]] = {m: [] for m in models}
    for _, m in alternating(models, args.repeats):
        walls[m].append(plan(m, profiles[m], out / m)[0])
        print(m, round(walls[m][-1], 3), flush=True)
    rows = [
        {"model": m, "ranks": 4096, "candidates": counts[m], "plan_s": fmt_spread(walls[m], 2)}
        for m in models
    ]
    write_results(
        "plan_scale",
        rows,
        list(rows[0]),
        extra={"repeats": walls, "spread": {m: spread(walls[m]) for m in models}},
        notes=f'`polytrain plan --profile P --json --batch-size 8192 --cluster "{CLUSTER}"`, wall '
        "clock of the whole command in a fresh process (P: `polytrain profile --batch-size 64 "
        f"--no-comm`, untimed; one untimed warm-up run), median (min–max) of {args.repeats} "
        "alternating repeats.",
    )


if __name__ == "__main__":
    main()
