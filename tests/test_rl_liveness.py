"""The RL launcher's view of its ranks survives the fork server's end. A SIGTERM to the whole
process group (``timeout``, a supervisor) can end the fork server first; its pipes then close and
``Process.is_alive()`` says False for ranks still writing their checkpoint and results — the
launcher summarised too early ("stopped before the learner reported"). It asks the kernel too."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

from polytrain.rl.launcher import _alive, _signal


def _sleep() -> None:
    time.sleep(60)


def _until(cond: object, within: float = 10.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


def test_a_rank_outliving_the_fork_server_reads_as_alive_until_it_ends() -> None:
    from multiprocessing import forkserver

    p = mp.get_context("forkserver").Process(target=_sleep, daemon=True)
    p.start()
    try:
        server = forkserver._forkserver._forkserver_pid
        assert server and p.pid
        os.kill(server, signal.SIGTERM)  # as a SIGTERM to the group would
        assert _until(lambda: not p.is_alive())  # multiprocessing now calls the rank gone ...
        assert _alive(p)  # ... while it runs
        _signal(p, signal.SIGTERM)
        assert _until(lambda: not _alive(p))  # and its real end is seen
    finally:
        _signal(p, signal.SIGKILL)
