"""A local run listens on loopback only: every listening TCP socket of the launcher and its ranks
(the c10d rendezvous and agent stores, rank 0's store, gloo's pairs) is bound to 127.0.0.1/::1.
Read from /proc while the job runs, as an operator's ``ss -ltnp`` would."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from polytrain.errors import ConfigError
from polytrain.launch.run import split_bind
from polytrain.launch.stores import BIND_ENV, bind_address, check_bindable, listening_fd

ROOT = Path(__file__).resolve().parent.parent
LISTEN = "0A"


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _tree(root: int) -> set[int]:
    seen, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo += _children(pid)
    return seen


def _socket_inodes(pids: set[int]) -> set[str]:
    inodes = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue  # the process ended meanwhile
    return inodes


def _address(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return str(ipaddress.IPv6Address(words))


def _listening(inodes: set[str]) -> set[tuple[str, int]]:
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == LISTEN and f[9] in inodes:
                addr, port = f[1].split(":")
                found.add((_address(addr), int(port, 16)))
    return found


def _exposed_while_running(cmd: list[str], cwd: Path) -> tuple[set[tuple[str, int]], set[tuple[str, int]]]:
    """Run ``cmd`` to its end, polling its process tree's listening sockets; (all, non-loopback)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    seen: set[tuple[str, int]] = set()
    try:
        while proc.poll() is None:
            seen |= _listening(_socket_inodes(_tree(proc.pid)))
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    assert len(seen) >= 2, f"too few listening sockets seen to judge: {seen}"
    return seen, {(a, p) for a, p in seen if not ipaddress.ip_address(a).is_loopback}


@pytest.mark.slow
def test_a_local_run_listens_on_loopback_only(tmp_path: Path) -> None:
    seen, exposed = _exposed_while_running(
        [sys.executable, "-m", "polytrain", "train", "--procs", "2", "--steps", "150", "--no-report",
         "--out", str(tmp_path / "run")], tmp_path)
    assert not exposed, f"sockets listening beyond loopback: {sorted(exposed)} (all: {sorted(seen)})"


@pytest.mark.slow
def test_torchrun_through_polytrain_run_binds_its_stores(tmp_path: Path) -> None:
    """``python -m polytrain.launch.run --bind ADDR`` is torchrun whose agent stores (which plain
    torchrun binds to every interface) listen on ADDR only."""
    seen, exposed = _exposed_while_running(
        [sys.executable, "-m", "polytrain.launch.run", "--bind", "127.0.0.1", "--standalone",
         "--nproc-per-node", "2", "-m", "polytrain", "train", "--model", "mlp", "--steps", "150",
         "--no-report", "--out", str(tmp_path / "run")], tmp_path)
    assert not exposed, f"sockets listening beyond loopback: {sorted(exposed)} (all: {sorted(seen)})"


def test_bind_refuses_what_this_host_cannot_listen_on() -> None:
    with pytest.raises(ConfigError, match="not an IP address"):
        check_bindable("eth0")
    with pytest.raises(ConfigError, match="cannot listen there"):
        check_bindable("192.0.2.254")  # TEST-NET-1: never an address of this host
    check_bindable("127.0.0.1")
    assert split_bind(["--bind", "10.0.0.1", "--standalone", "-m", "x"]) == (
        "10.0.0.1", ["--standalone", "-m", "x"])
    assert split_bind(["--bind=::1", "a"]) == ("::1", ["a"])
    assert split_bind(["a"])[0] == "127.0.0.1"


def test_rank0_store_binds_loopback_or_the_master_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BIND_ENV, raising=False)
    assert bind_address("127.0.0.1") == "127.0.0.1"
    assert bind_address("localhost") == "127.0.0.1"
    assert bind_address("10.1.2.3") == "10.1.2.3"  # a multi-host master: its own address, not *
    monkeypatch.setenv(BIND_ENV, "192.0.2.7")
    assert bind_address("127.0.0.1") == "192.0.2.7"


def test_listening_fd_is_bound_where_asked() -> None:
    fd = listening_fd("127.0.0.1", 0)
    with socket.socket(fileno=fd) as s:
        assert s.getsockname()[0] == "127.0.0.1"


def _own_address() -> str | None:
    """A non-loopback IPv4 address of one of this host's interfaces (None: there is none)."""
    import fcntl
    import struct

    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:  # SIOCGIFADDR
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue
        addr = socket.inet_ntoa(packed[20:24])
        if not ipaddress.ip_address(addr).is_loopback:
            return addr
    return None


@pytest.mark.slow
def test_bind_to_this_host_s_own_address_hosts_the_store_there(tmp_path: Path) -> None:
    """Issue 50 item 6: with the hostname mapped to 127.0.0.1 (/etc/hosts here), torch took this
    host's own interface address for another host's and waited as a store client; the launcher
    now hosts its rendezvous store on the --bind address itself."""
    addr = _own_address()
    if addr is None:
        pytest.skip("this host has no non-loopback IPv4 address")
    seen, exposed = _exposed_while_running(
        [sys.executable, "-m", "polytrain", "train", "--bind", addr, "--procs", "2", "--steps", "60",
         "--no-report", "--out", str(tmp_path / "run")], tmp_path)
    assert addr in {a for a, _ in exposed}, f"no store listened on {addr}: {sorted(seen)}"
    assert {a for a, _ in exposed} <= {addr}, f"listening beyond {addr}: {sorted(exposed)}"


def test_a_private_store_directory_is_fresh_and_the_user_s_alone(tmp_path: Path) -> None:
    """The FileStores of a local run (and of `polytrain rl`) live in a 0700 directory that starts
    empty: a store left by a killed launch would hand the dead ranks' addresses to the next."""
    from polytrain.launch.stores import STORE_FILE_ENV, private_rendezvous, rank_store_env

    private = tmp_path / "agent"
    private.mkdir(mode=0o755)
    (private / "ranks.store").write_text("stale keys")
    env = rank_store_env(private)
    assert env[STORE_FILE_ENV] == str(private / "ranks.store") and not any(private.iterdir())
    assert private.stat().st_mode & 0o777 == 0o700
    rdzv = private_rendezvous(private, None)
    assert rdzv.configs == {"store_type": "file"} and rdzv.endpoint == str(private / "rendezvous.store")
    assert rdzv.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    tcp = private_rendezvous(private, "127.0.0.1", 29400)  # --bind: TCP stores there
    assert (tcp.endpoint, tcp.configs, tcp.env) == ("127.0.0.1:29400", {"is_host": True}, {})
