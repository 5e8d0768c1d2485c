"""Consistency models of ``ps`` with a straggler: time per step, staleness, time to accuracy.

    .venv/bin/python benchmarks/ps_consistency.py [--steps 150] [--slow-factor 30]

One server and three workers on this machine (no testbed needed: the straggler, not the network,
is what the consistency models react to). Worker rank 3 computes ``slow_factor`` times slower.
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

from harness import write_results  # noqa: E402

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


def row(label: str, run: Path, summary: dict[str, Any], target: float) -> dict[str, Any]:
    evs = events(run)
    fast = [e["t"] for e in evs if e["event"] == "step" and e["rank"] == 1]
    slow = [e["t"] for e in evs if e["event"] == "step" and e["rank"] == 3]
    tta = next((e["t"] for e in evs if e["event"] == "eval" and e["accuracy"] >= target), None)
    m = summary["strategy_metrics"]
    hist, lag = m["staleness_hist"], m["update_lag_hist"]
    return {"consistency": label, "fast worker step ms": 1000 * (fast[-1] - fast[0]) / (len(fast) - 1),
            "straggler step ms": 1000 * (slow[-1] - slow[0]) / max(1, len(slow) - 1),
            "wall s": summary["wall_s"], f"time to {target:.0%} s": tta,
            "final accuracy": summary["eval"]["accuracy"], "staleness p50": percentile(hist, 0.5),
            "staleness p90": percentile(hist, 0.9), "staleness max": m["staleness_max"],
            "update lag p50": percentile(lag, 0.5), "update lag max": m["update_lag_max"],
            "dropped": m["dropped_gradients"], "staleness hist": hist, "update lag hist": lag}


def main() -> None:
    import polytrain

    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--slow-factor", type=float, default=30.0)
    p.add_argument("--target", type=float, default=0.85)
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp())
    rows = []
    for label, sets in CASES:
        out = tmp / label.replace(" ", "_").replace("=", "")
        s = polytrain.train(strategy="ps", procs=4, model="mlp", dataset="digits", steps=a.steps,
                            batch_size=48, optimizer="sgd", lr=0.2, eval_every=10, out=str(out),
                            sets=["servers=1", "slow_rank=3", f"slow_factor={a.slow_factor}", *sets])
        rows.append(row(label, out, s, a.target))
        print(rows[-1], flush=True)
    hists = "".join(f"| {r['consistency']} | {buckets(r['staleness hist'])} | "
                    f"{buckets(r['update lag hist'])} |\n" for r in rows)
    write_results("ps_consistency", rows, [c for c in rows[0] if not c.endswith("hist")],
                  notes="Histograms, power-of-two buckets (value:count; one entry per accepted push):\n\n"
                        "| consistency | staleness (clocks behind) | update lag (shard updates between "
                        "pull and apply) |\n|---|---|---|\n" + hists + "\n"
                        f"1 server + 3 workers (mlp on digits, batch 48, SGD lr 0.2, {a.steps} steps); "
                        f"worker rank 3 is {a.slow_factor}x slower. Accuracy is evaluated every 10 "
                        "steps by the first worker on its current parameters; time is since the "
                        "start barrier.")


if __name__ == "__main__":
    main()
