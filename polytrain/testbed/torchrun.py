"""Running a job on a `Testbed`: one torchrun agent per emulated host, inside its namespace.

`run_torchrun` starts every host's agent (`torchrun_command`: a fixed-size c10d rendezvous
served by host 0) with the host's environment (`_host_env`: gloo and NCCL bound to the host's
shaped interface, the testbed's record for the job's summary.json), streams host 0 to this
terminal and host i > 0 to a log file, and — once one host fails — stops the others after a
grace period, so a failed job never hangs on peers waiting for it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from polytrain.env import TESTBED_HOST, TESTBED_ID, TESTBED_RECORD
from polytrain.errors import ConfigError
from polytrain.testbed import netns

if TYPE_CHECKING:
    from polytrain.testbed.hosts import Testbed

RDZV_PORT = 29400


def testbed_record(tb: Testbed) -> dict[str, Any]:
    """What a result was measured on; goes into summary.json so testbeds are never mixed."""
    return {
        "hosts": tb.hosts,
        "nic": tb.nic,
        "rate_bits_per_s": tb.rate_bits_per_s,
        "latency": tb.latency,
        "loss": tb.loss,
        "procs_per_host": tb.procs_per_host,
    }


def torchrun_command(
    tb: Testbed, host: int, program: list[str], nproc_per_host: int, rdzv_id: str,
    agent_logs: Path | None = None,
) -> list[str]:
    """The torchrun agent command for ``host``: fixed-size c10d rendezvous at host 0.

    ``--nnodes N`` (min = max) makes the rendezvous wait for exactly N agents. Host 0 serves
    the rendezvous store (``is_host=1``, explicit: torch's own guess compares the endpoint to
    the machine's hostname, which all namespaces share). ``--node-rank`` is not passed: c10d
    ignores it and orders agents by ``--local-addr``, which is chosen so host i is node rank i.
    ``--local-addr`` is also what the workers' MASTER_ADDR becomes, so it must be routable.
    torchrun runs through ``polytrain.launch.run``: its stores listen on the host's own address
    only, and a stop (teardown, Ctrl-C) is one line, not a ``SignalException`` traceback.
    ``agent_logs``: torchrun's log tree (else a ``torchelastic_*`` in the temporary folder).
    """
    return [
        sys.executable, "-m", "polytrain.launch.run", "--bind", tb.host_addr(host),
        *(["--log-dir", str(agent_logs)] if agent_logs is not None else []),
        "--nnodes", str(tb.hosts),
        "--nproc-per-node", str(nproc_per_host),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"{tb.host_addr(0)}:{RDZV_PORT}",
        "--rdzv-id", rdzv_id,
        "--rdzv-conf", f"is_host={int(host == 0)}",
        "--local-addr", tb.host_addr(host),
        "--max-restarts", "0",
        *program,
    ]  # fmt: skip


def _host_env(tb: Testbed, host: int, env: Mapping[str, str] | None) -> dict[str, str]:
    out = {**os.environ, **(env or {})}
    out.setdefault("OMP_NUM_THREADS", "1")
    out.update(
        GLOO_SOCKET_IFNAME=tb.host_ifname(host),  # gloo traffic over the shaped link
        NCCL_SOCKET_IFNAME=tb.host_ifname(host),
        **{TESTBED_ID: tb.id, TESTBED_HOST: str(host),
           TESTBED_RECORD: json.dumps(testbed_record(tb))},  # for the job's summary.json
        PYTHONUNBUFFERED="1",
    )
    return out


def run_torchrun(
    tb: Testbed,
    module_args: list[str],
    nproc_per_host: int,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    *,
    log_dir: str | Path | None = None,
    fail_grace_s: float = 10.0,
) -> int:
    """Run ``module_args`` (e.g. ``["-m", "polytrain", "train", ...]``) under torchrun on every
    host; host 0 streams to this terminal, host i>0 to ``tb.host_logs[i]``.

    Returns 0 if every host succeeded, else the first failing host's exit code (124 on
    ``timeout``). ``fail_grace_s`` after a first failure, hosts still running are stopped, so
    a failed job never hangs on peers waiting for it.
    """
    if isinstance(nproc_per_host, bool) or not isinstance(nproc_per_host, int) or nproc_per_host < 1:
        raise ConfigError(f"nproc_per_host must be an integer >= 1; got {nproc_per_host!r}. Example: 2.")
    if not module_args or not all(isinstance(a, str) for a in module_args):
        raise ConfigError(
            f"module_args must be a non-empty list of strings (a script or -m MODULE and its "
            f"arguments); got {module_args!r}. Example: ['-m', 'polytrain', 'train', '--steps', '50']."
        )
    # the agents' log trees, and the hosts' logs unless log_dir keeps them: removed after any run
    # (the testbed's reaper removes it when this process is killed)
    tmp = Path(tempfile.mkdtemp(prefix=f"polytrain-tb{tb.id}-"))
    try:
        logs = Path(log_dir) if log_dir else tmp
        logs.mkdir(parents=True, exist_ok=True)
        tb.procs_per_host = nproc_per_host
        rdzv_id = f"polytrain-{tb.id}-{uuid.uuid4().hex[:8]}"
        with _host_outputs(tb, logs) as outs:
            procs = {
                i: tb.popen(
                    i,
                    torchrun_command(tb, i, module_args, nproc_per_host, rdzv_id, tmp / f"agent{i}"),
                    env=_host_env(tb, i, env),
                    stdout=outs[i],
                    stderr=outs[i],
                )
                for i in range(tb.hosts)
            }
            for i in range(1, tb.hosts):
                print(f"[testbed {tb.id}] host {i} log: {tb.host_logs[i]}", file=sys.stderr)
            try:
                code = _wait(procs, timeout, fail_grace_s)
            finally:
                netns.stop_processes(list(procs.values()), grace_s=3.0)
        _report_failures(tb, procs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return code


@contextmanager
def _host_outputs(tb: Testbed, logs: Path) -> Iterator[dict[int, IO[Any] | None]]:
    outs: dict[int, IO[Any] | None] = {0: None}
    tb.host_logs = {}
    try:
        for i in range(1, tb.hosts):
            tb.host_logs[i] = logs / f"host{i}.log"
            outs[i] = tb.host_logs[i].open("wb")
        yield outs
    finally:
        for f in outs.values():
            if f is not None:
                f.close()


def _exit_code(code: int) -> int:
    return 128 - code if code < 0 else code  # killed by signal n -> 128 + n, like a shell


def _wait(procs: Mapping[int, subprocess.Popen[bytes]], timeout: float | None, fail_grace_s: float) -> int:
    start = time.monotonic()
    first_fail: tuple[float, int] | None = None
    while True:
        codes = {i: p.poll() for i, p in procs.items()}
        failed = [c for c in codes.values() if c is not None and c != 0]
        if failed and first_fail is None:
            first_fail = (time.monotonic(), _exit_code(failed[0]))
        if all(c is not None for c in codes.values()):
            return first_fail[1] if first_fail else 0
        now = time.monotonic()
        if first_fail and now - first_fail[0] > fail_grace_s:
            return first_fail[1]
        if timeout is not None and now - start > timeout:
            print(f"[testbed] job exceeded timeout={timeout}s; stopping all hosts", file=sys.stderr)
            return 124
        time.sleep(0.1)


def _report_failures(tb: Testbed, procs: Mapping[int, subprocess.Popen[bytes]]) -> None:
    for i, p in procs.items():
        if not p.returncode:
            continue
        where = f"last lines of {tb.host_logs[i]}:" if i in tb.host_logs else "output above."
        print(f"[testbed {tb.id}] host {i} exited with {_exit_code(p.returncode)}; {where}", file=sys.stderr)
        if i in tb.host_logs:
            tail = tb.host_logs[i].read_text(errors="replace").splitlines()[-15:]
            print("\n".join("    " + line for line in tail), file=sys.stderr)
