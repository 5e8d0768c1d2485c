"""How long the local launcher takes to act on each fault (the README's reliability table).

    .venv/bin/python benchmarks/fault_times.py [--repeats 5] [--timeout 5]

A 2-rank `polytrain train` (allreduce, mlp, endless steps, --timeout T) is started; once both
ranks train, one fault is injected and the time until the job has acted is measured:

* ``kill -9 rank 1``: until the launcher exits (it names the rank, the survivor is killed);
* ``SIGSTOP rank 1``: until the launcher exits (rank 0 times out after T s and the stopped rank
  is killed at once);
* ``SIGTERM launcher``: until the launcher exits, every rank stopped at one step after a
  checkpoint (``--checkpoint-every`` large: the stop writes it);
* ``kill -9 launcher``: until no rank is alive (parent-death signal).

The probes alternate (one of each per repeat, the order reversed every other repeat).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from polytrain.launch.agent import process_state

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from harness import alternating, fmt_spread, spread, write_results  # noqa: E402

PROBES = ["kill -9 rank 1", "SIGSTOP rank 1", "SIGTERM launcher", "kill -9 launcher"]


def _alive(pid: int) -> bool:
    state = process_state(pid)
    return state is not None and state not in ("Z", "X")


def _pids(run: Path, timeout: float = 180) -> list[int]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        pids = []
        for rank in (0, 1):
            path = run / "ranks" / f"rank{rank}.jsonl"
            lines = path.read_text().splitlines() if path.exists() else []
            evs = [json.loads(x) for x in lines if x.endswith("}")]
            if sum(e["event"] == "step" for e in evs) >= 3:
                pids.append(next(e["pid"] for e in evs if e["event"] == "process"))
        if len(pids) == 2:
            return pids
        time.sleep(0.1)
    raise SystemExit(f"{run}: the ranks never trained")


def probe(name: str, work: Path, timeout: float) -> dict[str, Any]:
    run = work / f"run-{time.monotonic_ns()}"
    extra = ["--checkpoint-every", "1000000"] if name == "SIGTERM launcher" else []
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    proc = subprocess.Popen([sys.executable, "-m", "polytrain", "train", "--model", "mlp", "--procs",
                             "2", "--steps", "100000000", "--timeout", str(timeout), "--out", str(run),
                             "--no-report", *extra], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        pids = _pids(run)
        t0 = time.monotonic()
        if name == "kill -9 rank 1":
            os.kill(pids[1], signal.SIGKILL)
        elif name == "SIGSTOP rank 1":
            os.kill(pids[1], signal.SIGSTOP)
        elif name == "SIGTERM launcher":
            proc.send_signal(signal.SIGTERM)
        else:
            proc.kill()
        _, err = proc.communicate(timeout=120)
        while any(_alive(p) for p in pids) and time.monotonic() - t0 < 60:
            time.sleep(0.02)
        took = time.monotonic() - t0
        left = [p for p in pids if _alive(p)]
    finally:
        proc.kill()
        for p in pids if "pids" in locals() else []:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
    lines = [x for x in err.splitlines() if x.startswith(("error:", "interrupted:", "  also"))]
    return {"probe": name, "seconds": round(took, 2), "exit": proc.returncode,
            "ranks_left": len(left), "message": " | ".join(lines)[:300]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--timeout", type=float, default=5.0)
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="polytrain-faults-"))
    raw: list[dict[str, Any]] = []
    for r, name in alternating(PROBES, a.repeats):
        row = probe(name, work, a.timeout)
        row["repeat"] = r
        print(json.dumps(row), flush=True)
        raw.append(row)
    rows = []
    for name in PROBES:
        mine = [x for x in raw if x["probe"] == name]
        secs = [x["seconds"] for x in mine]
        rows.append({"probe": name, "seconds": fmt_spread(secs, 2), "median_s": spread(secs)["median"],
                     "repeats": len(mine), "exit_codes": sorted({x["exit"] for x in mine}),
                     "ranks_left": sum(x["ranks_left"] for x in mine), "message": mine[0]["message"]})
    write_results("fault_times", rows, ["probe", "seconds", "repeats", "exit_codes", "ranks_left",
                                        "message"],
                  notes=f"--timeout {a.timeout} s; seconds: median (min–max) from the fault to the "
                        "launcher's exit (kill -9 launcher: to the last rank's death).",
                  extra={"raw": raw})


if __name__ == "__main__":
    main()
