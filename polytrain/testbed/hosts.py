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
A job runs on a testbed through `testbed.torchrun.run_torchrun` (one torchrun agent per host).

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

import signal
import subprocess
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import IO, Any

from polytrain.errors import ConfigError
from polytrain.testbed import netns
from polytrain.testbed.netns import Shaping, parse_latency, parse_loss, parse_rate

MAX_HOSTS = 90  # host addresses .10-.99: two digits keep string order == host order
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
                "polytrain-`) or remove dead ones with polytrain.testbed.netns.cleanup_stale()."
            )
        self.id = tb_id
        self._namespaces.append(self.switch_ns)
        netns.start_reaper(tb_id)  # removes it all if this process dies without tearing down

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
