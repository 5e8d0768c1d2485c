"""Files and ports that every launcher shares: `train`'s elastic launcher, the RL supervisor and
the planner's measurement runs.

* :func:`free_port` — a free TCP port on the loopback interface, for a local rendezvous;
* :func:`make_run_dir` — a new run directory (``--out`` or ``runs/<time>-<label>``), never one
  that holds a finished run;
* :func:`write_error_record` / :func:`read_error_record` — ``ranks/rank{R}.error.json``, what a
  failing rank writes before it exits so that its launcher can name the rank, step and cause;
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import traceback
from pathlib import Path
from typing import Any

import polytrain.env as env
from polytrain.errors import ConfigError

LOOPBACK = "127.0.0.1"
LAUNCHER_PID_ENV = env.LAUNCHER_PID  # the local launcher's pid, its ranks' parent
PR_SET_PDEATHSIG = 1  # prctl(2)


def die_with_parent() -> None:
    """Linux: the calling rank is killed when its parent (the launcher's agent) dies, even by
    SIGKILL, so no rank trains on as an orphan; a rank whose parent died already exits now.
    Called first thing in a rank, before its imports."""
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        return  # not Linux: the launcher's agent still stops its ranks when it can
    parent = os.environ.get(LAUNCHER_PID_ENV)
    if (parent and os.getppid() != int(parent)) or os.getppid() == 1:
        os._exit(1)


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free on ``host`` now (the OS picks it; bound and released at once)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def make_run_dir(out: str | None, label: str, base: Path = Path("runs"), *,
                 resume_hint: bool = False) -> Path:
    """``out`` if given (it must not hold another run), else ``base/<time>-<label>[-i]``."""
    if out:
        path = Path(out)
        if (path / "summary.json").exists() or (path / "config.toml").exists():
            hint = f", or continue it with --resume {path}" if resume_hint else ""
            raise ConfigError(f"--out {path} already holds a run; polytrain never overwrites one. "
                              f"Choose another --out{hint}.")
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"--out {path}: cannot create the run directory ({exc.strerror}). "
                              "Choose a writable path.") from None
        return path
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for i in range(1000):
        path = base / (f"{stamp}-{label}" + (f"-{i}" if i else ""))
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
        except OSError as exc:
            raise ConfigError(f"Cannot create the run directory {path} ({exc.strerror}). Run from a "
                              "writable directory or pass --out.") from None
    raise ConfigError(f"Cannot create a run directory under {base}: too many runs this second.")


def _error_path(run_dir: Path, rank: int) -> Path:
    return run_dir / "ranks" / f"rank{rank}.error.json"


SPARE_DIR = Path("/dev/shm")  # memory-backed: a record fits there when the run's disk is full


def _spare_path(run_dir: Path, rank: int) -> Path:
    """Where a rank puts its record when the run directory cannot take it (disk full, read-only):
    named by the run directory, so its launcher finds it."""
    import hashlib

    key = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:16]
    return SPARE_DIR / f"polytrain-{key}-rank{rank}.error.json"


def _write_whole(path: Path, text: str) -> None:
    """Write by rename: the file is whole or absent, never empty (a full disk fails the write)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def write_error_record(run_dir: Path, rank: int, exc: BaseException, step: int | None = None) -> None:
    """Best effort: a rank that cannot write its record still fails, and its launcher says so.
    The record goes to ``ranks/`` or, when that write fails, to :func:`_spare_path`."""
    record: dict[str, Any] = {"rank": rank, "error": f"{type(exc).__name__}: {exc}",
                              "traceback": "".join(traceback.format_exception(exc))}
    if step is not None:
        record["step"] = step
    if getattr(exc, "since", None) is not None:  # DivergedError: where the divergence may begin
        record["diverged"] = {"step": exc.step, "since": exc.since}  # type: ignore[attr-defined]
    text = json.dumps(record, indent=1)
    path = _error_path(run_dir, rank)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_whole(path, text)
    except OSError:
        with contextlib.suppress(OSError):
            _write_whole(_spare_path(run_dir, rank), text)


def clear_error_record(run_dir: Path, rank: int) -> None:
    """Remove ``rank``'s record of an earlier failure (a restarted or resumed rank's)."""
    for path in (_error_path(run_dir, rank), _spare_path(run_dir, rank)):
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)


def read_error_record(run_dir: Path, rank: int) -> dict[str, Any] | None:
    for path in (_error_path(run_dir, rank), _spare_path(run_dir, rank)):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and "error" in record:
            return record
    return None


def oom_kills() -> int | None:
    """How many processes the kernel's out-of-memory killer has killed in this process's memory
    cgroup (v2 ``memory.events``, v1 ``memory.oom_control``); None where neither is readable.
    A rank killed by SIGKILL while this count rose was killed for memory."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    paths = []
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if controllers == "":
            paths.append(Path("/sys/fs/cgroup") / rel.lstrip("/") / "memory.events")
        elif "memory" in controllers.split(","):
            paths.append(Path("/sys/fs/cgroup/memory") / rel.lstrip("/") / "memory.oom_control")
    for path in paths:
        with contextlib.suppress(OSError, ValueError):
            for entry in path.read_text().splitlines():
                key, _, value = entry.partition(" ")
                if key == "oom_kill":
                    return int(value)
    return None
