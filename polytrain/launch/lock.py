"""One job at a time in a run directory: an advisory lock file that names its holder.

``RUN/LOCK`` is held with ``flock(2)`` by the launcher for as long as its job runs (ranks
included); it holds ``{"pid", "host", "since", "command"}`` so that a second launcher refused
the lock can say who has it. The kernel drops a ``flock`` when its process dies, however it
dies (SIGKILL included), so a lock file left by a dead launcher is taken over by the next one
without any staleness guess; its old contents are only a name. Two ``--resume`` of one run at
once were not refused before: the second removed the first's half-written checkpoint and the
survivor's metrics stopped short (issue 50, item 3).

``flock`` is per host: a run directory on a network file system shared by two hosts' launchers
is not protected across them (NFS maps flock to its own byte-range locks only on some servers).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from polytrain.errors import ConfigError

LOCK = "LOCK"


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text())
        since = time.strftime("%H:%M:%S", time.localtime(float(info["since"])))
        return f"pid {info['pid']} on {info['host']} since {since} ({info['command']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process (its LOCK file is unreadable)"


@contextlib.contextmanager
def hold_run_dir(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir``'s lock while the block runs; ConfigError when another process holds it."""
    path = run_dir / LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ConfigError(f"{run_dir}: cannot create its lock file {LOCK} ({exc.strerror}). Use a "
                          "run directory you can write.") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                f"{run_dir} is in use by {_holder(path)}: one job at a time writes a run "
                "directory. Wait for that job to end, or stop it first.") from None
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(),
                "command": " ".join(["polytrain", *sys.argv[1:]])[:200]}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # the file stays (unlinking races a waiting launcher); no holder
    finally:
        os.close(fd)  # releases the flock
