"""Where polytrain's c10d stores listen.

A c10d ``TCPStore`` has no authentication: whoever reaches its port can read and write the
job's rendezvous state (PyTorch's own security policy says to run distributed jobs only on
trusted networks). Its server binds every interface by default (``*:port``, IPv4 and IPv6).
A run on one machine needs none of that, so polytrain binds its stores where the job needs them:

* local runs (``polytrain train``/``compare``, RL, the planner's measurements): the launcher's
  rendezvous and agent stores and rank 0's store listen on 127.0.0.1 only;
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
import socket
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from polytrain.errors import ConfigError

BIND_ENV = "POLYTRAIN_BIND"
LOOPBACK = "127.0.0.1"


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
    import torch.distributed.elastic.rendezvous.c10d_rendezvous_backend as c10d_backend

    real = dist.TCPStore

    def bound(host_name: str, port: int, *args: Any, **kw: Any) -> dist.TCPStore:
        is_master = kw.get("is_master", args[1] if len(args) > 1 else False)
        if is_master and kw.get("master_listen_fd") is None:
            kw["master_listen_fd"] = listening_fd(addr, port)
        return real(host_name, port, *args, **kw)

    patched = [(dist, "TCPStore"), (c10d_backend, "TCPStore")]
    for module, name in patched:
        setattr(module, name, bound)
    try:
        yield
    finally:
        for module, name in patched:
            setattr(module, name, real)
