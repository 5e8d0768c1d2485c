"""Consistency models of ``ps`` with a straggler: time per step, staleness, time to accuracy.

    .venv/bin/python benchmarks/ps_consistency.py [--steps 150] [--slow-factor 30] [--repeats 5]

One server and three workers on this machine (no testbed needed: the straggler, not the network,
is what the consistency models react to). Worker rank 3 computes ``slow_factor`` times slower.
The consistency models differ in statistical efficiency, so the headline is time to a target
accuracy (the first evaluation at or above it), with throughput beside it. Every repeat runs every
model, the order reversed from repeat to repeat; the table gives the median (min–max) over repeats
and the JSON keeps each repeat's values.
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

CASES = [("bsp", []), ("ssp s=2", ["consistency=ssp", "staleness=2"]), ("async", ["consistency=async"]),
         ("k-of-n k=2", ["consistency=k-of-n", "k=2"])]


def events(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def buckets(hist: dict[str, int]) -> str:
    """A histogram {staleness: count} in power-of-two buckets: ``0:152 1:2 2-3:9 4-7:16 ...``."""
    out: dict[str, int] = {}
    for k, n in hist.items():
        v = int(k)
        lo = 0 if v == 0 else 1 << (v.bit_length() - 1)
        hi = 2 * lo - 1 if lo else 0
        key = str(lo) if lo == hi else f"{lo}-{hi}"
        out[key] = out.get(key, 0) + n
    return " ".join(f"{k}:{n}" for k, n in out.items())


def percentile(hist: dict[str, int], q: float) -> int:
    values = sorted(int(k) for k, n in hist.items() for _ in range(n))
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0


def one(label: str, run: Path, summary: dict[str, Any], target: float) -> dict[str, Any]:
    """One run's figures (the per-repeat values the table summarises)."""
    evs = events(run)
    fast = [e["t"] for e in evs if e["event"] == "step" and e["rank"] == 1]
    slow = [e["t"] for e in evs if e["event"] == "step" and e["rank"] == 3]
    tta = next((e["t"] for e in evs if e["event"] == "eval" and e["accuracy"] >= target), None)
    m = summary["strategy_metrics"]
    return {"consistency": label, "tta_s": tta, "samples_per_s": summary["throughput_samples_per_s"],
            "fast_step_ms": 1000 * (fast[-1] - fast[0]) / (len(fast) - 1),
            "straggler_step_ms": 1000 * (slow[-1] - slow[0]) / max(1, len(slow) - 1),
            "wall_s": summary["wall_s"], "accuracy": summary["eval"]["accuracy"],
            "staleness_max": m["staleness_max"], "dropped": m["dropped_gradients"],
            "staleness_hist": m["staleness_hist"], "update_lag_hist": m["update_lag_hist"]}


def row(label: str, runs: list[dict[str, Any]], target: float) -> dict[str, Any]:
    """Median (min–max) over the repeats; a repeat that never reached the target is counted."""
    reached = [r["tta_s"] for r in runs if r["tta_s"] is not None]
    hist, lag = runs[0]["staleness_hist"], runs[0]["update_lag_hist"]
    return {"consistency": label, "repeats": len(runs),
            f"time to {target:.0%} s": fmt_spread(reached, 2) if reached else "never",
            "reached": f"{len(reached)}/{len(runs)}",
            "samples/s": fmt_spread([r["samples_per_s"] for r in runs], 0),
            "final accuracy": fmt_spread([r["accuracy"] for r in runs], 3),
            "fast worker step ms": round(spread([r["fast_step_ms"] for r in runs])["median"], 1),
            "straggler step ms": round(spread([r["straggler_step_ms"] for r in runs])["median"], 1),
            "staleness p50": percentile(hist, 0.5), "staleness p90": percentile(hist, 0.9),
            "staleness max": max(r["staleness_max"] for r in runs),
            "dropped": spread([r["dropped"] for r in runs])["median"],
            "staleness hist": hist, "update lag hist": lag}


def main() -> None:
    import polytrain

    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--slow-factor", type=float, default=30.0)
    p.add_argument("--target", type=float, default=0.85)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp())
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in CASES}
    for r, (label, sets) in alternating(CASES, a.repeats):
        out = tmp / f"{label.replace(' ', '_').replace('=', '')}-{r}"
        s = polytrain.train(strategy="ps", procs=4, model="mlp", dataset="digits", steps=a.steps,
                            batch_size=48, optimizer="sgd", lr=0.2, eval_every=10, out=str(out), seed=r,
                            sets=["servers=1", "slow_rank=3", f"slow_factor={a.slow_factor}", *sets])
        runs[label].append(one(label, out, s, a.target))
        print({k: v for k, v in runs[label][-1].items() if not k.endswith("hist")}, flush=True)
    rows = [row(label, runs[label], a.target) for label, _ in CASES]
    hists = "".join(f"| {r['consistency']} | {buckets(r['staleness hist'])} | "
                    f"{buckets(r['update lag hist'])} |\n" for r in rows)
    write_results("ps_consistency", rows, [c for c in rows[0] if not c.endswith("hist")],
                  extra={"repeats": runs},
                  notes="Histograms of the first repeat, power-of-two buckets (value:count; one entry per "
                        "accepted push):\n\n"
                        "| consistency | staleness (clocks behind) | update lag (shard updates between "
                        "pull and apply) |\n|---|---|---|\n" + hists + "\n"
                        f"1 server + 3 workers (mlp on digits, batch 48, SGD lr 0.2, {a.steps} steps, "
                        f"seed = repeat); worker rank 3 is {a.slow_factor}x slower. Time to accuracy: "
                        "the first evaluation (every 10 steps, by the first worker on its current "
                        "parameters) at or above the target, seconds since the start barrier, median "
                        "(min–max) over the repeats that reached it. samples/s: the run's throughput "
                        "over its training steps. The order of the models alternates between repeats. "
                        "Measured on the shared 2-vCPU development machine (other jobs running; load "
                        "average in the JSON).")


if __name__ == "__main__":
    main()
