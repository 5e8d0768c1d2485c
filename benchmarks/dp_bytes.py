"""``local-sgd`` (period 4, 16) and ``malt`` (Halton peers) against ``allreduce`` on a job that
learns: time to a target accuracy, throughput and bytes per worker.

    .venv/bin/python benchmarks/dp_bytes.py [--procs 4] [--steps 200] [--target 0.9] [--repeats 5]
        [--collective ring]

The strategies differ in statistical efficiency (local-sgd averages only every ``period`` steps),
so the headline is time to accuracy (the first evaluation, every ``--eval-every`` steps on rank 0,
at or above ``--target``; seconds since the start barrier), with throughput beside it. Every
repeat runs every case, the order reversed from repeat to repeat; median (min–max) over repeats.

Bytes are what polytrain counted as sent (payload). With the backend's all-reduce (``builtin``)
the count for allreduce/local-sgd is the ring formula 2(W-1)/W of the vector; with
``--collective ring`` (polytrain's explicit ring, ``--set collective=ring``) every chunk is counted
at its send. Either way, for local-sgd the ratio to allreduce is 1/period by construction (the
same all-reduce of the same vector, every period steps instead of every step), so it is labelled
so and not offered as a measurement.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from harness import alternating, fmt_spread, spread, write_results  # noqa: E402

CASES = [("allreduce", ()), ("local-sgd", ("period=4",)), ("local-sgd", ("period=16",)),
         ("malt", ("graph=halton", "exchange=params"))]


def one(name: str, sets: tuple[str, ...], seed: int, a: argparse.Namespace, out: Path) -> dict[str, Any]:
    import polytrain

    if a.collective == "ring" and name in ("allreduce", "local-sgd"):
        sets = (*sets, "collective=ring")
    s = polytrain.train(strategy=name, procs=a.procs, model="mlp", dataset="digits", steps=a.steps,
                        batch_size=64, optimizer="sgd", lr=0.2, seed=seed, eval_every=a.eval_every,
                        out=str(out), sets=list(sets))
    evals = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"eval"' in x]
    tta = next((e["t"] for e in evals if e["event"] == "eval" and e["accuracy"] >= a.target), None)
    return {"tta_s": tta, "samples_per_s": s["throughput_samples_per_s"], "accuracy": s["eval"]["accuracy"],
            "bytes_per_worker": s["bytes_sent"] / a.procs}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--procs", type=int, default=4)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--target", type=float, default=0.9)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--collective", choices=("builtin", "ring"), default="builtin",
                   help="allreduce/local-sgd: the backend's all-reduce or polytrain's counted ring")
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp())
    runs: dict[str, list[dict[str, Any]]] = {f"{n} {' '.join(s)}".strip(): [] for n, s in CASES}
    for r, (name, sets) in alternating(CASES, a.repeats):
        label = f"{name} {' '.join(sets)}".strip()
        runs[label].append(one(name, sets, r, a, tmp / f"{label.replace(' ', '_')}-{r}"))
        print(label, runs[label][-1], flush=True)
    base = spread([r["bytes_per_worker"] for r in runs["allreduce"]])["median"]
    rows = []
    for label, mine in runs.items():
        reached = [r["tta_s"] for r in mine if r["tta_s"] is not None]
        mb = spread([r["bytes_per_worker"] for r in mine])["median"]
        period = next((int(x.split("=")[1]) for x in label.split() if x.startswith("period=")), None)
        tta = fmt_spread(reached, 2) if reached else "never"
        rows.append({"case": label, f"time to {a.target:.0%} s": tta,
                     "reached": f"{len(reached)}/{len(mine)}",
                     "samples/s": fmt_spread([r["samples_per_s"] for r in mine], 0),
                     "final accuracy": fmt_spread([r["accuracy"] for r in mine], 3),
                     "payload MB per worker": mb / 1e6,
                     "bytes vs allreduce": f"1/{period} (by construction)" if period else f"{mb / base:.3f}"})
    counted = ("every chunk counted at its send by polytrain's ring (collective=ring)"
               if a.collective == "ring" else "the ring all-reduce's 2(W-1)/W of the vector per rank")
    name = "dp_bytes" if a.collective == "builtin" else "dp_bytes_ring"
    write_results(name, rows, list(rows[0]), extra={"repeats": runs},
                  notes=f"mlp on digits, {a.procs} ranks on this machine, batch 64, SGD lr 0.2, {a.steps} "
                        f"steps, seed = repeat, {a.repeats} repeats with the order of the cases reversed "
                        f"every repeat. Time to accuracy: first evaluation at or above {a.target} (every "
                        f"{a.eval_every} steps, rank 0), median (min–max) over the repeats that reached it. "
                        f"Bytes: polytrain's count of payload sent (allreduce, local-sgd: {counted}; "
                        "MALT: one copy per peer, counted at its sends). Measured on the shared 2-vCPU "
                        "development machine with other jobs running (load average in the JSON).")


if __name__ == "__main__":
    main()
