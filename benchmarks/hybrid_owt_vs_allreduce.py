"""`owt` (conv data-parallel, FC model-parallel) vs `allreduce` (everything data-parallel) on a
VGG-16-shaped and an AlexNet-shaped model: training bytes per sample and throughput.

    python benchmarks/hybrid_owt_vs_allreduce.py [--procs 2,4] [--steps 20] [--batch 64] [--repeats 5]
        [--models vgg16,alexnet]
    sudo .venv/bin/python benchmarks/hybrid_owt_vs_allreduce.py --testbed --nic 1gbit --procs 2

Without --testbed the ranks share this machine's loopback; with it, one rank per emulated host
behind a shaped NIC (``polytrain testbed``), where the bytes saved turn into time, and the bytes
that really crossed the emulated links are read from each host's interface counters (``NIC tx``,
headers included, the whole run: start-up, training, evaluation and the final gather) beside
polytrain's payload count. Training payload bytes leave out evaluation traffic (``eval_*``) and the
final model gather (``gather_model``). The two strategies alternate, the order reversed every
repeat; median (min–max). Both sides are the same job with the same optimizer, so the ratio of
bytes is a measurement of the two exchange patterns, not a speed-up.
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
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(HERE)]

CASES = [
    ("VGG-16 shape (width 8)", "vgg16", ["model.width=8"]),
    ("AlexNet shape (width 24)", "alexnet", ["model.width=24"]),
]


def training_bytes(summary: dict[str, object]) -> int:
    total = 0
    for rec in summary["per_rank"]:  # type: ignore[attr-defined]
        total += sum(v for k, v in rec["bytes_by_op"].items()
                     if not k.startswith("eval_") and k != "gather_model")
    return total


def run(strategy: str, model: str, sets: list[str], procs: int, a: argparse.Namespace,
        out: Path) -> dict[str, Any]:
    args = ["train", "--strategy", strategy, "--model", model, "--dataset", "synthetic-images",
            "--steps", str(a.steps), "--batch-size", str(a.batch), "--procs", str(procs),
            "--optimizer", "sgd", "--lr", "0.01", "--out", str(out), "--no-report"]
    for s in sets:
        args += ["--set", s]
    cmd = [sys.executable, "-m", "polytrain"]
    if a.testbed:
        cmd += ["testbed", "--hosts", str(procs), "--nic", a.nic, "--"]
    subprocess.run(cmd + args, check=True, cwd=ROOT, capture_output=True, text=True)
    s = json.loads((out / "summary.json").read_text())
    nic = sum(s["testbed"]["nic_bytes_tx"].values()) if a.testbed else None
    return {"samples/s": s["throughput_samples_per_s"],
            "train bytes/sample": training_bytes(s) / max(1, s["samples"]),
            "all payload bytes": s["bytes_sent"], "nic bytes": nic,
            "conv params": (s["strategy_metrics"] or {}).get("conv_parameters"),
            "fc params": (s["strategy_metrics"] or {}).get("fc_parameters")}


def main() -> None:
    from harness import alternating, fmt_spread, spread, write_results

    p = argparse.ArgumentParser()
    p.add_argument("--procs", default="2,4", help="comma-separated world sizes")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--models", default="vgg16,alexnet")
    p.add_argument("--testbed", action="store_true")
    p.add_argument("--nic", default="1gbit")
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp())
    rows, raw = [], {}
    for procs in (int(w) for w in a.procs.split(",")):
        for label, model, sets in [c for c in CASES if c[1] in a.models.split(",")]:
            runs: dict[str, list[dict[str, Any]]] = {"allreduce": [], "owt": []}
            for r, strategy in alternating(["allreduce", "owt"], a.repeats):
                out = tmp / f"{model}-{strategy}{procs}-{r}"
                runs[strategy].append(run(strategy, model, sets, procs, a, out))
                print(strategy, procs, model, runs[strategy][-1], flush=True)
            raw[f"{model} procs={procs}"] = runs
            ar, owt = runs["allreduce"], runs["owt"]
            fc, conv = owt[0]["fc params"], owt[0]["conv params"]
            row = {"model": label, "procs": procs, "link": a.nic if a.testbed else "loopback",
                   "allreduce samples/s": fmt_spread([x["samples/s"] for x in ar], 1),
                   "owt samples/s": fmt_spread([x["samples/s"] for x in owt], 1),
                   "allreduce payload B/sample": ar[0]["train bytes/sample"],
                   "owt payload B/sample": owt[0]["train bytes/sample"],
                   "payload ratio": ar[0]["train bytes/sample"] / owt[0]["train bytes/sample"]}
            if a.testbed:
                med = {k: spread([x["nic bytes"] / x["all payload bytes"] for x in runs[k]])["median"]
                       for k in runs}
                row["NIC tx / payload (allreduce, owt)"] = f"{med['allreduce']:.3f}, {med['owt']:.3f}"
                row["NIC tx ratio"] = (spread([x["nic bytes"] for x in ar])["median"]
                                       / spread([x["nic bytes"] for x in owt])["median"])
            row["FC share of params"] = fc / (conv + fc)
            rows.append(row)
    name = f"hybrid_owt_vs_allreduce_testbed_{a.nic}" if a.testbed else "hybrid_owt_vs_allreduce"
    write_results(name, rows, list(rows[0]), extra={"repeats": raw},
                  notes=f"Global batch {a.batch}, {a.steps} steps, SGD; synthetic-images 3x32x32; "
                        f"{a.repeats} repeats, the strategies alternating. payload: bytes polytrain "
                        "counted as sent by all ranks in training (all-reduce counted as the ring sends "
                        "it). NIC tx: the emulated hosts' kernel interface counters over the whole run "
                        "(headers, start-up, evaluation and the final gather included), read before "
                        "and after it. Measured on the shared 2-vCPU development machine with other "
                        "jobs running (load average in the JSON).")


if __name__ == "__main__":
    main()
