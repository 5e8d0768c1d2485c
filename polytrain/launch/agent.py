"""How the launcher's elastic agent stops ranks after a failure, and who stopped answering.

When a rank fails, torch's process context closes the others with SIGTERM and waits torch's
default 30 s, whatever the launcher's ``shutdown_timeout``. A rank that hangs in a collective
cannot act on SIGTERM (its handler runs only when the collective returns), and a SIGSTOPped one
never sees it. While :func:`prompt_stop` is active the agent instead notes each live rank's
process state and kills the survivors at once (SIGKILL), so a stopped rank is reaped as soon as
its peers time out waiting for it; :func:`unresponsive` then says which rank stopped answering.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from polytrain._torch_compat import pcontext_close

STARTING_GRACE_S = 0.5  # a stop request to ranks that have not trained yet: then SIGKILL
# Linux process states (/proc/PID/stat) of a rank that cannot answer: stopped, traced.
STOPPED_STATES = {"T": "its process was stopped (SIGSTOP)", "t": "its process was stopped by a tracer"}


def process_state(pid: int) -> str | None:
    """The one-letter state of ``pid`` (R, S, D, T, Z...), None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


@contextlib.contextmanager
def prompt_stop(states: dict[int, str], grace_s: float = 10,
                stepped: Callable[[], bool] | None = None) -> Iterator[None]:
    """Inside: when a rank fails, the agent records ``states`` (local rank -> process state of
    each rank still alive, on one host its rank) and kills those ranks at once (SIGKILL),
    instead of SIGTERM and a 30 s wait; a stop on request (the launcher's SIGTERM/SIGINT, passed
    on to the ranks) keeps its signal, with ``grace_s`` to act on it — once a rank has trained
    (``stepped()``; None: always). Ranks still starting have nothing to save: they get
    ``STARTING_GRACE_S`` (a rank acts on a stop request only at a step, and one building a
    large model or waiting for its peers would take the whole grace to get there)."""

    def close(original: Any, self: Any, death_sig: signal.Signals | None, timeout: int) -> None:
        if death_sig is not None:  # a stop on request: the ranks act on the signal
            started = stepped is None or stepped()
            # torch types the timeout int; its close waits until monotonic() + timeout, a float
            original(self, death_sig, int(grace_s) if started else STARTING_GRACE_S)
            return
        for local_rank, pid in self.pids().items():  # a failure: the survivors cannot help
            state = process_state(pid)
            if state is not None and state not in ("Z", "X"):
                states[local_rank] = state
        original(self, signal.SIGKILL, int(grace_s))

    with pcontext_close(close):
        yield


def unresponsive(states: dict[int, str]) -> dict[int, str]:
    """The ranks that stopped answering (rank -> why): stopped processes first; else every
    rank still alive when another failed."""
    alive = states
    stopped = {r: STOPPED_STATES[s] for r, s in alive.items() if s in STOPPED_STATES}
    return stopped or {r: "it was still running but had stopped communicating" for r in alive}


def is_timeout(error: str) -> bool:
    """Whether a rank's error says it timed out waiting for a peer (gloo, NCCL, the store)."""
    text = error.lower()
    return "timed out" in text or "timeout" in text
