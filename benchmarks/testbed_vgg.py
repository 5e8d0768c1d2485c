"""A communication-bound job on the emulated cluster at two link rates (needs root).

    sudo .venv/bin/python benchmarks/testbed_vgg.py [--hosts 4] [--steps 20] [--repeats 5]

`allreduce` on a VGG-16-shaped model (width 8: ~2.0 M parameters, 76% of them in fc1, ~8 MB of
gradients per step), one process per host, at 200 Mbit/s and 1 Gbit/s: the faster link should give
measurably higher throughput. Also records polytrain's counted bytes against the interface
counters (the bytes really sent on the emulated wire, TCP/IP headers included).

The two link rates alternate, the order reversed every repeat (``--repeats``, default 5); the
results give median (min–max) of each, the 1 Gbit/s / 200 Mbit/s speed-up paired within a repeat,
and every repeat's values in the JSON.
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
sys.path[:0] = [str(HERE)]

from harness import alternating, fmt_spread, write_results  # noqa: E402

NICS = ("200mbit", "1gbit")


def run(hosts: int, nic: str, steps: int, out: Path) -> dict[str, float]:
    """One training run on ``hosts`` emulated hosts linked at ``nic``: its throughput and bytes."""
    cmd = [sys.executable, "-m", "polytrain", "testbed", "--hosts", str(hosts), "--nic", nic, "--",
           "train", "--strategy", "allreduce", "--model", "vgg16", "--set", "model.width=8",
           "--dataset", "synthetic-images", "--steps", str(steps), "--batch-size", str(16 * hosts),
           "--procs", str(hosts), "--out", str(out), "--no-report"]
    done = subprocess.run(cmd, cwd=HERE.parent, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"testbed_vgg: the run at {nic} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    s = json.loads((out / "summary.json").read_text())
    wire = sum(s["testbed"]["wire_bytes_tx"].values())
    return {"samples/s": float(s["throughput_samples_per_s"]), "wall s": float(s["wall_s"]),
            "counted MB": s["bytes_sent"] / 1e6, "wire MB": wire / 1e6}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    if a.repeats < 1 or a.steps < 1 or a.hosts < 2:
        sys.exit("testbed_vgg: need --repeats >= 1, --steps >= 1 and --hosts >= 2")
    tmp = Path(tempfile.mkdtemp())
    runs: dict[str, list[dict[str, float]]] = {nic: [] for nic in NICS}
    for r, nic in alternating(NICS, a.repeats):
        runs[nic].append(run(a.hosts, nic, a.steps, tmp / f"{nic}-{r}"))
        print(r, nic, runs[nic][-1], flush=True)
    speedup = [fast["samples/s"] / slow["samples/s"] for slow, fast in zip(*runs.values(), strict=True)]
    rows: list[dict[str, Any]] = []
    for nic in NICS:
        rows.append({"hosts": a.hosts, "nic": nic, "steps": a.steps, "repeats": a.repeats,
                     **{k: fmt_spread([x[k] for x in runs[nic]], 1 if k != "wall s" else 2)
                        for k in ("samples/s", "wall s", "counted MB", "wire MB")},
                     "wire / counted": fmt_spread([x["wire MB"] / x["counted MB"] for x in runs[nic]])})
    rows[1]["1gbit / 200mbit (paired)"] = fmt_spread(speedup, 2)
    write_results("testbed_vgg", rows, [*rows[0], "1gbit / 200mbit (paired)"],
                  extra={"repeats": runs, "speedup_per_repeat": speedup},
                  notes=f"{a.repeats} repeats, the two link rates alternating (order reversed every "
                        "repeat); median (min–max); the speed-up is paired within a repeat. Every "
                        "emulated host shares this machine's cores. wire MB: the hosts' interface "
                        "counters, which include TCP/IP headers and bookkeeping traffic (start-up "
                        "broadcast, result gathering) that polytrain counts apart.")


if __name__ == "__main__":
    main()
