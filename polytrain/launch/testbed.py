"""Emulated multi-host cluster on one machine: N network namespaces joined by shaped links.

Topology for ``Testbed(hosts=3, nic="1gbit")`` that got id ``2a`` (subnet 10.213.42.0/24)::

    machine's own netns: untouched (no interface, address or route is added there)

     netns polytrain-2a-h0      netns polytrain-2a-h1      netns polytrain-2a-h2
     lo up                      lo up                      lo up
     pt2ah0 10.213.42.10/24     pt2ah1 10.213.42.11/24     pt2ah2 10.213.42.12/24
       |  egress: tbf 1gbit       |  egress: tbf 1gbit       |  egress: tbf 1gbit
       |  (+ netem delay/loss)    |  (+ netem delay/loss)    |  (+ netem delay/loss)
       | veth                     | veth                     | veth
     pt2ap0                     pt2ap1                     pt2ap2
       |  egress: tbf 1gbit       |  egress: tbf 1gbit       |  egress: tbf 1gbit
    +--+--------------------------+--------------------------+---------------------+
    |  bridge pt2asw                        in netns polytrain-2a-sw (the switch)  |
    +------------------------------------------------------------------------------+

Every packet from host a to host b leaves through exactly one host-side egress (a's, where
delay and loss are applied once) and one bridge-side egress (b's port), each a token bucket
at RATE; so each host's NIC sends and receives at most RATE, full duplex, and N-to-1 traffic
queues at the receiver's switch port (100 ms of buffer) like on a real switch.

Naming: the id is two hex digits ``XX`` = the third octet of the testbed's subnet
10.213.<0xXX>.0/24. It is claimed atomically (an O_EXCL owner file
``/run/polytrain-testbed/XX.pid`` holding the owner's pid, then ``ip netns add``) after
skipping ids whose namespaces exist or whose subnet appears in the machine's addresses or
routes, so concurrent testbeds never share names or subnets. Namespaces are
``polytrain-XX-h<i>`` and ``polytrain-XX-sw``; interfaces (<= 15 chars) ``ptXXh<i>`` (host),
``ptXXp<i>`` (switch port), ``ptXXsw`` (bridge). Host i is 10.213.<X>.(10+i): two-digit last
octets keep string order equal to host order, which torch's c10d rendezvous uses to give
host i node rank i (so global rank 0 runs on host 0, whose output reaches the terminal).
Testbeds whose owner died (kill -9) are removed by ``netns.cleanup_stale()`` (run at every start).

Latency and loss need the kernel's netem qdisc (sch_netem); it is probed at start-up and,
when missing, a request for them is refused (ConfigError), never approximated.

Measured on the shared 2-core development machine (kernel 6.18 without netem; +-5 % between
runs), ``sudo .venv/bin/python benchmarks/testbed_bandwidth.py``, results in
``benchmarks/results/testbed_bandwidth.md`` (2026-11-22): gloo all-reduce of a 4 MiB float32
tensor, 1 process per host, 8 timed after 2 warm-ups; bus bandwidth = 2(n-1)/n * bytes / time
(as nccl-tests define it), slowest rank::

    | hosts | nic     | bus bandwidth | % of rate | NIC tx / payload | wire tx / payload |
    |-------|---------|---------------|-----------|------------------|-------------------|
    | 2     | 100mbit | 93.4 Mbit/s   | 93 %      | 1.045            | 1.055             |
    | 2     | 1gbit   | 950 Mbit/s    | 95 %      | 1.002            | 1.047             |
    | 4     | 100mbit | 89.7 Mbit/s   | 90 %      | 1.047            | 1.053             |
    | 4     | 1gbit   | 594 Mbit/s    | 59 %      | 1.004            | 1.049             |

At 4 hosts and 1gbit the two cores, shared by four gloo processes and the shapers, are the
limit, not the emulated link: above 2 hosts at ~1gbit this machine does not reach the rate.
RATE counts Ethernet frames (headers, no preamble/FCS/gap), so bulk TCP tops out at
1448/1514 = 95.6 % of it; one plain TCP stream measured 0.479 Mbit/s at 500kbit, 95.6 at
100mbit, 956 at 1gbit, and 8.0 Gbit/s at 10gbit, where this VM's CPU, not the shaper, is the
limit (beyond ~1gbit, check that the rate is reached before trusting a result).
"NIC"/"wire" are ``interface_bytes()``'s tx / tx_wire.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import IO, Any

from polytrain.errors import ConfigError
from polytrain.launch import netns
from polytrain.launch.netns import Shaping, parse_latency, parse_loss, parse_rate

MAX_HOSTS = 90  # host addresses .10-.99: two digits keep string order == host order
RDZV_PORT = 29400
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _check_hosts(hosts: int) -> int:
    if isinstance(hosts, bool) or not isinstance(hosts, int) or not 1 <= hosts <= MAX_HOSTS:
        raise ConfigError(
            f"--hosts must be an integer from 1 to {MAX_HOSTS} (one /24 per testbed, host "
            f"addresses .10-.99); got {hosts!r}. Example: --hosts 4."
        )
    return hosts


class Testbed:
    """N emulated hosts on shaped links; ``with Testbed(4, "1gbit") as tb: ...``.

    The constructor only validates. Entering builds the namespaces, links and qdiscs and
    installs SIGINT/SIGTERM/SIGHUP handlers; leaving (normally, by an exception, or by one of
    those signals) kills every process inside and deletes everything it built.
    """

    def __init__(self, hosts: int, nic: str, *, latency: str | None = None, loss: str | None = None) -> None:
        self.hosts = _check_hosts(hosts)
        self.nic = str(nic).strip().lower()
        self.rate_bits_per_s = parse_rate(nic)
        self.latency = latency
        self.loss = loss
        self._delay_us = parse_latency(latency) if latency is not None else 0
        self._loss_pct = parse_loss(loss) if loss is not None else 0.0
        self.id: str = ""
        self.procs_per_host: int | None = None
        self.host_logs: dict[int, Path] = {}
        self._namespaces: list[str] = []
        self._procs: list[subprocess.Popen[bytes]] = []
        self._old_handlers: dict[int, Any] = {}

    # -- names and addresses -------------------------------------------------------------
    @property
    def subnet(self) -> str:
        return f"10.213.{int(self.id, 16)}.0/24"

    @property
    def switch_ns(self) -> str:
        return netns.switch_ns_name(self.id)

    def host_ns(self, i: int) -> str:
        return f"{netns.NS_PREFIX}{self.id}-h{i}"

    def host_ifname(self, i: int) -> str:
        return f"pt{self.id}h{i}"

    def host_addr(self, i: int) -> str:
        return f"10.213.{int(self.id, 16)}.{10 + i}"

    @property
    def namespaces(self) -> list[str]:
        """Namespaces this testbed created and still owns."""
        return list(self._namespaces)

    # -- life cycle ----------------------------------------------------------------------
    def __enter__(self) -> Testbed:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> None:
        """Build the testbed; on any failure (or signal) tear down what was built, re-raise."""
        if self._namespaces:
            raise ConfigError(f"testbed {self.id} is already up; leave its `with` block before reusing it.")
        if problem := netns.missing_privileges():
            raise ConfigError(f"Cannot build a testbed: {problem}")
        if (self._delay_us or self._loss_pct) and not netns.netem_available():
            raise ConfigError(
                f"--latency/--loss (got latency={self.latency!r}, loss={self.loss!r}) need the "
                "kernel's netem qdisc, and this kernel lacks sch_netem (`tc qdisc add ... "
                "netem` says 'Specified qdisc kind is unknown'); polytrain will not fake delay "
                "or loss. Drop --latency/--loss to emulate bandwidth only, or run on a kernel "
                "with CONFIG_NET_SCH_NETEM (e.g. `modprobe sch_netem`; on Debian/Ubuntu it is "
                "in linux-modules-extra-$(uname -r))."
            )
        self._install_signal_handlers()
        try:
            netns.cleanup_stale()
            self._claim_id()
            self._build()
        except BaseException:
            self.down()
            raise

    def _claim_id(self) -> None:
        tb_id = netns.claim_id()
        if tb_id is None:
            raise ConfigError(
                "No free testbed id/subnet: all 254 subnets 10.213.1-254.0/24 are used by other "
                "testbeds or this machine's routes. Stop other testbeds (`ip netns list | grep "
                "polytrain-`) or remove dead ones with polytrain.launch.netns.cleanup_stale()."
            )
        self.id = tb_id
        self._namespaces.append(self.switch_ns)

    def _shaping(self, *, host_side: bool) -> Shaping:
        rate_bytes = self.rate_bits_per_s / 8
        # Bucket: 4 ms of line rate, at least two full frames; queue: 100 ms more (switch buffer).
        burst = max(3028, int(rate_bytes * 0.004))
        return Shaping(
            rate_bits_per_s=self.rate_bits_per_s,
            burst_bytes=burst,
            limit_bytes=burst + int(rate_bytes * 0.1),
            delay_us=self._delay_us if host_side else 0,
            loss_percent=self._loss_pct if host_side else 0.0,
        )

    def _port(self, i: int) -> str:
        return f"pt{self.id}p{i}"

    def _build(self) -> None:
        bridge = f"pt{self.id}sw"
        netns.add_bridge(self.switch_ns, bridge)
        for i in range(self.hosts):
            ns, ifname, port = self.host_ns(i), self.host_ifname(i), self._port(i)
            if not netns.add_netns(ns):
                raise netns.NetnsError(f"namespace {ns} already exists although id is ours")
            self._namespaces.append(ns)
            netns.add_host_link(self.switch_ns, bridge, port, ns, ifname, f"{self.host_addr(i)}/24")
            netns.shape(ns, ifname, self._shaping(host_side=True))
            netns.shape(self.switch_ns, port, self._shaping(host_side=False))

    def down(self) -> None:
        """Kill every process inside, delete every namespace (links and bridge go with them).

        Idempotent; signals are ignored while it runs so a second Ctrl-C cannot cut it short.
        """
        errors: list[str] = []
        with _signals_ignored():
            netns.stop_processes(self._procs, grace_s=3.0)
            self._procs.clear()
            for ns in reversed(self._namespaces):
                try:
                    netns.kill_netns_processes(ns)
                    netns.del_netns(ns)
                except netns.NetnsError as e:
                    errors.append(str(e))
            self._namespaces = [ns for ns in self._namespaces if (netns.NETNS_DIR / ns).exists()]
            if self.id and not self._namespaces:
                netns.release_id(self.id)
        self._restore_signal_handlers()
        if errors or self._namespaces:
            raise netns.NetnsError(
                f"testbed {self.id} teardown left {self._namespaces}: {'; '.join(errors)}. "
                "Remove them with `ip netns del NAME` as root."
            )

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # only the main thread may set handlers; rely on with-block unwinding

        def handler(signum: int, frame: FrameType | None) -> None:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)

        for sig in _SIGNALS:
            self._old_handlers[sig] = signal.signal(sig, handler)

    def _restore_signal_handlers(self) -> None:
        for sig, old in self._old_handlers.items():
            signal.signal(sig, old)
        self._old_handlers.clear()

    # -- using it ------------------------------------------------------------------------
    def popen(
        self,
        host: int,
        argv: list[str],
        *,
        env: Mapping[str, str] | None = None,
        stdout: IO[Any] | int | None = None,
        stderr: IO[Any] | int | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside host ``host``'s namespace; it is killed at teardown."""
        if not self._namespaces or not 0 <= host < self.hosts:
            raise ConfigError(
                f"host must be 0..{self.hosts - 1} of a started testbed; "
                f"got {host} (use `with Testbed(...) as tb:`)."
            )
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.host_ns(host), *argv],
            env=dict(env) if env is not None else None,
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: Ctrl-C reaches us, we stop it
        )
        self._procs.append(proc)
        return proc

    def interface_bytes(self) -> dict[int, dict[str, int]]:
        """Byte counters of each host's NIC since the testbed started, by host index.

        ``tx``/``rx``: the kernel interface counters (``ip -s link``). They count a GSO
        super-packet's headers once, so TCP payload + ~0.3 % above ~130mbit, where the shaper
        passes super-packets whole, and + ~5 % at or below, where it splits them.
        ``tx_wire``/``rx_wire``: what the host's and its switch port's shapers charged, every
        frame's headers included, at any rate (payload + ~4.6 % for bulk TCP at MTU 1500).
        """
        out = {}
        for i in range(self.hosts):
            out[i] = netns.link_bytes(self.host_ns(i), self.host_ifname(i))
            out[i]["tx_wire"] = netns.shaped_bytes(self.host_ns(i), self.host_ifname(i))
            out[i]["rx_wire"] = netns.shaped_bytes(self.switch_ns, self._port(i))
        return out


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


@contextmanager
def _signals_ignored() -> Iterator[None]:
    """Ignore SIGINT/SIGTERM/SIGHUP inside the block (main thread only), then restore."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in _SIGNALS}
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)


def torchrun_command(
    tb: Testbed, host: int, program: list[str], nproc_per_host: int, rdzv_id: str
) -> list[str]:
    """The torchrun agent command for ``host``: fixed-size c10d rendezvous at host 0.

    ``--nnodes N`` (min = max) makes the rendezvous wait for exactly N agents. Host 0 serves
    the rendezvous store (``is_host=1``, explicit: torch's own guess compares the endpoint to
    the machine's hostname, which all namespaces share). ``--node-rank`` is not passed: c10d
    ignores it and orders agents by ``--local-addr``, which is chosen so host i is node rank i.
    ``--local-addr`` is also what the workers' MASTER_ADDR becomes, so it must be routable.
    """
    return [
        sys.executable, "-m", "torch.distributed.run",
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
        POLYTRAIN_TESTBED_ID=tb.id,
        POLYTRAIN_TESTBED_HOST=str(host),
        POLYTRAIN_TESTBED_RECORD=json.dumps(testbed_record(tb)),  # for the job's summary.json
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
    logs = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix=f"polytrain-tb{tb.id}-"))
    logs.mkdir(parents=True, exist_ok=True)
    tb.procs_per_host = nproc_per_host
    rdzv_id = f"polytrain-{tb.id}-{uuid.uuid4().hex[:8]}"
    with _host_outputs(tb, logs) as outs:
        procs = {
            i: tb.popen(
                i,
                torchrun_command(tb, i, module_args, nproc_per_host, rdzv_id),
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
