"""Start-up and teardown, measured from outside: ``polytrain train --procs 2`` against a minimal
``torchrun`` DDP script (torch, gloo, the bundled digits data, a small CNN), the two alternating.

* start-up: from launching the command to the moment the training loop is about to run step 1
  (polytrain: rank 0's ``start`` event appears in ``ranks/rank0.jsonl``, which is written and
  flushed at once; the script: it prints ``start`` before its first step);
* teardown: from the last sign of training (polytrain: rank 0's final ``eval`` event; the
  script: ``done`` after its last step) to the command's exit.

Goal (issue 49): start-up within 1.2x torchrun's, teardown under 1 s. Both files are polled
every 10 ms, so each figure carries up to 10 ms of polling.

    python benchmarks/startup.py [--repeats 7] [--steps 20]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from harness import alternating, fmt_spread, spread, write_results  # noqa: E402

SCRIPT = '''
import sys
import torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from sklearn.datasets import load_digits

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(1)
d = load_digits()
x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16
y = torch.tensor(d.target)
torch.manual_seed(0)
net = DDP(nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Flatten(),
                        nn.Linear(16 * 64, 64), nn.ReLU(), nn.Linear(64, 10)))
opt = torch.optim.Adam(net.parameters(), lr=1e-3)
steps, b = int(sys.argv[1]), 32
if rank == 0:
    print("start", flush=True)
for i in range(steps):
    idx = torch.arange(i * 2 * b + rank * b, i * 2 * b + (rank + 1) * b) % len(y)
    opt.zero_grad()
    loss = nn.functional.cross_entropy(net(x[idx]), y[idx])
    loss.backward()
    opt.step()
if rank == 0:
    print("done", flush=True)
dist.destroy_process_group()
'''


def _wait_for(proc: subprocess.Popen[str], found: object, poll: float = 0.01) -> float:
    """The clock when ``found()`` first holds (or the process ended)."""
    while not found() and proc.poll() is None:  # type: ignore[operator]
        time.sleep(poll)
    return time.perf_counter()


def _file_has(path: Path, text: str) -> bool:
    try:
        return text in path.read_text()
    except OSError:
        return False


PHASES: list[dict[str, float]] = []  # each polytrain run's start-up trace: phase -> seconds


def _trace(run: Path) -> dict[str, float]:
    """The launcher's and rank 0's marks of ``RUN/startup.jsonl``: phase -> seconds after launch."""
    out = {}
    for line in (run / "startup.jsonl").read_text().splitlines():
        ev = json.loads(line)
        if ev["who"] in ("launcher", "rank0") and ev["since_launch_s"] is not None:
            out.setdefault(f"{ev['who']}: {ev['phase']}", ev["since_launch_s"])
    return out


def run_polytrain(steps: int) -> tuple[float, float]:
    out = Path(tempfile.mkdtemp(prefix="polytrain-startup-")) / "run"
    cmd = [sys.executable, "-m", "polytrain", "train", "--procs", "2", "--steps", str(steps),
           "--no-report", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "POLYTRAIN_REPORT": "0"}
    rank0 = out / "ranks" / "rank0.jsonl"
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            text=True)
    started = _wait_for(proc, lambda: _file_has(rank0, '"event": "start"'))
    last = _wait_for(proc, lambda: _file_has(rank0, '"event": "eval"'))
    proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"polytrain train failed ({proc.returncode})")
    down = time.perf_counter() - last
    PHASES.append(_trace(out))
    shutil.rmtree(out.parent, ignore_errors=True)
    return started - t0, down


def run_torchrun(steps: int) -> tuple[float, float]:
    script = Path(tempfile.mkdtemp(prefix="torchrun-startup-")) / "ddp.py"
    script.write_text(SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(script), str(steps)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    started = last = 0.0
    for line in proc.stdout:
        if line.strip() == "start":
            started = time.perf_counter()
        elif line.strip() == "done":
            last = time.perf_counter()
    proc.wait()
    down = time.perf_counter() - last
    shutil.rmtree(script.parent, ignore_errors=True)
    if proc.returncode != 0 or not started:
        raise RuntimeError(f"torchrun script failed ({proc.returncode})")
    return started - t0, down


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--steps", type=int, default=20)
    a = p.parse_args()
    runs = {"polytrain train": run_polytrain, "torchrun DDP script": run_torchrun}
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in runs}
    for _, name in alternating(list(runs), a.repeats):
        got[name].append(runs[name](a.steps))
    base = spread([s for s, _ in got["torchrun DDP script"]])["median"]
    rows = []
    for name, vals in got.items():
        start, down = [s for s, _ in vals], [d for _, d in vals]
        rows.append({"command": name, "start-up s": fmt_spread(start),
                     "vs torchrun": round(spread(start)["median"] / base, 3),
                     "teardown s": fmt_spread(down), "start-up repeats": start,
                     "teardown repeats": down})
    phases = sorted({k for t in PHASES for k in t}, key=lambda k: statistics.median(
        t[k] for t in PHASES if k in t))
    trace = "| phase (polytrain, startup.jsonl) | seconds after launch |\n|---|---|\n" + "".join(
        f"| {k} | {fmt_spread([t[k] for t in PHASES if k in t])} |\n" for k in phases)
    write_results("startup", rows, ["command", "start-up s", "vs torchrun", "teardown s"],
                  extra={"traces": PHASES}, notes=trace + "\n" + (
        f"Median (min–max) of {a.repeats} runs each, alternating, 2 processes, {a.steps} steps. "
        "Start-up: launch to the loop's first step (polytrain: rank 0's `start` event; the "
        "script: its `start` line). Teardown: polytrain's final `eval` event, or the script's "
        "`done` line, to the command's exit. Goals: start-up <= 1.2x torchrun's, teardown < 1 s. "
        "The phase table: median (min-max) over the polytrain runs of when the launcher and "
        "rank 0 reached each phase of the start-up trace."))


if __name__ == "__main__":
    main()
