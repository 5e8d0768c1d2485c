"""PipeDream vs data parallelism on slow links: time to accuracy, throughput, bytes on the wire
(needs root for the testbed).

    sudo .venv/bin/python benchmarks/pipeline_testbed.py [--hosts 4] [--nic 100mbit] [--steps 200]
        [--target 0.85] [--repeats 5]

The source (seed 003, PipeDream) trains on hosts joined by slow links: pipelining sends only the
activations at the cuts, where data parallelism exchanges every gradient each step; its headline
is time to a target accuracy. Here: an `mlp` (3 hidden layers of 512, ~0.56 M parameters) on the
digits, a job that learns, one process per emulated host, `allreduce` vs `pipedream` with the
planner's partition for this link (`partition=auto`, `link_gbps` = the link rate), same global
batch, steps, optimizer and seed. Time to accuracy is the first evaluation (every
``--eval-every`` steps, rank 0, seconds since the start barrier) at or above ``--target``;
throughput counts the training steps. Bytes: polytrain's payload count beside the kernel's
interface counters of every emulated host (``nic``: tx_bytes, headers included) and what the
links' shapers charged (``wire``), read before and after each run by ``polytrain testbed``.
The two strategies alternate, the order reversed every repeat.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

from harness import alternating, fmt_spread, spread, write_results  # noqa: E402

STRATEGIES = ["allreduce", "pipedream"]


def gbps(rate: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(k|m|g)bit", rate)
    if m is None:
        raise SystemExit(f"--nic {rate}: expected e.g. 100mbit or 1gbit")
    return float(m[1]) * {"k": 1e-6, "m": 1e-3, "g": 1.0}[m[2]]


def run(strategy: str, seed: int, a: argparse.Namespace, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "polytrain", "testbed", "--hosts", str(a.hosts), "--nic", a.nic, "--",
           "train", "--strategy", strategy, "--model", "mlp", "--set", "model.depth=3",
           "--set", f"model.hidden={a.hidden}", "--dataset", "digits", "--steps", str(a.steps),
           "--batch-size", str(a.batch_size), "--optimizer", a.optimizer, "--lr", str(a.lr),
           "--seed", str(seed), "--eval-every", str(a.eval_every), "--procs", str(a.hosts),
           "--out", str(out), "--no-report"]
    if strategy == "pipedream":
        cmd += ["--set", "partition=auto", "--set", f"link_gbps={gbps(a.nic)}"]
    p = subprocess.run(cmd, cwd=HERE.parent, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"{strategy} failed:\n{p.stderr[-3000:]}")
    s = json.loads((out / "summary.json").read_text())
    evals = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"eval"' in x]
    tta = next((e["t"] for e in evals if e["event"] == "eval" and e["accuracy"] >= a.target), None)
    tb, m = s["testbed"], s.get("strategy_metrics", {})
    return {"strategy": strategy, "seed": seed, "tta_s": tta, "samples_per_s": s["throughput_samples_per_s"],
            "accuracy": s["eval"]["accuracy"], "samples": s["samples"],
            "payload_bytes": s["bytes_sent"], "nic_bytes": sum(tb["nic_bytes_tx"].values()),
            "wire_bytes": sum(tb["wire_bytes_tx"].values()),
            "partition": m.get("partition", {}).get("text", "-")}


def row(strategy: str, runs: list[dict[str, Any]], target: float) -> dict[str, Any]:
    reached = [r["tta_s"] for r in runs if r["tta_s"] is not None]
    per = {k: spread([r[k] / r["samples"] for r in runs])["median"]
           for k in ("payload_bytes", "nic_bytes", "wire_bytes")}
    return {"strategy": strategy, "partition": runs[0]["partition"],
            f"time to {target:.0%} s": fmt_spread(reached, 2) if reached else "never",
            "reached": f"{len(reached)}/{len(runs)}",
            "samples/s": fmt_spread([r["samples_per_s"] for r in runs], 0),
            "final accuracy": fmt_spread([r["accuracy"] for r in runs], 3),
            "payload B/sample": round(per["payload_bytes"]), "NIC tx B/sample": round(per["nic_bytes"]),
            "wire B/sample": round(per["wire_bytes"]),
            "NIC / payload": round(per["nic_bytes"] / per["payload_bytes"], 3)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--nic", default="100mbit")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--optimizer", default="sgd")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--target", type=float, default=0.85)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp())
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in STRATEGIES}
    for r, strategy in alternating(STRATEGIES, a.repeats):
        runs[strategy].append(run(strategy, r, a, tmp / f"{strategy}-{r}"))
        print(runs[strategy][-1], flush=True)
    rows = [row(s, runs[s], a.target) for s in STRATEGIES]
    write_results(f"pipeline_testbed_{a.nic}", rows, list(rows[0]), extra={"repeats": runs},
                  notes=f"{a.hosts} emulated hosts, one process each, links shaped to {a.nic}; mlp "
                        f"(3 x {a.hidden}) on digits, global batch {a.batch_size}, {a.steps} steps, "
                        f"{a.optimizer} lr {a.lr}, seed = repeat, {a.repeats} repeats, the order of the "
                        "strategies reversed every repeat. Time to accuracy: first evaluation at or above "
                        f"{a.target} (every {a.eval_every} steps, seconds since the start barrier), median "
                        "(min–max) over the repeats that reached it. payload: polytrain's count of bytes "
                        "sent by all ranks; NIC tx: the hosts' kernel interface counters (headers "
                        "included); wire: what the links' shapers charged. Measured on the shared 2-vCPU "
                        "development machine with other jobs running (load average in the JSON).")


if __name__ == "__main__":
    main()
