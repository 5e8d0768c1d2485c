"""The start-up trace: when each phase of a launch was reached, in ``RUN/startup.jsonl``.

One JSON line per mark: ``{"who": "launcher" | "rank0" | ..., "phase": ..., "t": epoch seconds,
"since_launch_s": seconds after the launching process started}``. A process's own start
(``process start``: the interpreter's, read from ``/proc`` on Linux) is the first mark of each
process, so the trace shows the interpreter and import time too, not only what polytrain's code
does. The launcher's marks wait in memory until the run directory exists; a rank writes its own
(a line appended with one write, so concurrent ranks never interleave within a line).
``benchmarks/startup.py`` reads it to say where the time to the first step goes.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import polytrain.env as env

FILE = "startup.jsonl"
LAUNCH_T0_ENV = env.LAUNCH_T0  # the launching process's start, inherited by its ranks
_pending: list[tuple[str, float]] = []


def process_start() -> float:
    """When this process started (epoch seconds): its age from /proc on Linux (start and uptime
    on the same clock since boot, 10 ms ticks), else now."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time()


_from_cli = False


def begin(origin: float | None = None) -> None:
    """A launch starts: ``origin`` (default: this process's start, for the command line) is the
    trace's zero, inherited by the ranks. A Python caller's launch starts its own trace."""
    global _from_cli
    if origin is None:
        _from_cli = True
        origin = process_start()
        _pending.append(("process start", origin))
    elif _from_cli:
        return  # the command line's launches count from the command's start
    os.environ[LAUNCH_T0_ENV] = repr(origin)


def mark(phase: str) -> None:
    """A launcher phase reached now (written by :func:`write_launcher`)."""
    _pending.append((phase, time.time()))


def _line(who: str, phase: str, t: float) -> str:
    origin = float(os.environ.get(LAUNCH_T0_ENV, "nan"))
    since = round(t - origin, 4) if origin == origin else None  # NaN: no launcher (torchrun)
    return json.dumps({"who": who, "phase": phase, "t": round(t, 4), "since_launch_s": since}) + "\n"


def _append(run_dir: Path, text: str) -> None:
    fd = os.open(run_dir / FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def write_launcher(run_dir: Path) -> None:
    """Append the launcher's marks so far to the run's trace."""
    if _pending:
        _append(run_dir, "".join(_line("launcher", p, t) for p, t in _pending))
        _pending.clear()


def rank_mark(run_dir: Path, rank: int, phase: str, t: float | None = None) -> None:
    """A rank's phase reached now (or at ``t``), appended to the run's trace at once."""
    with contextlib.suppress(OSError):  # a diagnosis: never a reason for a rank to fail
        _append(run_dir, _line(f"rank{rank}", phase, time.time() if t is None else t))
