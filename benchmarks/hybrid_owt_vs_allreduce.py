"""`owt` (conv data-parallel, FC model-parallel) vs `allreduce` (everything data-parallel) on a
VGG-16-shaped and an AlexNet-shaped model: training bytes per sample and throughput.

    python benchmarks/hybrid_owt_vs_allreduce.py [--procs 2,4] [--steps 20] [--batch 64]
    sudo .venv/bin/python benchmarks/hybrid_owt_vs_allreduce.py --testbed --nic 1gbit --procs 2,4

Without --testbed the ranks share this machine's loopback; with it, one rank per emulated host
behind a shaped NIC (``polytrain testbed``), where the bytes saved turn into time. Training bytes
leave out evaluation traffic (``eval_*``) and the final model gather (``gather_model``). The
source (Krizhevsky 2014) reports a 6.16x speed-up on 8 GPUs; the ratio depends on the link, the
batch and how much of the model its FC layers hold.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

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
        out: Path) -> dict[str, object]:
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
    return {"samples/s": s["throughput_samples_per_s"],
            "train bytes/sample": training_bytes(s) / max(1, s["samples"]),
            "conv params": (s["strategy_metrics"] or {}).get("conv_parameters"),
            "fc params": (s["strategy_metrics"] or {}).get("fc_parameters")}


def main() -> None:
    from harness import write_results

    p = argparse.ArgumentParser()
    p.add_argument("--procs", default="2,4", help="comma-separated world sizes")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--testbed", action="store_true")
    p.add_argument("--nic", default="1gbit")
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp())
    rows = []
    for procs in (int(w) for w in a.procs.split(",")):
        for label, model, sets in CASES:
            ar = run("allreduce", model, sets, procs, a, tmp / f"{model}-ar{procs}")
            owt = run("owt", model, sets, procs, a, tmp / f"{model}-owt{procs}")
            fc, conv = owt["fc params"], owt["conv params"]
            rows.append({"model": label, "procs": procs, "link": a.nic if a.testbed else "loopback",
                         "allreduce samples/s": ar["samples/s"], "owt samples/s": owt["samples/s"],
                         "speed-up": owt["samples/s"] / ar["samples/s"],  # type: ignore[operator]
                         "allreduce bytes/sample": ar["train bytes/sample"],
                         "owt bytes/sample": owt["train bytes/sample"],
                         "bytes ratio": ar["train bytes/sample"] / owt["train bytes/sample"],  # type: ignore[operator]
                         "FC share of params": fc / (conv + fc)})  # type: ignore[operator]
    name = f"hybrid_owt_vs_allreduce_testbed_{a.nic}" if a.testbed else "hybrid_owt_vs_allreduce"
    write_results(name, rows, list(rows[0]),
                  notes=f"Global batch {a.batch}, {a.steps} steps, SGD; synthetic-images 3x32x32. "
                        "Bytes: sent by all ranks in training (all-reduce counted as a ring sends it).")


if __name__ == "__main__":
    main()
