"""``torchrun`` with its stores bound to one interface:
``python -m polytrain.launch.run --bind ADDR [torchrun arguments]``.

Plain torchrun's agent hosts the c10d rendezvous store on the ``--rdzv-endpoint`` host and binds
it to every interface (``*:port``). This wrapper runs torchrun's own ``main`` with every
TCPStore server it starts bound to ``ADDR`` (an address of this host on the cluster's trusted
network, or 127.0.0.1 for ``--standalone``), and sets ``POLYTRAIN_BIND`` so a store rank 0
creates itself binds there too. ``ADDR`` defaults to 127.0.0.1. A failed worker group is
stopped at once rather than after torch's 30 s grace (see :mod:`polytrain.launch.agent`), and
the agent's log tree (without ``--log-dir``) is removed when torchrun ends. Stopped by a signal
(SIGTERM, Ctrl-C), it says so in one line and exits 128 + the signal, where torchrun prints a
``SignalException`` traceback.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

from polytrain.errors import ConfigError
from polytrain.launch.agent import prompt_stop
from polytrain.launch.stores import BIND_ENV, LOOPBACK, check_bindable, stores_bound_to


def split_bind(argv: list[str]) -> tuple[str, list[str]]:
    """``--bind ADDR`` (or ``--bind=ADDR``) taken out of ``argv``; the rest is torchrun's."""
    addr, rest, i = LOOPBACK, [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--bind" and i + 1 < len(argv):
            addr, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--bind="):
            addr = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    return addr, rest


def main(argv: list[str]) -> None:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun_main

    addr, rest = split_bind(argv)
    try:
        check_bindable(addr)
    except ConfigError as err:
        raise SystemExit(f"error: {err}") from None
    os.environ[BIND_ENV] = addr
    logs = None
    if not any(a.startswith(("--log-dir", "--log_dir")) for a in rest):
        # torch's agent would leave a /tmp/torchelastic_* tree per run: ours is removed after
        logs = tempfile.mkdtemp(prefix="polytrain-torchrun-")
        rest = ["--log-dir", logs, *rest]
    try:
        with stores_bound_to(addr), prompt_stop({}):  # a failed group is stopped at once
            torchrun_main(rest)
    except SignalException as exc:  # torchrun lets it out as a traceback: one line instead
        print(f"polytrain.launch.run: stopped by {exc.sigval.name}; its workers were stopped",
              file=sys.stderr)
        raise SystemExit(128 + int(exc.sigval)) from None
    finally:
        if logs is not None:
            shutil.rmtree(logs, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
