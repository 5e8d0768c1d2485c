"""The accuracy claims of the README's model and dataset tables, measured over seeds.

    .venv/bin/python benchmarks/zoo_accuracy.py [--seeds 0,1,2,3,4]

- `cnn` on `digits` (the default job's model and data, Adam lr 1e-3, batch 64, one process):
  the first step at which the test accuracy (evaluated every 25 steps) reaches 0.95, and the
  accuracy after 200 steps.
- `sparse-bow` on `bow-ids` (SGD lr 0.5, batch 64, 200 steps, one process): the test accuracy
  after 200 steps (chance 0.125).

Accuracy does not depend on the machine's load, so this needs no benchmark lock; each seed is one
run (the seed fixes the initialisation and the data order), median (min–max) over the seeds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

from harness import fmt_spread, write_results  # noqa: E402

JOBS: dict[str, list[str]] = {
    "cnn / digits, adam lr 1e-3": ["--steps", "200", "--eval-every", "25"],
    "sparse-bow / bow-ids, sgd lr 0.5": ["--model", "sparse-bow", "--dataset", "bow-ids", "--optimizer",
                                         "sgd", "--lr", "0.5", "--steps", "200"],
}


def run(args: list[str], seed: int, out: Path) -> list[dict[str, Any]]:
    """One single-process run; its evaluations (step, accuracy) in order."""
    cmd = [sys.executable, "-m", "polytrain", "train", "--strategy", "single", "--procs", "1",
           "--batch-size", "64", "--seed", str(seed), "--out", str(out), "--no-report", *args]
    done = subprocess.run(cmd, cwd=HERE.parent, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"zoo_accuracy: {' '.join(cmd)} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [{"step": e["step"], "accuracy": e["accuracy"]} for e in events if e.get("event") == "eval"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2,3,4")
    a = p.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    tmp = Path(tempfile.mkdtemp())
    raw: dict[str, dict[int, list[dict[str, Any]]]] = {}
    rows: list[dict[str, Any]] = []
    for name, args in JOBS.items():
        raw[name] = {}
        for s in seeds:
            raw[name][s] = run(args, s, tmp / f"{len(raw)}-{s}")
            print(name, s, raw[name][s][-1], flush=True)
        final = [evals[-1]["accuracy"] for evals in raw[name].values()]
        row: dict[str, Any] = {"job": name, "seeds": len(seeds),
                               "accuracy after 200 steps": fmt_spread(final)}
        if name.startswith("cnn"):
            first = [next((e["step"] for e in evals if e["accuracy"] >= 0.95), None)
                     for evals in raw[name].values()]
            reached = [f for f in first if f is not None]
            row["first step with accuracy >= 0.95"] = (
                f"{fmt_spread(reached, 0)}, {len(reached)}/{len(first)} seeds" if reached else "never")
        rows.append(row)
    write_results("zoo_accuracy", rows, ["job", "seeds", "accuracy after 200 steps",
                                         "first step with accuracy >= 0.95"],
                  extra={"evals": raw},
                  notes="One process (`--strategy single --procs 1`), batch 64, one run per seed; "
                        "median (min–max) over the seeds. cnn evaluated every 25 steps.")


if __name__ == "__main__":
    main()
