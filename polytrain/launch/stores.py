"""Where polytrain's c10d stores live, and who can reach them.

A c10d ``TCPStore`` has no authentication: whoever reaches its port can read and write the
job's rendezvous state, which torch's agent unpickles (PyTorch's own security policy says to run
distributed jobs only on trusted networks). Its server binds every interface by default
(``*:port``, IPv4 and IPv6), and even one bound to 127.0.0.1 is open to every user of the machine.
So:

* local runs of ``polytrain train``/``compare``/``aco`` (:func:`private_rendezvous`): no store
  listens on a socket at all. The launcher's rendezvous and the ranks' process-group store are
  ``FileStore`` files in a directory only this user can enter (0700), so another local user can
  neither read nor write them; the agent's shared TCPStore is switched off (torch's
  ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE``), and gloo's own sockets listen on the loopback
  interface (``GLOO_SOCKET_IFNAME``) instead of the hostname's address. ``--bind ADDR`` asks for
  TCP stores listening on ``ADDR`` instead (below);
* ``polytrain rl``: the same FileStore for its process group (:func:`rank_store_env`);
* the planner's measurements (``polytrain profile``): the same FileStore (:func:`rank_store_env`);
* ``torchrun`` across hosts: torchrun's agent hosts the stores and binds them to every
  interface; ``python -m polytrain.launch.run --bind ADDR ...`` is torchrun with its stores bound
  to ``ADDR`` (see :mod:`polytrain.launch.run`); a rank 0 store polytrain creates itself binds
  ``POLYTRAIN_BIND`` (``polytrain train --bind ADDR``) if set, loopback if ``MASTER_ADDR`` is a
  loopback address, else ``MASTER_ADDR``'s own address.

The bind works by handing the store an already-listening socket (``master_listen_fd``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

import polytrain.env as env
from polytrain._torch_compat import tcp_store_factory
from polytrain.errors import ConfigError

BIND_ENV = env.BIND
LOOPBACK = "127.0.0.1"
STORE_FILE_ENV = env.STORE_FILE  # a rank's process-group FileStore (a local run's)
# torch's dynamic rendezvous hosts a TCPStore for the workers unless this is "1" (torch >= 2.4)
NO_AGENT_STORE_ENV = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


@dataclass(frozen=True)
class Rendezvous:
    """How a local launch's agent and ranks meet: ``LaunchConfig``'s rendezvous fields, and the
    environment the agent and its ranks need while it runs."""

    endpoint: str
    configs: dict[str, Any]
    local_addr: str
    env: dict[str, str] = field(default_factory=dict)


def private_rendezvous(private: Path, bind: str | None, port: int = 0) -> Rendezvous:
    """The rendezvous of a job on this machine alone.

    Without ``bind``: two ``FileStore`` files in ``private``, made a directory only this user can
    enter (0700; a FileStore's file takes the umask, so the directory is what keeps others out):
    ``rendezvous.store`` for torch's agent, ``ranks.store`` for the ranks' process group. A
    FileStore holds the same keys as a TCPStore and takes the same operations (torch's c10d
    rendezvous backend supports it as ``store_type=file``); it costs a file lock per operation,
    which a job uses at start-up, at the end and on a stop request only.
    With ``bind`` (``--bind ADDR``): TCP stores on ``ADDR:port``, as a multi-host job has them;
    this launcher hosts the rendezvous (``is_host``), whatever ``/etc/hosts`` says.
    """
    if bind is not None:
        return Rendezvous(f"{bind}:{port}", {"is_host": True}, bind)
    env = {NO_AGENT_STORE_ENV: "1", **rank_store_env(private)}
    return Rendezvous(str(private / "rendezvous.store"), {"store_type": "file"}, LOOPBACK, env)


def rank_store_env(private: Path) -> dict[str, str]:
    """The environment that makes :func:`rank_store` a FileStore in ``private``, emptied and
    made a directory only this user can enter (0700; a FileStore's file takes the umask, so
    the directory is what keeps others out; a store left by a killed launch would hand its
    keys, dead ranks' addresses, to the next). Gloo then listens on the loopback interface
    instead of the hostname's address (unless ``GLOO_SOCKET_IFNAME`` says otherwise)."""
    shutil.rmtree(private, ignore_errors=True)
    private.mkdir(parents=True, mode=0o700)  # why: created private, no window at the umask's mode
    os.chmod(private, 0o700)  # a umask can only narrow mkdir's mode: this makes it exactly 0700
    env = {STORE_FILE_ENV: str(private / "ranks.store")}
    loopback = loopback_interface()
    if loopback and "GLOO_SOCKET_IFNAME" not in os.environ:
        env["GLOO_SOCKET_IFNAME"] = loopback
    return env


def loopback_interface() -> str | None:
    """The name of this host's loopback interface (``lo`` on Linux), None when unknown."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    return "lo" if "lo" in names else None


def rank_store(timeout: timedelta) -> dist.Store | None:
    """A local run's process-group store (the launcher's private ``FileStore``), else None."""
    path = os.environ.get(STORE_FILE_ENV)
    if not path:
        return None
    store = dist.FileStore(path, -1)
    store.set_timeout(timeout)
    return store


def listening_fd(addr: str, port: int) -> int:
    """A socket listening on ``addr:port`` (port 0: any free one), detached as a file descriptor."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((addr, port))
    sock.listen(512)
    return sock.detach()


def check_bindable(addr: str) -> None:
    """Refuse, before any process starts, an address this host cannot listen on."""
    try:
        ipaddress.ip_address(addr)
    except ValueError:
        raise ConfigError(
            f"--bind {addr!r} is not an IP address. Give an address of this host's trusted "
            "network interface (e.g. 10.0.0.5), or 127.0.0.1 for a run on one machine."
        ) from None
    try:
        os.close(listening_fd(addr, 0))
    except OSError as e:
        raise ConfigError(
            f"--bind {addr}: this host cannot listen there ({e.strerror or e}). Give one of this "
            "host's own addresses (see `ip -brief addr`), or 127.0.0.1 for one machine."
        ) from None


def bind_address(master_addr: str) -> str:
    """Where rank 0's store listens: ``POLYTRAIN_BIND``, else loopback for a loopback master,
    else the master address itself (never all interfaces)."""
    explicit = os.environ.get(BIND_ENV)
    if explicit:
        return explicit
    try:
        resolved = socket.gethostbyname(master_addr)
    except OSError:
        return master_addr
    return LOOPBACK if ipaddress.ip_address(resolved).is_loopback else resolved


def tcp_store(host: str, port: int, world: int | None, is_master: bool, timeout: timedelta,
              bind: str | None = None, **kw: Any) -> dist.TCPStore:
    """A TCPStore whose server (if this process hosts it) listens on ``bind`` only."""
    if is_master and bind is not None and kw.get("master_listen_fd") is None:
        kw["master_listen_fd"] = listening_fd(bind, port)
    return dist.TCPStore(host, port, world, is_master, timeout, **kw)


@contextlib.contextmanager
def stores_bound_to(addr: str) -> Iterator[None]:
    """Within this block, every TCPStore server this process starts (torch elastic's rendezvous
    and agent stores included) listens on ``addr`` only."""
    def bound(real: Any, host_name: str, port: int, *args: Any, **kw: Any) -> dist.TCPStore:
        is_master = kw.get("is_master", args[1] if len(args) > 1 else False)
        if is_master and kw.get("master_listen_fd") is None:
            kw["master_listen_fd"] = listening_fd(addr, port)
        return real(host_name, port, *args, **kw)

    with tcp_store_factory(bound):
        yield
