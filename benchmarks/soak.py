"""Soak: a torchrun job under periodic kill -9 and SIGSTOP of its ranks reaches its target step
with the parameters of an undisturbed run, and leaves nothing behind.

    .venv/bin/python benchmarks/soak.py [--steps 6000] [--every 20] [--timeout 5] [--seed 0]

The job (allreduce, 2 ranks, mlp on digits, momentum, checkpoint every 100 steps) runs under
``python -m polytrain.launch.run --standalone --max-restarts K`` (torchrun with loopback stores).
Every ``--every`` seconds of progress, the soak kills a random rank (SIGKILL) or stops it
(SIGSTOP: its peer times out after ``--timeout`` s, the agent kills the stopped rank), in turn.
torchrun restarts the ranks, which resume from the newest checkpoint. Per fault it records the
recovery time (fault to the restarted generation's first step), the steps lost (fault step -
resumed checkpoint step) and the agent's and ranks' open files and threads. At the end it
compares model.pt with an undisturbed run of the same job (local launcher), and checks that no
process of the job is alive, the job's private TMPDIR is empty (torch's per-user
``torchinductor_*`` cache aside) and /dev/shm holds no new polytrain file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
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

from harness import fmt_spread, write_results  # noqa: E402

JOB = ["--strategy", "allreduce", "--model", "mlp", "--batch-size", "32", "--optimizer", "momentum",
       "--lr", "0.05", "--checkpoint-every", "100", "--no-report"]


class Tail:
    """A rank's event file read incrementally: only new lines are parsed, and only the events
    the soak needs (a whole-file parse of a long run takes seconds, which would count as
    recovery time). A rewind (a resume) replaces the file: the tail starts over."""

    WANTED = ('"event": "process"', '"event": "step"', '"event": "start"')

    def __init__(self, path: Path) -> None:
        self.path, self.inode, self.offset = path, -1, 0
        self.events: list[dict[str, Any]] = []

    def read(self) -> list[dict[str, Any]]:
        try:
            st = self.path.stat()
        except OSError:
            return self.events
        if st.st_ino != self.inode or st.st_size < self.offset:
            self.inode, self.offset, self.events = st.st_ino, 0, []
        with self.path.open() as f:
            f.seek(self.offset)
            for line in f:
                if not line.endswith("\n"):
                    break
                self.offset += len(line.encode())
                if any(w in line for w in self.WANTED):
                    with contextlib.suppress(ValueError):
                        self.events.append(json.loads(line))
        return self.events


_TAILS: dict[Path, Tail] = {}


def _events(path: Path) -> list[dict[str, Any]]:
    return _TAILS.setdefault(path, Tail(path)).read()


def _generation(run: Path, rank: int) -> tuple[int, int, int] | None:
    """(generation, pid, newest step) of ``rank``'s current process, from its event file."""
    evs = _events(run / "ranks" / f"rank{rank}.jsonl")
    procs = [i for i, e in enumerate(evs) if e["event"] == "process"]
    if not procs:
        return None
    last = evs[procs[-1]]
    steps = [e["step"] for e in evs[procs[-1]:] if e["event"] == "step"]
    return last["generation"], last["pid"], max(steps, default=0)


def _resumed_from(run: Path, generation: int) -> int | None:
    evs = _events(run / "ranks" / "rank0.jsonl")
    procs = [i for i, e in enumerate(evs) if e["event"] == "process" and e["generation"] == generation]
    if not procs:
        return None
    starts = [e for e in evs[procs[-1]:] if e["event"] == "start"]
    return starts[0]["first_step"] - 1 if starts else None


def _fds_threads(pid: int) -> tuple[int, int]:
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        status = Path(f"/proc/{pid}/status").read_text()
        threads = int(next(x for x in status.splitlines() if x.startswith("Threads:")).split()[1])
        return fds, threads
    except (OSError, StopIteration, ValueError):
        return -1, -1


def _alive(pid: int) -> bool:
    state = process_state(pid)
    return state is not None and state not in ("Z", "X")


def _job_processes(marker: str) -> list[int]:
    """Live processes whose command line names ``marker`` (the run directory)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmd and int(entry.name) != os.getpid() and _alive(int(entry.name)):
            out.append(int(entry.name))
    return out


def _shm() -> set[str]:
    shm = Path("/dev/shm")
    return {p.name for p in shm.iterdir() if p.name.startswith("polytrain")} if shm.is_dir() else set()


def _leftovers(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if not p.name.startswith("torchinductor_"))


def _wait_progress(run: Path, generation: int, beyond: int, deadline: float) -> float | None:
    """When both ranks of ``generation`` or later have recorded a step after ``beyond``."""
    while time.monotonic() < deadline:
        ok = True
        for rank in (0, 1):
            g = _generation(run, rank)
            if g is None or g[0] < generation or g[2] <= beyond:
                ok = False
        if ok:
            return time.monotonic()
        time.sleep(0.05)
    return None


def soak(a: argparse.Namespace, work: Path) -> dict[str, Any]:
    run, tmp = work / "soak", work / "tmp"
    tmp.mkdir()
    env = {**os.environ, "PYTHONPATH": str(HERE.parent), "TMPDIR": str(tmp)}
    shm_before = _shm()
    restarts = a.max_faults + 5
    cmd = [sys.executable, "-m", "polytrain.launch.run", "--standalone", "--nproc-per-node", "2",
           "--max-restarts", str(restarts), "--monitor-interval", "0.1", "-m", "polytrain", "train",
           *JOB, "--steps", str(a.steps), "--timeout", str(a.timeout), "--out", str(run)]
    rng = random.Random(a.seed)
    t0 = time.monotonic()
    agent = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    faults: list[dict[str, Any]] = []
    kinds = ["SIGKILL", "SIGSTOP"]
    generation = 0
    try:
        if _wait_progress(run, 0, 0, time.monotonic() + 300) is None:
            raise SystemExit("the soak job never started training")
        while agent.poll() is None and len(faults) < a.max_faults:
            time.sleep(a.every)
            if agent.poll() is not None:
                break
            rank = rng.randrange(2)
            now = _generation(run, rank)
            if now is None or now[0] != generation or now[2] >= a.steps - 200:
                break  # too close to the end to inject another fault
            kind = kinds[len(faults) % 2]
            other = _generation(run, 1 - rank)
            reached = max(now[2], other[2] if other else 0)  # the files lag a few steps
            agent_fds, agent_threads = _fds_threads(agent.pid)
            rank_fds, rank_threads = _fds_threads(now[1])
            at = time.monotonic()
            os.kill(now[1], signal.SIGKILL if kind == "SIGKILL" else signal.SIGSTOP)
            generation += 1
            back = _wait_progress(run, generation, 0, at + 180)
            if back is None:
                raise SystemExit(f"no progress after fault {len(faults) + 1} ({kind} rank {rank})")
            resumed = _resumed_from(run, generation)
            faults.append({"fault": kind, "rank": rank, "at_step": reached, "resumed_from": resumed,
                           "steps_lost": None if resumed is None else max(0, reached - resumed),
                           "recovery_s": round(back - at, 2), "agent_fds": agent_fds,
                           "agent_threads": agent_threads, "rank_fds": rank_fds,
                           "rank_threads": rank_threads})
            print(json.dumps(faults[-1]), flush=True)
        _, err = agent.communicate(timeout=1800)
    finally:
        if agent.poll() is None:
            agent.kill()
    wall = time.monotonic() - t0
    time.sleep(1.0)
    return {"returncode": agent.returncode, "stderr_tail": err[-2000:], "wall_s": round(wall, 1),
            "faults": faults, "run": str(run),
            "processes_left": _job_processes(str(run)), "tmp_left": _leftovers(tmp),
            "shm_left": sorted(_shm() - shm_before)}


def reference(a: argparse.Namespace, work: Path) -> Path:
    out = work / "ref"
    env = {**os.environ, "PYTHONPATH": str(HERE.parent)}
    r = subprocess.run([sys.executable, "-m", "polytrain", "train", *JOB, "--procs", "2",
                        "--steps", str(a.steps), "--out", str(out)], env=env, capture_output=True,
                       text=True, timeout=3600)
    if r.returncode != 0:
        raise SystemExit(f"the undisturbed run failed:\n{r.stderr[-2000:]}")
    return out


def main() -> None:
    import torch

    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6000)
    p.add_argument("--every", type=float, default=20.0, help="seconds of progress between faults")
    p.add_argument("--timeout", type=float, default=5.0, help="the job's --timeout (SIGSTOP faults)")
    p.add_argument("--max-faults", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="polytrain-soak-"))
    result = soak(a, work)
    ref = reference(a, work)
    mine = torch.load(Path(result["run"]) / "model.pt", weights_only=True) \
        if result["returncode"] == 0 else {}
    theirs = torch.load(ref / "model.pt", weights_only=True)
    diff = max((float((mine[k] - theirs[k]).abs().max()) for k in theirs), default=float("nan")) \
        if mine else float("nan")
    summary = json.loads((Path(result["run"]) / "summary.json").read_text()) \
        if result["returncode"] == 0 else {}
    rows = result["faults"]
    for kind in ("SIGKILL", "SIGSTOP"):
        times = [f["recovery_s"] for f in rows if f["fault"] == kind]
        if times:
            print(f"{kind}: recovery {fmt_spread(times, 2)} s over {len(times)} faults")
    checks = {
        "reached_target": summary.get("steps_run") == a.steps,
        "max_abs_param_diff_vs_undisturbed": diff,
        "params_equal": diff <= 1e-6,
        "faults": len(rows),
        "soak_wall_s": result["wall_s"],
        "processes_left": result["processes_left"],
        "tmp_left": result["tmp_left"],
        "shm_left": result["shm_left"],
        "agent_fds_first_last": [rows[0]["agent_fds"], rows[-1]["agent_fds"]] if rows else None,
        "agent_threads_first_last": [rows[0]["agent_threads"], rows[-1]["agent_threads"]] if rows else None,
        "rank_fds_first_last": [rows[0]["rank_fds"], rows[-1]["rank_fds"]] if rows else None,
        "returncode": result["returncode"],
    }
    recovery = {k: fmt_spread([f["recovery_s"] for f in rows if f["fault"] == k], 2)
                for k in ("SIGKILL", "SIGSTOP") if any(f["fault"] == k for f in rows)}
    notes = "Checks: " + json.dumps(checks) + "\n\nRecovery (median (min–max) s): " + json.dumps(recovery)
    write_results("soak", rows, ["fault", "rank", "at_step", "resumed_from", "steps_lost",
                                 "recovery_s", "agent_fds", "agent_threads", "rank_fds",
                                 "rank_threads"],
                  notes=notes, extra={"checks": checks, "recovery": recovery,
                                      "stderr_tail": result["stderr_tail"]})
    ok = checks["reached_target"] and checks["params_equal"] and not result["processes_left"] \
        and not result["tmp_left"] and not result["shm_left"]
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
