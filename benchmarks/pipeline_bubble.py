"""Measured pipeline bubble of gpipe and 1f1b against the textbook (P-1)/(M+P-1).

The bubble is measured from the run's own timeline (idle stage-time / (stages x wall) per
mini-batch, see polytrain/strategies/pipeline/metrics.py). Balanced stages: mlp with three hidden
layers of width 1024, cut after the second layer (fc1+fc2 | fc3+head: 1.06 M vs 1.01 M
multiply-adds per sample). One rank per core: P=2 on the 2-core dev box (P=4 would time-share
cores and measure the scheduler, not the pipeline).

    python benchmarks/pipeline_bubble.py [--steps 12] [--batch-size 256] [--microbatches 1,2,4,8]
                                          [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from harness import write_results  # noqa: E402

MODEL = ["model.depth=3", "model.hidden=1024", "partition=2,2"]


def one_run(strategy: str, microbatches: int, steps: int, batch: int, out: Path) -> dict[str, Any]:
    import polytrain

    summary = polytrain.train(
        strategy=strategy,
        procs=2,
        model="mlp",
        dataset="digits",
        steps=steps,
        batch_size=batch,
        optimizer="momentum",
        lr=0.01,
        out=str(out),
        sets=[*MODEL, f"microbatches={microbatches}"],
    )
    return summary


def measure(strategy: str, microbatches: int, args: argparse.Namespace, root: Path) -> dict[str, object]:
    """Repeated runs; the least disturbed one (lowest bubble) and the median are reported."""
    runs = []
    for i in range(args.repeats):
        out = root / f"{strategy}-m{microbatches}-{i}"
        runs.append(one_run(strategy, microbatches, args.steps, args.batch_size, out))
        runs[-1]["load_avg"] = os.getloadavg()[0]
    bubbles = [r["strategy_metrics"]["bubble_fraction"] for r in runs]
    best = runs[bubbles.index(min(bubbles))]
    m = best["strategy_metrics"]
    theory = m["bubble_fraction_theory"]
    return {
        "strategy": strategy,
        "P": m["stages"],
        "M": microbatches,
        "bubble_best": min(bubbles),
        "bubble_median": statistics.median(bubbles),
        "bubble_theory": theory,
        "relative_gap_best": (min(bubbles) - theory) / theory if theory else float("nan"),
        "busy_s_per_stage": m["busy_s_per_stage"],
        "samples_per_s_best": best["throughput_samples_per_s"],
        "bubbles": bubbles,
        "load_avg": [r["load_avg"] for r in runs],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--microbatches", default="1,2,4,8")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for strategy in ("gpipe", "1f1b"):
            for m in (int(x) for x in args.microbatches.split(",")):
                rows.append(measure(strategy, m, args, Path(tmp)))
    notes = (
        "bubble: idle / (stages x wall) from the recorded forward/backward spans, summed over "
        f"mini-batches; best and median of {args.repeats} runs (the host is shared: a descheduled "
        "rank shows up as bubble). bubble_theory: (P-1)/(M+P-1). The gap is what the formula leaves out: "
        "transfers and waits for them, Python overhead per action, residual imbalance, a shared host."
    )
    cols = [
        "strategy",
        "P",
        "M",
        "bubble_best",
        "bubble_median",
        "bubble_theory",
        "relative_gap_best",
        "samples_per_s_best",
    ]
    write_results("pipeline_bubble", rows, cols, notes)


if __name__ == "__main__":
    main()
