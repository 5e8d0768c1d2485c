"""The elastic agent's log tree is removed when the agent ends, killed or not (issue 22).

torch's agent (torchrun, or the local launcher) writes a log tree per run: each rank's
``error.json`` under ``BASE/<run id>_*/attempt_N/<local rank>/``. Without ``--log-dir`` torchrun
makes ``BASE`` a ``/tmp/torchelastic_*`` that nothing removes; the local launcher puts it in
``RUN/ranks/agent`` and removes it when it returns, which a ``kill -9`` of the launcher skips.

So the first rank of a node that starts under an agent starts a small watcher (this file run as a
script: no torch, no polytrain imports) in its own session, which waits for the agent's process
to end and then removes the tree. A ``--log-dir`` the user chose is theirs and kept.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import polytrain.env as env

AGENT_LOGS_ENV = env.AGENT_LOGS  # the local launcher's agent log folder
MARK = ".polytrain-watched"  # one watcher per tree: the first rank (of any restart) creates it
POLL_S = 0.2


def agent_log_tree(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The agent log tree this rank's error file lies in, when polytrain should remove it: the
    local launcher's, or torchrun's default ``torchelastic_*`` in the temporary folder."""
    error_file = environ.get("TORCHELASTIC_ERROR_FILE")
    if not error_file or error_file == os.devnull:
        return None
    parents = Path(error_file).parents
    if len(parents) < 5:
        return None
    base = parents[3]  # <base>/<run id>_*/attempt_N/<local rank>/error.json
    ours = environ.get(AGENT_LOGS_ENV)
    if ours and os.path.realpath(base) == os.path.realpath(ours):
        return base
    tmp = os.path.realpath(environ.get("TMPDIR") or tempfile.gettempdir())
    if base.name.startswith("torchelastic_") and os.path.realpath(base.parent) == tmp:
        return base
    return None


def remove_when_agent_ends() -> None:
    """Called by each rank as it starts: the first one of a tree starts the watcher."""
    tree = agent_log_tree()
    if tree is None:
        return
    try:
        os.close(os.open(tree / MARK, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except OSError:  # watched already (another local rank, an earlier attempt), or gone
        return
    subprocess.Popen(
        [sys.executable, "-I", __file__, str(os.getppid()), str(tree)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True)  # Ctrl-C to the job's group does not reach it


def running(pid: int) -> bool:
    """The process exists and is not a zombie (a killed agent not yet reaped by its parent)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except (OSError, IndexError):  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def watch(agent: int, tree: Path) -> None:
    """Wait while the agent runs and its tree exists (the local launcher removes its own when it
    returns), then remove the tree."""
    while running(agent) and tree.exists():
        time.sleep(POLL_S)
    shutil.rmtree(tree, ignore_errors=True)


if __name__ == "__main__":
    watch(int(sys.argv[1]), Path(sys.argv[2]))
