"""Hogwild! with and without the lock: updates per second, measured overlap, accuracy.

    .venv/bin/python benchmarks/dp_hogwild.py [--procs 2,4] [--steps 1000] [--repeats 2]

Logistic regression on ``sparse-bow`` (200 features, ~10 per sample), 4 samples per update.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from harness import write_results  # noqa: E402


def main() -> None:
    import polytrain

    p = argparse.ArgumentParser()
    p.add_argument("--procs", default="2,4")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=2)
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp())
    rows: list[dict[str, Any]] = []
    for procs in (int(x) for x in a.procs.split(",")):
        for lock in (True, False):
            runs = []
            for r in range(a.repeats):
                runs.append(polytrain.train(
                    strategy="hogwild", procs=procs, model="mlp", dataset="sparse-bow",
                    steps=a.steps, batch_size=4 * procs, optimizer="sgd", lr=0.5, seed=r,
                    out=str(tmp / f"{procs}-{lock}-{r}"),
                    sets=["model.depth=0", "data.features=200", f"lock={str(lock).lower()}"]))
            ms = [s["strategy_metrics"] for s in runs]
            rows.append({"procs": procs, "lock": lock,
                         "updates/s": statistics.median(m["updates_per_s"] for m in ms),
                         "overlapping updates %": statistics.median(
                             100 * m["overlapping_updates"] / m["updates"] for m in ms),
                         "interleaved updates %": statistics.median(
                             100 * m["interleaved_updates"] / m["updates"] for m in ms),
                         "write share %": statistics.median(100 * m["write_share"] for m in ms),
                         "lock wait us per update": statistics.median(
                             1e6 * m["lock_wait_s"] / m["updates"] for m in ms),
                         "accuracy": statistics.median(s["eval"]["accuracy"] for s in runs)})
            print(rows[-1], flush=True)
    write_results("dp_hogwild", rows, list(rows[0]),
                  notes=f"Median of {a.repeats} runs (seeds 0..), {a.steps} updates per process. "
                        "overlapping: writes running while another rank's write runs; interleaved: "
                        "writes whose parameters another rank changed between read and write; "
                        "write share: time inside the shared write / (wall x procs); lock wait: "
                        "time to acquire the lock (0 without it).")


if __name__ == "__main__":
    main()
