"""CPU seconds per training step before and after the one-runtime change (load-robust A/B).

On a shared, loaded machine wall-clock throughput of a small model swings 2–4× between runs
(pipeline_runtime_ab.py); the CPU time the ranks spend per step barely moves with the load. Each
measurement is two launches of the same job, ``--short`` and ``--long`` steps, under one
interpreter; the CPU seconds of all processes of the launch (getrusage of the children: the
launcher's agent and every rank) of the short one are subtracted from the long one's, leaving
the CPU of ``long - short`` steps (start-up, imports and the final evaluation cancel). Base
(``--base-python``, an environment whose polytrain is the tree before the change) and new (this
interpreter) alternate; run it niced if other jobs must keep their share (CPU time is unaffected).

    nice -n 19 python benchmarks/pipeline_runtime_cpu.py --base-python BASE_VENV/bin/python
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
sys.path.insert(0, str(HERE))

from harness import alternating, fmt_spread, write_results  # noqa: E402
from pipeline_runtime_ab import CASES  # noqa: E402

RUN = """
import json, resource, sys
import polytrain
a = json.loads(sys.argv[1])
polytrain.train(strategy=a["strategy"], procs=a["procs"], model="mlp", dataset="digits",
                steps=a["steps"], batch_size=64, optimizer="sgd", lr=0.05, seed=1, out=a["out"],
                options=a["options"], sets=["model.hidden=256", "model.depth=3"])
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print("RESULT", json.dumps({"cpu_s": r.ru_utime + r.ru_stime}))
"""


def cpu_of(python: str, strategy: str, steps: int, out: Path) -> float:
    procs, options = CASES[strategy]
    arg = json.dumps({"strategy": strategy, "procs": procs, "steps": steps, "out": str(out),
                      "options": options})
    done = subprocess.run([python, "-c", RUN, arg], capture_output=True, text=True, cwd=out.parent,
                          env={**os.environ, "POLYTRAIN_REPORT": "0"}, timeout=900)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"{strategy} under {python} failed:\n{done.stderr[-3000:]}")
    return float(json.loads(line.removeprefix("RESULT "))["cpu_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--base-python", required=True)
    ap.add_argument("--strategies", default="layerwise,gpipe,1f1b,ps")
    ap.add_argument("--short", type=int, default=50)
    ap.add_argument("--long", type=int, default=450)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--name", default="pipeline_runtime_cpu")
    args = ap.parse_args()
    versions = {"base": args.base_python, "new": sys.executable}
    cells = [(s, v) for s in args.strategies.split(",") for v in versions]
    per_step: dict[tuple[str, str], list[float]] = {c: [] for c in cells}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (strategy, version) in alternating(cells, args.repeats):
            cpu = [cpu_of(versions[version], strategy, n, Path(tmp) / f"{strategy}-{version}-{i}-{n}")
                   for n in (args.short, args.long)]
            per_step[(strategy, version)].append(1000 * (cpu[1] - cpu[0]) / (args.long - args.short))
            print(f"repeat {i} {strategy} {version}: {per_step[(strategy, version)][-1]:.2f} CPU ms/step "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
    rows: list[dict[str, Any]] = []
    for strategy in args.strategies.split(","):
        base, new = per_step[(strategy, "base")], per_step[(strategy, "new")]
        rows.append({"strategy": strategy, "procs": CASES[strategy][0],
                     "base_cpu_ms_per_step": fmt_spread(base, 2), "new_cpu_ms_per_step": fmt_spread(new, 2),
                     "new_over_base": fmt_spread([n / b for n, b in zip(new, base, strict=True)], 2),
                     "base": base, "new": new})
    notes = (f"mlp 3×256 on digits, batch 64, SGD; CPU ms per step of all processes of a launch, from "
             f"launches of {args.long} and {args.short} steps; median (min–max) of {args.repeats} "
             "alternating repeats; new_over_base per repeat pair (< 1: the new runtime uses less CPU).")
    write_results(args.name, rows, ["strategy", "procs", "base_cpu_ms_per_step", "new_cpu_ms_per_step",
                                    "new_over_base"], notes, extra={"base_python": args.base_python})


if __name__ == "__main__":
    main()
