"""The launcher for jobs whose policy lets some ranks die (`polytrain.launch.supervisor`), with
real forked processes: an expendable rank that dies or stalls is recorded as lost and the run
goes on; an essential one that fails ends the run at once, naming it; the launcher's view of a
rank survives the fork server's end."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from polytrain.errors import RankFailure
from polytrain.launch.supervisor import RankPolicy, alive, exit_with, send, start_ranks, supervise

ROLES = ("learner", "server", "actor", "actor")
LABELS = ("learner", "server", "actor 0", "actor 1")


def _sleep() -> None:
    time.sleep(60)


def _until(cond: object, within: float = 10.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


def _rank(payload: dict[str, Any], rank: int) -> None:
    """A rank that does what the test says: finish after a delay, die, or hang."""
    exit_with(int(payload["launcher_pid"]))
    what, after = payload["do"][rank]
    time.sleep(after)
    if what == "die":
        os._exit(3)
    if what == "hang":
        time.sleep(60)


def _run(tmp_path: Path, do: list[tuple[str, float]], **policy: Any) -> Any:
    pol = RankPolicy(roles=ROLES, labels=LABELS, expendable=frozenset({"actor"}), app="test job",
                     **{"lead_grace_s": 5.0, "expendable_grace_s": 0.5, "deadline_s": 30.0, **policy})
    started = time.monotonic()
    procs = start_ranks(_rank, {"do": do}, len(ROLES), [], "polytrain-test")
    try:
        return supervise(procs, pol, tmp_path, started), procs
    finally:
        assert not any(alive(p) for p in procs.values())  # nothing is left running


def test_an_expendable_rank_that_dies_is_lost_and_the_run_goes_on(tmp_path: Path) -> None:
    sup, _ = _run(tmp_path, [("ok", 1.0), ("ok", 1.0), ("die", 0.0), ("ok", 0.5)])
    assert [(x.rank, x.cause) for x in sup.lost] == [(2, "exit code 3")]
    assert sup.exits[0].code == 0 and sup.exits[3].code == 0 and sup.stop_signal is None


def test_an_essential_rank_that_fails_ends_the_run_naming_it(tmp_path: Path) -> None:
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as err:
        _run(tmp_path, [("hang", 0.0), ("die", 0.2), ("hang", 0.0), ("hang", 0.0)])
    msg = str(err.value)
    assert "The test job failed: rank 1 (server) exit code 3 without an error report" in msg
    assert "A server is essential (only actors may be lost)" in msg
    assert time.monotonic() - t0 < 20  # the hanging ranks were stopped, not waited for


def test_expendable_ranks_still_running_after_the_essential_ones_are_lost(tmp_path: Path) -> None:
    sup, _ = _run(tmp_path, [("ok", 0.5), ("ok", 0.5), ("hang", 0.0), ("ok", 0.2)])
    assert [(x.rank, x.code) for x in sup.lost] == [(2, None)]
    assert sup.exits[2].cause == "still running (killed by the launcher)"
    assert sup.wall_s < 10  # expendable_grace_s, not lead_grace_s or the deadline


def test_a_policy_names_one_role_and_label_per_rank() -> None:
    with pytest.raises(ValueError, match="one role and one label per rank"):
        RankPolicy(roles=("learner",), labels=("learner", "actor 0"))


def test_a_rank_outliving_the_fork_server_reads_as_alive_until_it_ends() -> None:
    """A SIGTERM to the whole process group (``timeout``, a supervisor) can end the fork server
    first; its pipes then close and ``Process.is_alive()`` says False for ranks still writing
    their checkpoint and results — the launcher summarised too early. It asks the kernel too."""
    from multiprocessing import forkserver

    p = mp.get_context("forkserver").Process(target=_sleep, daemon=True)
    p.start()
    try:
        server = forkserver._forkserver._forkserver_pid
        assert server and p.pid
        os.kill(server, signal.SIGTERM)  # as a SIGTERM to the group would
        assert _until(lambda: not p.is_alive())  # multiprocessing now calls the rank gone ...
        assert alive(p)  # ... while it runs
        send(p, signal.SIGTERM)
        assert _until(lambda: not alive(p))  # and its real end is seen
    finally:
        send(p, signal.SIGKILL)
