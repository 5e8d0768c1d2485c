"""``zero`` stages 1–3 and ``fsdp`` against ``allreduce`` on the emulated testbed (needs root):
step time, bytes per step from the hosts' interface counters, peak memory per rank.

    sudo .venv/bin/python benchmarks/zero_testbed.py [--hosts 4] [--nic 1gbit] [--steps 22]
        [--short-steps 2] [--repeats 5] [--d-model 128] [--lock FILE]

Each variant trains gpt-mini (4 layers, ``--d-model``) on chars (T 32, 8 samples per rank, Adam)
through ``polytrain testbed --hosts H --nic RATE -- train --procs H`` (one rank per emulated host).
Every repeat runs each variant twice, ``--steps`` and ``--short-steps`` long, the variants (and
the two lengths) alternating, the order reversed every repeat. Bytes per step are the difference
of the two runs' counters over the difference in steps, so what a run sends once (rendezvous,
start-up broadcasts, the final evaluation and the consolidated ``model.pt``) cancels:
``NIC``: the kernel's tx counters of every host (headers included), ``wire``: what the links'
shapers charged, ``payload``: polytrain's own count; all per rank per step. Step time: from the
long run's step events (seconds since the start barrier), the slowest rank's mean over the steps
after the first two. Peak memory: each rank's process RSS peak (``peak_rss_bytes``). Each launch
holds the lock file ``--lock`` (``flock``; default ``$TESTBED_LOCK``), so testbed runs on one
machine never overlap.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

from harness import alternating, fmt_spread, write_results  # noqa: E402

VARIANTS: dict[str, list[str]] = {
    "allreduce": ["--strategy", "allreduce"],
    "zero-1": ["--strategy", "zero", "--set", "stage=1"],
    "zero-2": ["--strategy", "zero", "--set", "stage=2"],
    "zero-3": ["--strategy", "zero", "--set", "stage=3"],
    "fsdp": ["--strategy", "fsdp"],
}
WARM = 2  # steps left out of the step time


def run(variant: str, steps: int, a: argparse.Namespace, out: Path) -> dict[str, Any]:
    lock = ["flock", a.lock] if a.lock else []  # one testbed at a time on this machine
    cmd = [*lock, sys.executable, "-m", "polytrain", "testbed", "--hosts", str(a.hosts), "--nic", a.nic,
           "--", "train", *VARIANTS[variant], "--model", "gpt-mini", "--set", "model.n_layer=4",
           "--set", f"model.d_model={a.d_model}", "--dataset", "chars", "--set", "data.seq_len=32",
           "--set", "data.chars=20000", "--optimizer", "adam", "--lr", "1e-3", "--seed", "0",
           "--batch-size", str(8 * a.hosts), "--steps", str(steps), "--procs", str(a.hosts),
           "--out", str(out), "--no-report"]
    p = subprocess.run(cmd, cwd=HERE.parent, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"{variant} failed:\n{' '.join(cmd)}\n{p.stderr[-3000:]}")
    s = json.loads((out / "summary.json").read_text())
    events = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    t: dict[int, dict[int, float]] = {}
    for e in events:
        if e["event"] == "step":
            t.setdefault(e["rank"], {})[e["step"]] = e["t"]
    step_s = max((ts[steps] - ts[WARM]) / (steps - WARM) for ts in t.values()) if steps > WARM else None
    tb = s["testbed"]
    return {"variant": variant, "steps": steps, "step_s": step_s,
            "nic": sum(tb["nic_bytes_tx"].values()), "wire": sum(tb["wire_bytes_tx"].values()),
            "payload": s["bytes_sent"],
            "peak_rss": [r["peak_rss_bytes"] for r in s["per_rank"]],
            "bytes_by_op": s["per_rank"][0]["bytes_by_op"],
            "held": s.get("strategy_metrics", {}).get("held_bytes")}


def per_step(runs: list[dict[str, Any]], key: str, a: argparse.Namespace) -> list[float]:
    """MB of ``key`` per rank per step, one value per repeat: long run minus short run."""
    longs = [r for r in runs if r["steps"] == a.steps]
    shorts = [r for r in runs if r["steps"] == a.short_steps]
    n = (a.steps - a.short_steps) * a.hosts  # rank-steps between the two lengths
    return [(lo[key] - sh[key]) / n / 1e6 for lo, sh in zip(longs, shorts, strict=True)]


def row(variant: str, runs: list[dict[str, Any]], a: argparse.Namespace,
        base: float | None) -> dict[str, Any]:
    longs = [r for r in runs if r["steps"] == a.steps]
    nic = per_step(runs, "nic", a)
    return {"variant": variant, "step ms": fmt_spread([r["step_s"] * 1e3 for r in longs], 1),
            "NIC MB/step/rank": fmt_spread(nic, 3),
            "wire MB/step/rank": fmt_spread(per_step(runs, "wire", a), 3),
            "payload MB/step/rank": fmt_spread(per_step(runs, "payload", a), 3),
            "NIC / allreduce NIC": round(statistics.median(nic) / base, 3) if base else "-",
            "peak RSS MB/rank": fmt_spread([m / 1e6 for r in longs for m in r["peak_rss"]], 0)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--nic", default="1gbit")
    p.add_argument("--steps", type=int, default=22)
    p.add_argument("--short-steps", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--lock", default=os.environ.get("TESTBED_LOCK", ""),
                   help="each launch holds this lock file (flock), shared with the machine's other "
                        "testbed users (default: $TESTBED_LOCK; none: no lock)")
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp())
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in a.variants}
    jobs = [(v, n) for v in a.variants for n in (a.steps, a.short_steps)]
    for r, (v, n) in alternating(jobs, a.repeats):
        runs[v].append(run(v, n, a, tmp / f"{v}-{n}-{r}"))
        print(json.dumps(runs[v][-1]), flush=True)
    base = statistics.median(per_step(runs["allreduce"], "nic", a)) if "allreduce" in runs else None
    rows = [row(v, runs[v], a, base) for v in a.variants]
    suffix = "" if a.variants == list(VARIANTS) else "_" + "_".join(a.variants)
    write_results(f"zero_testbed_{a.nic}{suffix}", rows, list(rows[0]), extra={"repeats": runs}, notes=(
        f"{a.hosts} emulated hosts, one rank each, links shaped to {a.nic} (tc tbf); gpt-mini "
        f"(d_model {a.d_model}, 4 layers) on chars (T 32), Adam, 8 samples per rank per step, "
        f"{a.repeats} repeats, each variant at {a.steps} and at {a.short_steps} steps, alternating, "
        "the order reversed every repeat; median (min–max). MB/step/rank: the difference between "
        "the long and the short run's counts over the steps between them, per rank (NIC: the "
        "hosts' kernel tx counters, headers included; wire: what the shapers charged; payload: "
        "polytrain's count). step ms: the long run's slowest rank, mean over the steps after the "
        f"first {WARM}. peak RSS: every rank's process RSS peak in the long runs. Measured on the "
        "shared 2-vCPU development machine with other jobs running (load average in the JSON)."))


if __name__ == "__main__":
    main()
