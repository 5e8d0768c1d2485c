"""A local run's stores are out of other local users' reach (issue 50 item 5).

While a 2-rank job trains, a child of this test that has dropped to user ``nobody`` (fork, then
``setuid``) tries to open the run's two FileStores (the rendezvous and the ranks' process group)
and, as a TCPStore client, every TCP port the job listens on (only gloo's own sockets are left:
no store answers there). Controls show the probe itself works: as ``nobody`` it opens a
FileStore in a directory open to all and a TCPStore on loopback. Needs root (to become nobody).
"""

from __future__ import annotations

import json
import os
import pwd
import select
import signal
import tempfile
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from polytrain.launch.stores import listening_fd
from tests.faults.test_launcher_signals import rank_pids, start, wait_gone
from tests.test_exposure import _listening, _socket_inodes, _tree

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become user nobody")]
OPENED = "opened"


def as_nobody(probe: Callable[[str], str], target: str, within: float = 5.0) -> str:
    """``probe(target)`` run in a forked child that is user ``nobody`` (no supplementary
    groups); what it returns, or "no answer" when it has not returned ``within`` seconds."""
    nobody = pwd.getpwnam("nobody")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            answer = probe(target) if os.geteuid() == nobody.pw_uid else "still privileged"
            os.write(write, answer.encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        ready, _, _ = select.select([read], [], [], within)
        answer = os.read(read, 4096).decode() if ready else f"no answer in {within:.0f} s"
    finally:
        os.close(read)
        if not ready:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return answer


def _error(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"


def open_file_store(path: str) -> str:
    try:
        store = dist.FileStore(path, -1)
        store.set("probe", "x")
        return OPENED
    except Exception as exc:  # any failure is the answer
        return _error(exc)


def open_tcp_store(port: str) -> str:
    try:
        store = dist.TCPStore("127.0.0.1", int(port), is_master=False, timeout=timedelta(seconds=3))
        store.set("probe", "x")
        return OPENED
    except Exception as exc:
        return _error(exc)


def test_the_probe_reaches_stores_that_are_open() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o777)
        assert as_nobody(open_file_store, os.path.join(tmp, "open.store")) == OPENED
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           master_listen_fd=listening_fd("127.0.0.1", 0))
    assert as_nobody(open_tcp_store, str(server.port)) == OPENED


def test_another_local_user_cannot_reach_a_local_run_s_stores(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = start(run, "--checkpoint-every", "1000000")
    try:
        pids = rank_pids(run)
        private = run / "ranks" / "agent"
        files = sorted(str(p) for p in private.glob("*.store"))
        assert [Path(f).name for f in files] == ["ranks.store", "rendezvous.store"]
        ports = {port for _, port in _listening(_socket_inodes(_tree(proc.pid)))}
        answers = {f: as_nobody(open_file_store, f) for f in files}
        answers |= {str(p): as_nobody(open_tcp_store, str(p)) for p in sorted(ports)}
        print(f"\nas nobody: {json.dumps(answers, indent=1)}")
        for f in files:
            assert "Permission denied" in answers[f], answers
        assert OPENED not in answers.values(), answers
        assert oct(private.stat().st_mode & 0o777) == "0o700"
        proc.send_signal(signal.SIGTERM)  # the stop request goes through the ranks' store
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    wait_gone(pids, within=5)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert json.loads((run / "summary.json").read_text())["interrupted"]["step"] >= 3
