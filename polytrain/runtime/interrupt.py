"""Stopping a run on request (SIGTERM, Ctrl-C) at a step every rank agrees on.

The launcher's agent forwards SIGTERM/SIGINT to every rank (Ctrl-C in a terminal reaches them
all directly). A rank's handler only sets a flag; the training loop reads it once per step (a
Python attribute read, nothing sent). The first rank that sees it proposes a stop step a little
ahead of its own (``MARGIN``: synchronous ranks are within one step of each other) through the
job's store with one compare-and-set, which every rank then reads back: all ranks stop after
the same step, write a checkpoint there when the job checkpoints, and finish as usual, so rank 0
writes the metrics and a summary marked ``interrupted``. A stream pipeline's input stage
proposes the step of the last mini-batch it admitted (:func:`propose`) and tells the other stages
in-band (`polytrain.strategies.pipeline.executor`). A rank that cannot reach the agreed step in
time is killed by the launcher after its grace period; the launcher then writes the summary from
the ranks' event files. A second signal (after ``AGAIN_S``) ends the rank at once (its default action).
"""

from __future__ import annotations

import signal
import time
from types import FrameType
from typing import Any

MARGIN = 2
# Ctrl-C reaches a rank twice at once (from the terminal, then forwarded by the agent): a
# signal within AGAIN_S of the first is the same request, a later one ends the rank.
AGAIN_S = 1.0
KEY = "polytrain/stop"


class _State:
    signal: int | None = None  # the signal received, if any
    store: Any = None  # the job's c10d store (set by the rank's launcher code)
    stop_at: int | None = None  # the agreed last step
    since = 0.0  # when the first signal came


_state = _State()


def _handler(signum: int, frame: FrameType | None) -> None:
    now = time.monotonic()
    if _state.signal is None:
        _state.signal, _state.since = signum, now
    elif now - _state.since > AGAIN_S:  # asked again (Ctrl-C twice): stop now
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)


def install(store: Any) -> None:
    """In a rank: SIGTERM and SIGINT request a stop instead of ending the process."""
    _state.store = store
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _handler)


def requested() -> bool:
    return _state.signal is not None


def signal_name() -> str | None:
    return signal.Signals(_state.signal).name if _state.signal is not None else None


def stop_after(step: int, last: int) -> bool:
    """Whether this rank stops after ``step`` (of ``last``): False while no stop is requested;
    else True at the step all ranks agreed on (the first proposal wins)."""
    if _state.signal is None:
        return False
    if _state.stop_at is None:
        proposal = str(min(last, step + MARGIN))
        if _state.store is None:
            _state.stop_at = int(proposal)
        else:
            _state.stop_at = int(_state.store.compare_set(KEY, "", proposal))
    return step >= _state.stop_at


def propose(step: int) -> int:
    """Propose ``step`` itself as the last (from a rank that knows no rank is past it: a stream
    pipeline's input stage, which admits every step); returns the agreed step (the first
    proposal wins). A rank told the step another way records it with the same call."""
    if _state.stop_at is None:
        if _state.store is None:
            _state.stop_at = step
        else:
            _state.stop_at = int(_state.store.compare_set(KEY, "", str(step)))
    return _state.stop_at


def stopped_at() -> int | None:
    """The step this rank stopped after on request (a rank that runs no steps, a parameter
    server: the step its clients agreed on), None when it was not stopped."""
    if _state.signal is None:
        return None
    if _state.stop_at is None and _state.store is not None:
        try:
            if _state.store.check([KEY]):
                _state.stop_at = int(_state.store.get(KEY))
        except (RuntimeError, ValueError):  # the store is gone: the launcher tells the step
            return None
    return _state.stop_at
