"""kill -9 of one rank of each kind (issue 22 fault suite, nightly tier): a parameter server, a
pipeline stage, a data-parallel worker. The job ends within seconds with the rank named, and
no rank of it is left alive. (The worker case also runs in every suite: tests/test_failures.py.)"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.faults.test_launcher_signals import alive, rank_pids, start

pytestmark = [pytest.mark.slow, pytest.mark.nightly]

KINDS = {
    "ps server": (["--strategy", "ps", "--procs", "3", "--set", "servers=1"], 0),
    "pipeline stage": (["--strategy", "gpipe", "--procs", "2"], 1),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_killed_rank_of_each_kind_ends_the_job(tmp_path: Path, kind: str) -> None:
    extra, victim = KINDS[kind]
    run = tmp_path / "run"
    proc = start(run, *extra)
    try:
        pids = rank_pids(run, ranks=int(extra[extra.index("--procs") + 1]))
        os.kill(pids[victim], signal.SIGKILL)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=120)
        took = time.monotonic() - t0
    finally:
        proc.kill()
    assert proc.returncode == 1 and took < 30, (took, err)
    assert f"rank {victim} died (SIGKILL)" in err
    assert not any(alive(p) for p in pids)
