"""How long the local launcher takes to act on each fault (the README's reliability table).

    .venv/bin/python benchmarks/fault_times.py [--repeats 5] [--timeout 5]

A 2-rank `polytrain train` (allreduce, mlp, endless steps, --timeout T) is started; once both
ranks train, one fault is injected and the time until the job has acted is measured:

* ``kill -9 rank 1``: until the launcher exits (it names the rank, the survivor is killed);
* ``SIGSTOP rank 1``: until the launcher exits (rank 0 times out after T s and the stopped rank
  is killed at once);
* ``SIGTERM launcher``: until the launcher exits, every rank stopped at one step after a
  checkpoint (``--checkpoint-every`` large: the stop writes it);
* ``kill -9 launcher``: until no rank is alive (parent-death signal); ``agent_dir_s``: until
  the agent's log folder ``RUN/ranks/agent`` is gone (removed by a rank's watcher);
* ``SIGTERM launcher (ps)`` / ``(distbelief)`` / ``(ps k-of-n)``: as ``SIGTERM launcher`` for the
  strategies with loops of their own (ps: 1 server + 2 workers; distbelief: 2 stage servers + one
  replica of 2 stages; k-of-n: 1 server + 3 workers, k = 2, no checkpoint).
* ``SIGTERM launcher (pipedream)`` / ``(spectrain)``: the stream pipelines (3 and 2 stages),
  stopped in the middle of their one segment.
* ``SIGTERM rl dqn`` / ``kill -9 rl dqn``: `polytrain rl dqn` (one learner process, endless env
  steps, ``--checkpoint-every`` large: the stop writes it), once its first episode ended: until
  the launcher exits / until the learner process is gone.

``--probes`` picks some (comma-separated) and ``--name`` names the results file. The probes
alternate (one of each per repeat, the order reversed every other repeat).
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

PROBES = ["kill -9 rank 1", "SIGSTOP rank 1", "SIGTERM launcher", "kill -9 launcher",
          "SIGTERM launcher (ps)", "SIGTERM launcher (distbelief)", "SIGTERM launcher (ps k-of-n)",
          "SIGTERM launcher (pipedream)", "SIGTERM launcher (spectrain)",
          "SIGTERM rl dqn", "kill -9 rl dqn"]
RL = ["rl", "dqn", "--set=hidden=16", "--set=depth=1", "--set=max_seconds=1e6", "--set=target_return=1e6",
      "--set=eval_every_s=1e6", "--max-env-steps", "100000000", "--checkpoint-every", "100000000",
      "--no-plots"]
# the job of a probe: its extra arguments and world size (default: allreduce on 2 ranks)
JOBS = {"SIGTERM launcher (ps)": (["--strategy", "ps"], 3),
        "SIGTERM launcher (distbelief)": (["--strategy", "distbelief"], 4),
        # 1 server, 3 workers, k = 2 (the batch divisible by 3); k-of-n keeps no checkpoint
        "SIGTERM launcher (ps k-of-n)": (["--strategy", "ps", "--set", "consistency=k-of-n",
                                          "--batch-size", "66"], 4),
        # stream pipelines: one segment spans the run (20,000 steps: its order is built whole),
        # stopped mid-stream; pipedream on 3 stages, spectrain on 2
        "SIGTERM launcher (pipedream)": (["--strategy", "pipedream", "--steps", "20000"], 3),
        "SIGTERM launcher (spectrain)": (["--strategy", "spectrain", "--optimizer", "momentum",
                                          "--steps", "20000"], 2)}
NO_CHECKPOINT = {"SIGTERM launcher (ps k-of-n)"}


def _alive(pid: int) -> bool:
    state = process_state(pid)
    return state is not None and state not in ("Z", "X")


def _pids(run: Path, ranks: int = 2, timeout: float = 180, event: str = "step") -> list[int]:
    """Every rank's pid, once all have started and one has recorded 3 ``event``s (servers record
    none)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        pids, stepped = [], 0
        for rank in range(ranks):
            path = run / "ranks" / f"rank{rank}.jsonl"
            lines = path.read_text().splitlines() if path.exists() else []
            evs = [json.loads(x) for x in lines if x.endswith("}")]
            stepped = max(stepped, sum(e["event"] == event for e in evs))
            pids += [e["pid"] for e in evs if e["event"] == "process"][:1]
        if len(pids) == ranks and stepped >= 3:
            return pids
        time.sleep(0.1)
    raise SystemExit(f"{run}: the ranks never trained")


def probe(name: str, work: Path, timeout: float) -> dict[str, Any]:
    run = work / f"run-{time.monotonic_ns()}"
    job, ranks = JOBS.get(name, ([], 2))
    extra = [*job, *([] if name in NO_CHECKPOINT else ["--checkpoint-every", "1000000"])] \
        if name.startswith("SIGTERM launcher") else []
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    rl = " rl " in name
    args = [*RL, "--out", str(run)] if rl else \
        ["train", "--model", "mlp", "--procs", str(ranks), "--steps", "100000000", "--timeout",
         str(timeout), "--out", str(run), "--no-report", *extra]
    proc = subprocess.Popen([sys.executable, "-m", "polytrain", *args], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    agent_dir_s = None
    try:
        pids = _pids(run, 1, event="episode") if rl else _pids(run, ranks)
        t0 = time.monotonic()
        if name == "kill -9 rank 1":
            os.kill(pids[1], signal.SIGKILL)
        elif name == "SIGSTOP rank 1":
            os.kill(pids[1], signal.SIGSTOP)
        elif name.startswith("SIGTERM"):
            proc.send_signal(signal.SIGTERM)
        else:
            proc.kill()
        if name == "kill -9 rl dqn":  # the learner's end (the fork server holds stderr a while)
            while any(_alive(p) for p in pids) and time.monotonic() - t0 < 60:
                time.sleep(0.02)
            took = time.monotonic() - t0
        _, err = proc.communicate(timeout=120)
        while any(_alive(p) for p in pids) and time.monotonic() - t0 < 60:
            time.sleep(0.02)
        took = took if name == "kill -9 rl dqn" else time.monotonic() - t0
        left = [p for p in pids if _alive(p)]
        while (run / "ranks" / "agent").exists() and time.monotonic() - t0 < 60:
            time.sleep(0.02)
        if not (run / "ranks" / "agent").exists():
            agent_dir_s = round(time.monotonic() - t0, 2)
    finally:
        proc.kill()
        for p in pids if "pids" in locals() else []:
            if _alive(p):
                os.kill(p, signal.SIGKILL)
    lines = [x for x in err.splitlines() if x.startswith(("error:", "interrupted:", "  also"))]
    summary = run / "summary.json"
    by = "no summary"
    if summary.exists():
        mark = json.loads(summary.read_text()).get("interrupted") or {}
        by = "launcher (marked interrupted)" if rl and mark else mark.get("by") or "rank 0"
    return {"probe": name, "seconds": round(took, 2), "exit": proc.returncode,
            "ranks_left": len(left), "agent_dir_s": agent_dir_s,
            "summary_by": by, "message": " | ".join(lines)[:300]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--timeout", type=float, default=5.0)
    p.add_argument("--probes", default=",".join(PROBES), help="comma-separated, of: " + ", ".join(PROBES))
    p.add_argument("--name", default="fault_times", help="results file name")
    a = p.parse_args()
    probes = [x.strip() for x in a.probes.split(",")]
    if unknown := [x for x in probes if x not in PROBES]:
        raise SystemExit(f"--probes: unknown {unknown}; choose from {PROBES}")
    work = Path(tempfile.mkdtemp(prefix="polytrain-faults-"))
    raw: list[dict[str, Any]] = []
    for r, name in alternating(probes, a.repeats):
        row = probe(name, work, a.timeout)
        row["repeat"] = r
        print(json.dumps(row), flush=True)
        raw.append(row)
    rows = []
    for name in probes:
        mine = [x for x in raw if x["probe"] == name]
        secs = [x["seconds"] for x in mine]
        agent = [x["agent_dir_s"] for x in mine if x["agent_dir_s"] is not None]
        rows.append({"probe": name, "seconds": fmt_spread(secs, 2), "median_s": spread(secs)["median"],
                     "repeats": len(mine), "exit_codes": sorted({x["exit"] for x in mine}),
                     "ranks_left": sum(x["ranks_left"] for x in mine),
                     "agent_dir_gone_s": fmt_spread(agent, 2) if len(agent) == len(mine) else
                     f"{len(mine) - len(agent)} of {len(mine)} left",
                     "summary_by": sorted({x["summary_by"] for x in mine}), "message": mine[0]["message"]})
    write_results(a.name, rows, ["probe", "seconds", "repeats", "exit_codes", "ranks_left",
                                 "agent_dir_gone_s", "summary_by", "message"],
                  notes=f"--timeout {a.timeout} s; seconds: median (min–max) from the fault to the "
                        "launcher's exit (kill -9 launcher: to the last rank's death); "
                        "agent_dir_gone_s: from the fault until RUN/ranks/agent is gone; summary_by: "
                        "who wrote the interrupted summary (rank 0, or the launcher after killing "
                        "ranks at the end of its grace).",
                  extra={"raw": raw})


if __name__ == "__main__":
    main()
