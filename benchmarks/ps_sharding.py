"""Layer- vs size-based parameter sharding on a VGG-16-shaped model (the experiment of seed 002),
on the emulated cluster: one server per two workers, every rank on its own host (needs root).

    sudo .venv/bin/python benchmarks/ps_sharding.py [--workers 2,4,8] [--nic 100mbit] [--steps 8]
        [--repeats 5]

002 measured (VGG-16, 10 GbE, TF 1.15): equal at 1-2 workers (one server, so one plan), size-based
+20 % at 4 workers, +66 % at 8. Here: ``vgg16`` at width 8 (2.0 M parameters, fc1 = 76 %,
the same shape), ``ps`` with ``consistency=bsp``, 2 samples per worker per step. Time per step
is measured on the first worker's step events after the first step (start-up excluded).
``--threads 1`` (default) gives each rank one torch thread: all emulated hosts share this
machine's cores, and with polytrain's default (cores / local ranks = all cores per host) the
ranks oversubscribe them and the run measures CPU contention instead of the network.
The two plans alternate, the order reversed every repeat; median (min–max) over the repeats,
and size / layer paired within a repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

from harness import alternating, fmt_spread, write_results  # noqa: E402


def step_seconds(run: Path, rank: int) -> float:
    """Mean time per step of ``rank`` from its first to its last-but-one step (its step events'
    clock): the first includes start-up, the last has no pull."""
    ts = [e["t"] for e in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
          if e["event"] == "step" and e["rank"] == rank]
    return (ts[-2] - ts[0]) / (len(ts) - 2)


def run(workers: int, sharding: str, nic: str, steps: int, per_worker: int, out: Path,
        width: int, consistency: str, threads: int) -> dict[str, Any]:
    servers = max(1, workers // 2)
    procs = servers + workers
    cmd = [sys.executable, "-m", "polytrain", "testbed", "--hosts", str(procs), "--nic", nic, "--",
           "train", "--strategy", "ps", "--procs", str(procs), "--model", "vgg16",
           "--set", f"model.width={width}", "--dataset", "synthetic-images", "--steps", str(steps),
           "--batch-size", str(per_worker * workers), "--optimizer", "sgd", "--lr", "0.01",
           "--set", f"servers={servers}", "--set", f"sharding={sharding}",
           "--set", f"consistency={consistency}", "--out", str(out), "--no-report"]
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    done = subprocess.run(cmd, cwd=HERE.parent, capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    s = json.loads((out / "summary.json").read_text())
    m = s["strategy_metrics"]
    step_s = step_seconds(out, servers)
    return {"workers": workers, "servers": servers, "sharding": sharding, "nic": nic,
            "step s": step_s, "samples/s": per_worker * workers / step_s,
            "server params": "/".join(str(p) for p in m["server_params"]),
            "server MB": "/".join(f"{b / 1e6:.0f}" for b in m["server_bytes"]),
            "server busy s": "/".join(f"{b:.1f}" for b in m["server_busy_s"])}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workers", default="2,4,8")
    p.add_argument("--nic", default="100mbit")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--per-worker", type=int, default=2)
    p.add_argument("--width", type=int, default=8)
    p.add_argument("--consistency", default="bsp")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (0: polytrain's default)")
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp())
    rows: list[dict[str, Any]] = []
    raw: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for w in (int(x) for x in a.workers.split(",")):
        runs: dict[str, list[dict[str, Any]]] = {"layer": [], "size": []}
        for r, sharding in alternating(["layer", "size"], a.repeats):
            runs[sharding].append(run(w, sharding, a.nic, a.steps, a.per_worker, tmp / f"{w}-{sharding}{r}",
                                      a.width, a.consistency, a.threads))
            print(runs[sharding][-1], flush=True)
        raw[f"workers={w}"] = runs
        paired = [s["samples/s"] / lay["samples/s"]
                  for lay, s in zip(runs["layer"], runs["size"], strict=True)]
        for sharding, rs in runs.items():
            rows.append({**{k: rs[0][k] for k in ("workers", "servers", "sharding", "nic")},
                         "step s": fmt_spread([x["step s"] for x in rs], 3),
                         "samples/s": fmt_spread([x["samples/s"] for x in rs], 1),
                         "size / layer": fmt_spread(paired, 2) if sharding == "size" else "",
                         **{k: rs[0][k] for k in ("server params", "server MB", "server busy s")}})
    name = f"ps_sharding_{a.nic}_w{a.workers.replace(',', '-')}"
    name += "" if a.threads == 1 else f"_threads{a.threads}"
    write_results(name, rows, list(rows[0]), extra={"repeats": raw},
                  notes=f"{a.steps} steps, {a.per_worker} samples per worker per step, vgg16 width "
                        f"{a.width}; "
                        f"{a.repeats} repeats, the plans alternating; median (min–max); size / layer "
                        "paired within a repeat. 002 (VGG-16, 10 GbE): size/layer = 1.0 at 2 workers, "
                        "1.20 at 4, 1.66 at 8. server MB: sent + received per server; server busy s: wall "
                        "time spent receiving a push or handling a message (pushes are received "
                        "concurrently); both of the first repeat (per-repeat values in the JSON).")

if __name__ == "__main__":
    main()
