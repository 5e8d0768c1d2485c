"""Throughput before and after the one-runtime change, run side by side on the same machine.

The strategies whose runtime changed (the pipeline executor under layerwise, mesh dp×pp and
distbelief; the flush pipelines gpipe/1f1b with the outbox acks; ps on the shared loop with its
reply handling) train the same job under two interpreters: ``--base-python`` (an environment
whose ``polytrain`` is the tree before the change, e.g. a worktree of its parent commit put on a
venv's path) and this one. Runs alternate A, B, B, A, ... (harness.alternating over every
(strategy, version) cell), so load that drifts falls on both; each run is a fresh launch.
Reported per strategy: samples/s median (min–max) of each version and the ratio new/base of the
medians plus the per-repeat ratios' median (min–max) — a ratio whose range holds 1.0 is "no
regression measurable here".

    python benchmarks/pipeline_runtime_ab.py --base-python BASE_VENV/bin/python --repeats 5
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
sys.path.insert(0, str(HERE))

from harness import alternating, fmt_spread, write_results  # noqa: E402

# strategy -> (procs, options)
CASES: dict[str, tuple[int, dict[str, Any]]] = {
    "layerwise": (2, {}),
    "gpipe": (2, {"microbatches": 4, "partition": "uniform"}),
    "1f1b": (2, {"microbatches": 4, "partition": "uniform"}),
    "mesh": (4, {"dp": 2, "pp": 2, "schedule": "1f1b", "microbatches": 2}),
    "distbelief": (4, {"stages": 2, "consistency": "bsp"}),
    "ps": (3, {"servers": 1, "consistency": "bsp"}),
}

RUN = """
import json, sys
import polytrain
a = json.loads(sys.argv[1])
s = polytrain.train(strategy=a["strategy"], procs=a["procs"], model="mlp", dataset="digits",
                    steps=a["steps"], batch_size=a["batch"], optimizer="sgd", lr=0.05, seed=1,
                    out=a["out"], options=a["options"], sets=["model.hidden=256", "model.depth=3"])
import statistics
from pathlib import Path
# the first rank that trains (ps/distbelief: rank 0 is a server in one of the trees, no steps)
ranks = sorted((Path(a["out"]) / "ranks").glob("rank*.jsonl"), key=lambda f: int(f.stem[4:]))
for f in ranks:
    ev = [json.loads(x) for x in f.read_text().splitlines()]
    t = [e["t"] for e in ev if e["event"] == "step"][5:]  # steps 1-5 outside, as a warm-up
    if len(t) > 1:
        break
step_ms = 1000 * statistics.median(b - c for c, b in zip(t, t[1:]))
print("RESULT", json.dumps({"samples_per_s": s["throughput_samples_per_s"], "wall_s": s["wall_s"],
                            "step_ms": step_ms, "step_rank": f.stem, "polytrain": polytrain.__file__}))
"""


def one_run(python: str, strategy: str, steps: int, batch: int, out: Path) -> dict[str, Any]:
    procs, options = CASES[strategy]
    arg = json.dumps({"strategy": strategy, "procs": procs, "steps": steps, "batch": batch,
                      "out": str(out), "options": options})
    env = {**os.environ, "POLYTRAIN_REPORT": "0"}
    done = subprocess.run([python, "-c", RUN, arg], capture_output=True, text=True, cwd=out.parent,
                          env=env, timeout=900)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"{strategy} under {python} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return {**json.loads(line.removeprefix("RESULT ")), "load": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--base-python", required=True, help="interpreter whose polytrain is the base tree")
    ap.add_argument("--strategies", default=",".join(CASES))
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--name", default="pipeline_runtime_ab")
    args = ap.parse_args()
    versions = {"base": args.base_python, "new": sys.executable}
    cells = [(s, v) for s in args.strategies.split(",") for v in versions]
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {c: [] for c in cells}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (strategy, version) in alternating(cells, args.repeats):
            out = Path(tmp) / f"{strategy}-{version}-{i}"
            r = one_run(versions[version], strategy, args.steps, args.batch_size, out)
            runs[(strategy, version)].append(r)
            print(f"repeat {i} {strategy} {version}: {r['samples_per_s']:.0f} samples/s load {r['load']:.1f} "
                  f"({r['polytrain']})", flush=True)
    rows = []
    for strategy in args.strategies.split(","):
        base = [r["samples_per_s"] for r in runs[(strategy, "base")]]
        new = [r["samples_per_s"] for r in runs[(strategy, "new")]]
        paired = [n / b for n, b in zip(new, base, strict=True)]
        base_ms = [r["step_ms"] for r in runs[(strategy, "base")]]
        new_ms = [r["step_ms"] for r in runs[(strategy, "new")]]
        paired_ms = [b / n for n, b in zip(new_ms, base_ms, strict=True)]
        rows.append({
            "strategy": strategy, "procs": CASES[strategy][0], "options": json.dumps(CASES[strategy][1]),
            "base_samples_per_s": fmt_spread(base, 0), "new_samples_per_s": fmt_spread(new, 0),
            "ratio_of_medians": statistics.median(new) / statistics.median(base),
            "paired_ratio": fmt_spread(paired, 2),
            "base_step_ms": fmt_spread(base_ms, 2), "new_step_ms": fmt_spread(new_ms, 2),
            "step_speed_ratio": fmt_spread(paired_ms, 2),
            "load": fmt_spread([r["load"] for v in versions for r in runs[(strategy, v)]], 1),
            "base": base, "new": new,
            "base_tree": runs[(strategy, "base")][0]["polytrain"],
        })
    notes = (f"mlp 3×256 on digits, batch {args.batch_size}, {args.steps} SGD steps per run, "
             f"{args.repeats} repeats per cell, runs alternating (harness.alternating); samples/s is "
             "the summary's throughput (samples over the ranks' training wall time). paired_ratio: "
             "new/base of the runs made next to each other, median (min–max). step_ms: the median "
             "time between the step events of the lowest rank that trains (rank 0, or the first "
             "worker where rank 0 is a server), after step 5 (robust to a stalled step and to "
             "start-up); step_speed_ratio: base/new step time per pair (> 1: new faster). load: "
             "1-minute load average after each run.")
    cols = ["strategy", "procs", "options", "base_samples_per_s", "new_samples_per_s",
            "ratio_of_medians", "paired_ratio", "base_step_ms", "new_step_ms", "step_speed_ratio", "load"]
    write_results(args.name, rows, cols, notes, extra={"base_python": args.base_python})


if __name__ == "__main__":
    main()
