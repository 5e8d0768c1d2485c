"""A communication-bound job on the emulated cluster at two link rates (needs root).

    sudo .venv/bin/python benchmarks/testbed_vgg.py [--hosts 4] [--steps 20]

`allreduce` on a VGG-16-shaped model (width 8: ~2 M parameters, 8 MB of gradients per step),
one process per host, at 200 Mbit/s and 1 Gbit/s: the faster link should give measurably higher
throughput. Also records polytrain's counted bytes against the interface counters.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]

from harness import write_results  # noqa: E402


def run(hosts: int, nic: str, steps: int, out: Path) -> dict[str, object]:
    cmd = [sys.executable, "-m", "polytrain", "testbed", "--hosts", str(hosts), "--nic", nic, "--",
           "train", "--strategy", "allreduce", "--model", "vgg16", "--set", "model.width=8",
           "--dataset", "synthetic-images", "--steps", str(steps), "--batch-size", str(16 * hosts),
           "--procs", str(hosts), "--out", str(out), "--no-report"]
    subprocess.run(cmd, check=True, cwd=HERE.parent, capture_output=True, text=True)
    s = json.loads((out / "summary.json").read_text())
    wire = sum(s["testbed"]["wire_bytes_tx"].values())
    return {"hosts": hosts, "nic": nic, "steps": steps, "samples/s": s["throughput_samples_per_s"],
            "wall s": s["wall_s"], "counted MB": s["bytes_sent"] / 1e6, "wire MB": wire / 1e6}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--steps", type=int, default=20)
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp())
    rows = [run(a.hosts, nic, a.steps, tmp / nic) for nic in ("200mbit", "1gbit")]
    rows[1]["speed-up vs 200mbit"] = rows[1]["samples/s"] / rows[0]["samples/s"]  # type: ignore[operator]
    write_results("testbed_vgg", rows, [*rows[0], "speed-up vs 200mbit"],
                  notes="wire MB includes TCP/IP headers and bookkeeping traffic (start-up broadcast, "
                        "result gathering) that polytrain counts apart.")


if __name__ == "__main__":
    main()
