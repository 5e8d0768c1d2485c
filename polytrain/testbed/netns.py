"""Network-namespace plumbing for the testbed: thin, typed wrappers over ``ip`` and ``tc``.

Everything here runs ``ip``/``tc`` with argument lists (never a shell) and either succeeds or
raises :class:`NetnsError` carrying the failed command and its stderr. Nothing runs at import.
The testbed (:mod:`polytrain.testbed.hosts`) decides *what* to build; this module only knows
*how* to build and take apart one piece at a time.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from polytrain.errors import ConfigError, PolytrainError

NETNS_DIR = Path("/run/netns")

# Linux capability bits (include/uapi/linux/capability.h).
_CAP_NET_ADMIN = 12
_CAP_SYS_ADMIN = 21  # `ip netns add` bind-mounts the namespace under /run/netns


class NetnsError(PolytrainError):
    """An ``ip``/``tc`` command failed; the message holds the command and its stderr."""


@dataclass(frozen=True)
class Shaping:
    """What one egress qdisc does: token-bucket rate, optional netem delay/loss in front.

    ``burst_bytes`` is the bucket depth (bytes that may leave back to back at line speed);
    ``limit_bytes`` is how much may wait in the queue before tail drop (the switch buffer).
    """

    rate_bits_per_s: int
    burst_bytes: int
    limit_bytes: int
    delay_us: int = 0
    loss_percent: float = 0.0

    @property
    def uses_netem(self) -> bool:
        return self.delay_us > 0 or self.loss_percent > 0


# -- link parameters in the units tc/netem understand --------------------------------------
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit|tbit)\s*$", re.IGNORECASE)
_UNIT = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_TIME_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|ms|s)\s*$", re.IGNORECASE)
_LOSS_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


def parse_rate(text: str) -> int:
    """``"100mbit"`` -> 100_000_000 bits/s (decimal units, as ``tc`` reads them)."""
    m = _RATE_RE.match(str(text))
    rate = int(float(m.group(1)) * _UNIT[m.group(2).lower()]) if m else 0
    if not m or not 64_000 <= rate <= 100 * 10**9:
        raise ConfigError(
            f"--nic must be a link rate between 64kbit and 100gbit written as a number and a "
            f"unit (kbit, mbit, gbit); got {text!r}. Examples: 500kbit, 100mbit, 1gbit, 10gbit."
        )
    return rate


def parse_latency(text: str) -> int:
    """``"5ms"`` -> 5000 µs of one-way host-to-host delay."""
    m = _TIME_RE.match(str(text))
    scale = {"us": 1, "ms": 1_000, "s": 1_000_000}
    us = round(float(m.group(1)) * scale[m.group(2).lower()]) if m else 0
    if not m or not 1 <= us <= 10_000_000:
        raise ConfigError(
            f"--latency must be a one-way delay between 1us and 10s with a unit (us, ms, s); "
            f"got {text!r}. Examples: 200us, 5ms, 0.1s."
        )
    return us


def parse_loss(text: str) -> float:
    """``"0.1%"`` -> 0.1 (percent of packets dropped host to host)."""
    m = _LOSS_RE.match(str(text))
    if not m or not 0 < float(m.group(1)) < 100:
        raise ConfigError(
            f"--loss must be a percentage above 0 and below 100 written with '%'; got {text!r}. "
            "Examples: 0.01%, 0.5%, 2%."
        )
    return float(m.group(1))


# -- running ip/tc ---------------------------------------------------------------------------
def run(args: list[str], *, check: bool = True, timeout: float = 30.0) -> str:
    """Run one ``ip``/``tc`` command; return stdout, raise :class:`NetnsError` on failure."""
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise NetnsError(f"command failed (exit {proc.returncode}): {' '.join(args)}\n{proc.stderr.strip()}")
    return proc.stdout


def _effective_caps() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def missing_privileges() -> str | None:
    """Why this process cannot build a testbed, or None when it can.

    Needs the ``ip`` and ``tc`` binaries (iproute2) and CAP_NET_ADMIN + CAP_SYS_ADMIN (root).
    """
    missing_bins = [b for b in ("ip", "tc") if shutil.which(b) is None]
    if missing_bins:
        return (
            f"the testbed needs the {' and '.join(missing_bins)} command(s) from iproute2, "
            "which are not on PATH. Install them with `apt-get install iproute2` "
            "(or your distribution's iproute2 package)."
        )
    caps = _effective_caps()
    lacking = [
        name
        for bit, name in ((_CAP_NET_ADMIN, "CAP_NET_ADMIN"), (_CAP_SYS_ADMIN, "CAP_SYS_ADMIN"))
        if not caps >> bit & 1
    ]
    if lacking:
        return (
            f"the testbed creates network namespaces, veth links and qdiscs, which needs "
            f"{' and '.join(lacking)} (uid {os.geteuid()} lacks {'them' if len(lacking) > 1 else 'it'}). "
            "Run as root, e.g. "
            "`sudo polytrain testbed ...`, or in a container started with --cap-add NET_ADMIN "
            "--cap-add SYS_ADMIN."
        )
    return None


def list_netns() -> set[str]:
    """Names of all named network namespaces on this machine (``ip netns list``)."""
    names = set()
    for line in run(["ip", "netns", "list"]).splitlines():
        if line.strip():
            names.add(line.split()[0])
    return names


def add_netns(name: str) -> bool:
    """Create namespace ``name`` with loopback up; False if the name is already taken.

    ``ip netns add`` creates /run/netns/NAME with O_EXCL, so this is an atomic claim.
    """
    proc = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if proc.returncode != 0:
        if (NETNS_DIR / name).exists():
            return False
        raise NetnsError(f"ip netns add {name} failed: {proc.stderr.strip()}")
    run(["ip", "-n", name, "link", "set", "lo", "up"])
    return True


def del_netns(name: str) -> None:
    """Delete namespace ``name`` (its veth ends and bridges go with it); absent is fine."""
    if (NETNS_DIR / name).exists():
        run(["ip", "netns", "del", name], check=False)


def netns_pids(name: str) -> list[int]:
    """PIDs of processes living in namespace ``name`` (``ip netns pids``)."""
    if not (NETNS_DIR / name).exists():
        return []
    out = run(["ip", "netns", "pids", name], check=False)
    return [int(tok) for tok in out.split() if tok.isdigit()]


def kill_netns_processes(name: str, grace_s: float = 3.0) -> None:
    """SIGTERM every process in ``name``, SIGKILL what is left after ``grace_s``.

    A namespace with a process still inside survives ``ip netns del`` (with its links), so this
    must run, and finish, before the namespace is deleted.
    """
    deadline = time.monotonic() + grace_s
    sig = signal.SIGTERM
    while pids := netns_pids(name):
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, sig)
        time.sleep(0.05)
        if time.monotonic() > deadline:
            sig = signal.SIGKILL
        if time.monotonic() > deadline + 10.0:
            raise NetnsError(f"processes {pids} in namespace {name} survive SIGKILL")


def add_bridge(ns: str, bridge: str) -> None:
    """A Linux bridge (the emulated switch) inside namespace ``ns``."""
    run(["ip", "-n", ns, "link", "add", bridge, "type", "bridge"])
    run(["ip", "-n", ns, "link", "set", bridge, "addrgenmode", "none"])
    run(["ip", "-n", ns, "link", "set", bridge, "up"])


def add_host_link(bridge_ns: str, bridge: str, port: str, host_ns: str, ifname: str, cidr: str) -> None:
    """Veth pair ``port`` (bridge side, in ``bridge_ns``) <-> ``ifname`` (in ``host_ns``).

    The pair is created directly inside the bridge namespace and its peer moved straight into
    the host namespace, so no interface ever appears in the machine's own namespace.
    """
    run(
        ["ip", "-n", bridge_ns, "link", "add", port, "type", "veth", "peer", "name", ifname, "netns", host_ns]
    )
    # No IPv6 link-local addresses: no DAD/router-solicitation chatter in the NIC counters.
    # GSO stays on (one 64 KiB super-packet per skb): with one frame per skb (gso_max_segs 1)
    # this 2-core VM tops out near 350 Mbit/s; tbf still charges every segment's headers.
    for ns, dev in ((bridge_ns, port), (host_ns, ifname)):
        run(["ip", "-n", ns, "link", "set", dev, "addrgenmode", "none"])
    run(["ip", "-n", bridge_ns, "link", "set", port, "master", bridge])
    run(["ip", "-n", bridge_ns, "link", "set", port, "up"])
    run(["ip", "-n", host_ns, "addr", "add", cidr, "dev", ifname])
    run(["ip", "-n", host_ns, "link", "set", ifname, "up"])


def shape(ns: str, dev: str, s: Shaping) -> None:
    """Put the egress qdisc(s) ``s`` on ``dev`` in ``ns``: tbf, or netem with a tbf child."""
    tbf = ["tbf", "rate", f"{s.rate_bits_per_s}bit", "burst", str(s.burst_bytes), "limit", str(s.limit_bytes)]
    base = ["tc", "-n", ns, "qdisc", "replace", "dev", dev]
    if not s.uses_netem:
        run([*base, "root", "handle", "1:", *tbf])
        return
    # netem holds every delayed packet: room for rate x delay of ~1000-byte packets, twice over.
    in_flight = s.rate_bits_per_s / 8 * s.delay_us / 1e6
    netem = ["netem", "limit", str(1000 + int(2 * in_flight / 1000))]
    if s.delay_us:
        netem += ["delay", f"{s.delay_us}us"]
    if s.loss_percent:
        netem += ["loss", f"{s.loss_percent:g}%"]
    run([*base, "root", "handle", "1:", *netem])
    run([*base, "parent", "1:1", "handle", "10:", *tbf])


def netem_available() -> bool:
    """Whether this kernel has the netem qdisc (sch_netem), probed in a scratch namespace."""
    scratch = f"polytrain-probe-{uuid.uuid4().hex[:8]}"
    if not add_netns(scratch):
        return False
    try:
        proc = subprocess.run(
            ["tc", "-n", scratch, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
            capture_output=True,
            text=True,
            check=False,
        )
        return proc.returncode == 0
    finally:
        del_netns(scratch)


def link_bytes(ns: str, dev: str) -> dict[str, int]:
    """``{"tx": bytes, "rx": bytes}`` of interface ``dev`` in ``ns`` (kernel NIC counters)."""
    info = json.loads(run(["ip", "-n", ns, "-j", "-s", "link", "show", "dev", dev]))
    stats = info[0].get("stats64") or info[0]["stats"]
    return {"tx": int(stats["tx"]["bytes"]), "rx": int(stats["rx"]["bytes"])}


def shaped_bytes(ns: str, dev: str) -> int:
    """Bytes the tbf on ``dev``'s egress passed: every Ethernet frame's length, headers included.

    Unlike the interface counter, which counts a GSO super-packet (up to 64 KiB of TCP payload)
    with its headers once, this counts the headers of every ~1500-byte segment, as the shaper
    charged them: what a real NIC would have put on the wire, minus preamble, FCS and gap.
    """
    for q in json.loads(run(["tc", "-s", "-j", "-n", ns, "qdisc", "show", "dev", dev])):
        if q.get("kind") == "tbf":
            return int(q["bytes"])
    raise NetnsError(f"no tbf qdisc on {dev} in {ns}")


def routes_overlap(prefix: str) -> bool:
    """Whether the machine's own namespace has an address or route inside ``prefix``.

    ``prefix`` is the first three octets (``"10.213.7"``); used to skip subnets that
    something else on this machine already uses, so addresses are never ambiguous.
    """
    text = run(["ip", "-4", "-o", "addr", "show"]) + run(
        ["ip", "-4", "route", "show", "table", "all"], check=False
    )
    return any(tok.startswith(prefix + ".") for tok in text.split())


# -- ownership: which testbed id (= subnet octet) belongs to which live process --------------
OWNER_DIR = Path("/run/polytrain-testbed")
NS_PREFIX = "polytrain-"


def switch_ns_name(tb_id: str) -> str:
    return f"{NS_PREFIX}{tb_id}-sw"


def _proc_start(pid: int) -> str:
    """Start time of ``pid`` (field 22 of /proc/PID/stat), to tell a reused pid apart."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _owner_alive(owner_file: Path) -> bool:
    """The claim's owner runs (a zombie, killed but not yet waited for by its parent, does not:
    the reaper saw one as alive and left its testbed standing)."""
    try:
        pid_text, start = owner_file.read_text().split()
    except (OSError, ValueError):
        return False
    return _proc_start(int(pid_text)) == start and _live(int(pid_text))


def claim_id() -> str | None:
    """Claim a free testbed id ``XX`` (2 hex digits = subnet octet); None if none is free.

    The claim is the O_EXCL owner file ``OWNER_DIR/XX.pid`` (our pid and start time), then
    the switch namespace (also O_EXCL). Ids whose namespaces exist, or whose 10.213.X.0/24
    shows up in the machine's own addresses or routes, are skipped.
    """
    OWNER_DIR.mkdir(mode=0o755, exist_ok=True)
    taken = {n[len(NS_PREFIX) :].split("-")[0] for n in list_netns() if n.startswith(NS_PREFIX)}
    octets = list(range(1, 255))
    random.shuffle(octets)  # concurrent starters rarely race for the same id
    me = f"{os.getpid()} {_proc_start(os.getpid())}"
    for octet in octets:
        cand = f"{octet:02x}"
        if cand in taken or routes_overlap(f"10.213.{octet}"):
            continue
        owner, tmp = OWNER_DIR / f"{cand}.pid", OWNER_DIR / f".{cand}.{os.getpid()}.tmp"
        tmp.write_text(me)
        try:
            os.link(tmp, owner)  # atomic and complete: never an empty owner file to misread
        except FileExistsError:
            continue
        finally:
            tmp.unlink()
        if add_netns(switch_ns_name(cand)):
            return cand
        owner.unlink(missing_ok=True)
    return None


def release_id(tb_id: str) -> None:
    (OWNER_DIR / f"{tb_id}.pid").unlink(missing_ok=True)


# The reaper: a small process in its own session (a SIGKILL or Ctrl-C of the testbed's group
# does not reach it) that waits while the testbed's owner lives and holds its claim; when the
# owner dies without tearing down (SIGKILL), it kills every process left in the namespaces and
# deletes them at once. Before, six ranks went on training inside for as long as nobody started
# another testbed (issue 50, item 7). A testbed torn down normally releases its claim, and its
# reaper then ends.
REAP = "import sys; from polytrain.testbed.netns import reap; reap(int(sys.argv[1]), sys.argv[2])"
REAP_POLL_S = 0.1
REAP_GRACE_S = 1.0  # SIGTERM to what is left inside, then SIGKILL: all gone within 5 s


def _live(pid: int) -> bool:
    """``pid`` runs (a zombie, dead but not yet waited for, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def start_reaper(tb_id: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", REAP, str(os.getpid()), tb_id],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)


def reap(owner: int, tb_id: str) -> None:
    claim = OWNER_DIR / f"{tb_id}.pid"
    while _live(owner) and _owner_alive(claim):
        time.sleep(REAP_POLL_S)
    if claim.exists() and not _owner_alive(claim):  # died holding it: nobody tore it down
        cleanup_stale(REAP_GRACE_S)
        for logs in Path(tempfile.gettempdir()).glob(f"polytrain-tb{tb_id}-*"):
            shutil.rmtree(logs, ignore_errors=True)


def cleanup_stale(grace_s: float = 3.0) -> list[str]:
    """Delete testbeds whose owner process is gone (e.g. it got SIGKILL); return the names.
    ``grace_s``: between SIGTERM and SIGKILL to the processes left inside."""
    removed: list[str] = []
    for name in sorted(list_netns()):
        m = re.fullmatch(re.escape(NS_PREFIX) + r"([0-9a-f]{2})-(?:sw|h\d+)", name)
        if m and not _owner_alive(OWNER_DIR / f"{m.group(1)}.pid"):
            kill_netns_processes(name, grace_s)
            del_netns(name)
            removed.append(name)
    for owner in OWNER_DIR.glob("*.pid") if OWNER_DIR.is_dir() else []:
        if not _owner_alive(owner):
            owner.unlink(missing_ok=True)
    return removed


def stop_processes(procs: list[subprocess.Popen[bytes]], grace_s: float) -> None:
    """SIGTERM each process group, SIGKILL after ``grace_s``, reap them all."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        live = [p for p in procs if p.poll() is None]
        for p in live:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, sig)
        deadline = time.monotonic() + wait_s
        while any(p.poll() is None for p in live) and time.monotonic() < deadline:
            time.sleep(0.05)
