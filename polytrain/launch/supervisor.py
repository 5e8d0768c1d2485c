"""Start ranks on this machine and watch them under a policy that says which ranks may die.

Every polytrain app starts its ranks from this package. When every rank is essential (``train``,
``aco``: synchronous work, where a lost rank ends the job) the ranks run under torch's elastic
agent, as torchrun runs them (:mod:`polytrain.launch.local`). When a policy names ranks that may
be lost (the actors of an RL job) the agent does not fit — it stops every rank when one fails —
so this module starts the ranks itself and applies the policy:

* a rank whose role is expendable and that exits abnormally is recorded (exit code or signal,
  time) and left dead; its peers notice its silence;
* any other rank that fails ends the run at once: every process is stopped and the error names
  the rank, its role and its cause (the rank's own error record when it wrote one);
* when the lead rank exits cleanly the others are leaving too; any still running after a grace
  period are stopped and reported, expendable ones as lost;
* SIGTERM/SIGINT to the launcher reach every rank once (a second one after
  :data:`polytrain.runtime.interrupt.AGAIN_S` kills them).

The ranks are forked by a ``forkserver`` that has imported the app's modules once
(``preload``): on a busy 2-core machine seven ranks importing torch each took minutes.
The policy is plain data (:class:`RankPolicy`); the app keeps only its rank entry point.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polytrain.errors import RankFailure
from polytrain.launch.reaper import running
from polytrain.launch.records import read_error_record
from polytrain.runtime.interrupt import AGAIN_S

POLL_S = 0.05
STOP_GRACE_S = 3.0  # SIGTERM, then SIGKILL after this many seconds


@dataclass(frozen=True)
class RankPolicy:
    """Who the ranks are and which may be lost. ``roles[r]``: rank r's role ("learner",
    "actor", …); ``labels[r]``: how an error names it; ``expendable``: roles a run survives
    losing; ``lead``: the rank whose clean exit ends the run; ``lead_grace_s``: how long the
    others may take to leave after it; ``expendable_grace_s``: how long expendable ranks may
    run once every essential rank has ended well (they have nobody left to talk to);
    ``deadline_s``: a last resort against hangs, from the launch."""

    roles: tuple[str, ...]
    labels: tuple[str, ...]
    lead: int = 0
    expendable: frozenset[str] = frozenset()
    lead_grace_s: float = 15.0
    expendable_grace_s: float = 3.0
    deadline_s: float = float("inf")
    app: str = "job"  # "The {app} failed: …"

    def __post_init__(self) -> None:
        if len(self.roles) != len(self.labels) or not 0 <= self.lead < len(self.roles):
            raise ValueError(f"RankPolicy: {len(self.roles)} roles, {len(self.labels)} labels, "
                             f"lead {self.lead}: one role and one label per rank, lead among them")

    @property
    def world(self) -> int:
        return len(self.roles)

    def may_lose(self, rank: int) -> bool:
        return self.roles[rank] in self.expendable


@dataclass
class Exit:
    rank: int
    role: str  # the rank's label
    code: int | None  # None: still running when the launcher stopped it
    at_s: float  # seconds since launch

    @property
    def cause(self) -> str:
        if self.code is None:
            return "still running (killed by the launcher)"
        if self.code < 0:
            return f"died ({signal.Signals(-self.code).name})"
        return f"exit code {self.code}"


@dataclass
class Supervision:
    launch_epoch: float = field(default_factory=time.time)  # time.time() when supervision began
    exits: dict[int, Exit] = field(default_factory=dict)
    lost: list[Exit] = field(default_factory=list)  # expendable ranks lost
    wall_s: float = 0.0
    stop_signal: str | None = None  # SIGTERM/SIGINT received by the launcher (see `StopRequest`)


def alive(p: Any) -> bool:
    """The rank's process still runs. ``is_alive`` alone is not enough: the forkserver reports
    a rank's end through a pipe, and a SIGTERM sent to the whole process group (``timeout``, a
    supervisor) can end the forkserver before the ranks — its pipes then close and every rank
    reads as exited while it is still checkpointing."""
    return bool(p.is_alive() or (p.pid and running(p.pid)))


def send(p: Any, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(p.pid, signum)


def stop_all(procs: dict[int, Any]) -> None:
    """SIGTERM, then SIGKILL what is left after STOP_GRACE_S (only our own ranks, by pid)."""
    for p in procs.values():
        if alive(p):
            send(p, signal.SIGTERM)
    end = time.monotonic() + STOP_GRACE_S
    for p in procs.values():
        _wait_gone(p, end)
        if alive(p):
            send(p, signal.SIGKILL)
            _wait_gone(p, time.monotonic() + 2)


def _wait_gone(p: Any, deadline: float) -> None:
    while alive(p) and time.monotonic() < deadline:
        time.sleep(POLL_S)


class StopRequest:
    """The launcher's SIGTERM/SIGINT handler while it supervises: passes the request on to every
    rank once (the lead then ends at its next check, as at any other stop, and the others leave
    with it), and remembers the signal. A second signal after `interrupt.AGAIN_S` s (Ctrl-C
    twice) kills every rank at once."""

    def __init__(self, procs: dict[int, Any]) -> None:
        self.procs, self.signum, self.since = procs, 0, 0.0
        self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}

    def _handle(self, signum: int, frame: Any) -> None:
        now = time.monotonic()
        first = not self.signum
        if first:
            self.signum, self.since = signum, now
        for p in self.procs.values():
            if p.pid and alive(p):
                if first:
                    send(p, signal.SIGTERM)
                elif now - self.since > AGAIN_S:
                    send(p, signal.SIGKILL)

    @property
    def name(self) -> str | None:
        return signal.Signals(self.signum).name if self.signum else None

    def restore(self) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)


def failure(run_dir: Path, policy: RankPolicy, ex: Exit, debug: bool) -> RankFailure:
    """The one paragraph for an essential rank's failure."""
    record = read_error_record(run_dir, ex.rank)
    error = record["error"] if record else None
    what = f"failed: {error}" if error else f"{ex.cause} without an error report (killed, or out of memory)"
    lost = " and ".join(f"{r}s" for r in sorted(policy.expendable)) or "no rank"
    return RankFailure(
        f"The {policy.app} failed: rank {ex.rank} ({policy.labels[ex.rank]}) {what} at {ex.at_s:.1f} s. "
        f"A {policy.roles[ex.rank]} is essential (only {lost} may be lost), so the other "
        f"processes were stopped. Logs: {run_dir}/ranks/rank*.log"
        + ("" if debug else " (add --debug for tracebacks).")
    )


def supervise(procs: dict[int, Any], policy: RankPolicy, run_dir: Path, started: float,
              debug: bool = False) -> Supervision:
    """Watch ``procs`` (rank -> process, started at ``time.monotonic()`` ``started``) until the
    run ends under ``policy``; every process is gone on return. Raises :class:`RankFailure`
    when an essential rank fails (a stop request excepted)."""
    sup = Supervision(launch_epoch=time.time() - (time.monotonic() - started))
    lead_done_at: float | None = None
    deadline = started + policy.deadline_s
    stop = StopRequest(procs)
    try:
        while len(sup.exits) < len(procs):
            now = time.monotonic()
            for rank, p in procs.items():
                if rank in sup.exits or alive(p):
                    continue
                ex = Exit(rank, policy.labels[rank], p.exitcode, now - started)
                sup.exits[rank] = ex
                if ex.code == 0:
                    lead_done_at = now if rank == policy.lead else lead_done_at
                elif policy.may_lose(rank):
                    if not stop.signum:  # a rank ended by a stop request is not lost
                        sup.lost.append(ex)
                elif stop.signum:  # ended by the stop request itself (before its handler was set)
                    lead_done_at = now if lead_done_at is None else lead_done_at
                else:
                    raise failure(run_dir, policy, ex, debug)
            late = lead_done_at is not None and now - lead_done_at > policy.lead_grace_s
            if late or now > deadline or _only_stalled_expendables(sup, policy, procs, now - started):
                for rank in procs:
                    if rank not in sup.exits:
                        ex = Exit(rank, policy.labels[rank], None, now - started)
                        sup.exits[rank] = ex
                        if policy.may_lose(rank) and not stop.signum:  # stalled: lost
                            sup.lost.append(ex)
                break
            time.sleep(POLL_S)
    finally:
        stop_all(procs)
        stop.restore()
        sup.wall_s = time.monotonic() - started
        sup.stop_signal = stop.name
    if sup.stop_signal is None and policy.lead in sup.exits and sup.exits[policy.lead].code != 0:
        raise failure(run_dir, policy, sup.exits[policy.lead], debug)
    return sup


def _only_stalled_expendables(sup: Supervision, policy: RankPolicy, procs: dict[int, Any],
                              at_s: float) -> bool:
    """Every essential rank has ended well and only expendable ones still run,
    ``expendable_grace_s`` after the last of them ended (``at_s``: now, since launch). An RL
    actor leaves when its server halts it, so one still running then is stalled (e.g.
    SIGSTOPped): waiting out the lead's grace made a 25 s run take 58 s (issue 50)."""
    essential = [r for r in procs if not policy.may_lose(r)]
    if not essential or not all(r in sup.exits and sup.exits[r].code == 0 for r in essential):
        return False
    return at_s - max(sup.exits[r].at_s for r in essential) > policy.expendable_grace_s


def start_ranks(target: Callable[[dict[str, Any], int], None], payload: dict[str, Any], world: int,
                preload: list[str], name: str) -> dict[int, Any]:
    """Start ``world`` ranks, each running ``target(payload, rank)`` (a module-level function),
    forked by a fork server that imported ``preload`` once. ``payload`` gains ``launcher_pid``:
    a rank passes it to :func:`exit_with` so that it ends with the launcher."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(preload)
    payload = {**payload, "launcher_pid": os.getpid()}
    procs = {r: ctx.Process(target=target, args=(payload, r), name=f"{name}-{r}") for r in range(world)}
    for p in procs.values():
        p.start()
    return procs


def exit_with(pid: int) -> None:
    """End this process at once when process ``pid`` (the launcher) ends, SIGKILL included.

    A rank started here is a child of the fork server, not of the launcher, so the parent-death
    signal that agent-started ranks use does not apply; a daemon thread waits on a pidfd of the
    launcher instead.
    """
    import select
    import threading

    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # gone already
        os._exit(1)
    except (AttributeError, OSError):  # not Linux >= 5.3: the launcher still stops us when it can
        return

    def wait() -> None:
        select.select([fd], [], [])
        os._exit(1)

    threading.Thread(target=wait, name="exit-with-launcher", daemon=True).start()
