"""Start an RL job's processes on this machine, watch them, and let actors die alone.

Training jobs use torch's elastic agent (polytrain/launch/local.py), which stops every rank when
one fails: right for synchronous training, wrong here — an RL run must survive a lost actor.
So this launcher spawns the ranks itself (``multiprocessing`` spawn, one process group over
gloo, joined with :func:`polytrain.launch.worker.init_distributed`) and supervises them:

* an actor that exits abnormally is recorded (exit code or signal, time) and left dead; the
  replay process notices its silence and stops counting it (see :mod:`polytrain.rl.protocol`);
* a learner, replay or parameter server that fails ends the run at once: every other process
  is terminated and the error names the rank, its role and its cause;
* when the lead learner exits cleanly the others are leaving too; any still running after a
  grace period are killed and reported.

Each rank writes ``ranks/rank{R}.result.json`` when it finishes; the parent assembles
``summary.json`` from those files, so a dead actor never blocks a gather.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polytrain.errors import RankFailure
from polytrain.launch.reaper import running
from polytrain.launch.records import read_error_record, write_error_record
from polytrain.metrics.jsonsafe import atomic_json
from polytrain.rl.config import RLConfig
from polytrain.rl.roles import describe, layout_ranks, role
from polytrain.runtime.interrupt import AGAIN_S
from polytrain.runtime.layout import Layout

POLL_S = 0.05
GRACE_S = 15.0  # after the lead learner finished: how long the others may take to leave
ACTOR_GRACE_S = 3.0  # after every learner and server ended: how long a halted actor may take


@dataclass
class Exit:
    rank: int
    role: str
    code: int | None
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
    lost_actors: list[Exit] = field(default_factory=list)
    wall_s: float = 0.0
    stop_signal: str | None = None  # SIGTERM/SIGINT received by the launcher (see `StopRequest`)


def _alive(p: Any) -> bool:
    """The rank's process still runs. ``is_alive`` alone is not enough: the forkserver reports
    a rank's end through a pipe, and a SIGTERM sent to the whole process group (``timeout``, a
    supervisor) can end the forkserver before the ranks — its pipes then close and every rank
    reads as exited while it is still checkpointing."""
    return bool(p.is_alive() or (p.pid and running(p.pid)))


def _stop_all(procs: dict[int, Any]) -> None:
    """SIGTERM, then SIGKILL what is left after 3 s (only our own children, by pid)."""
    for p in procs.values():
        if _alive(p):
            _signal(p, signal.SIGTERM)
    end = time.monotonic() + 3
    for p in procs.values():
        _wait_gone(p, end)
        if _alive(p):
            _signal(p, signal.SIGKILL)
            _wait_gone(p, time.monotonic() + 2)


def _wait_gone(p: Any, deadline: float) -> None:
    while _alive(p) and time.monotonic() < deadline:
        time.sleep(POLL_S)


def _signal(p: Any, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(p.pid, signum)


class StopRequest:
    """The launcher's SIGTERM/SIGINT handler while it supervises: passes the request on to every
    process once (each lead learner then ends at its next check, as at any other stop, and the
    others leave with it), and remembers the signal for the summary. A second signal after
    `interrupt.AGAIN_S` s (Ctrl-C twice) stops every process at once."""

    def __init__(self, procs: dict[int, Any]) -> None:
        self.procs, self.signum, self.since = procs, 0, 0.0
        self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}

    def _handle(self, signum: int, frame: Any) -> None:
        now = time.monotonic()
        first = not self.signum
        if first:
            self.signum, self.since = signum, now
        for p in self.procs.values():
            if p.pid and _alive(p):
                if first:
                    _signal(p, signal.SIGTERM)
                elif now - self.since > AGAIN_S:
                    _signal(p, signal.SIGKILL)

    @property
    def name(self) -> str | None:
        return signal.Signals(self.signum).name if self.signum else None

    def restore(self) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)


def _failure(run_dir: Path, ranks: Layout, ex: Exit, debug: bool) -> RankFailure:
    record = read_error_record(run_dir, ex.rank)
    error = record["error"] if record else None
    what = f"failed: {error}" if error else f"{ex.cause} without an error report (killed, or out of memory)"
    return RankFailure(
        f"The RL job failed: rank {ex.rank} ({describe(ranks, ex.rank)}) {what} at {ex.at_s:.1f} s. "
        f"A {role(ranks, ex.rank)[0]} is essential (only actors may be lost), so the other processes "
        f"were stopped. Logs: {run_dir}/ranks/rank*.log" + ("" if debug else " (add --debug for tracebacks).")
    )


def supervise(cfg: RLConfig, run_dir: Path, procs: dict[int, Any], started: float) -> Supervision:
    ranks = layout_ranks(cfg)
    sup = Supervision(launch_epoch=time.time() - (time.monotonic() - started))
    lead_done_at: float | None = None
    deadline = started + cfg.max_seconds + cfg.timeout_s + 120  # a last resort against hangs
    stop = StopRequest(procs)
    try:
        while len(sup.exits) < len(procs):
            now = time.monotonic()
            for rank, p in procs.items():
                if rank in sup.exits or _alive(p):
                    continue
                ex = Exit(rank, describe(ranks, rank), p.exitcode, now - started)
                sup.exits[rank] = ex
                if ex.code == 0:
                    lead_done_at = now if rank == ranks.lead else lead_done_at
                elif rank in ranks.actor_ranks:
                    if not stop.signum:  # an actor ended by a stop request is not lost
                        sup.lost_actors.append(ex)
                elif stop.signum:  # ended by the stop request itself (before its handler was set)
                    lead_done_at = now if lead_done_at is None else lead_done_at
                else:
                    raise _failure(run_dir, ranks, ex, cfg.debug)
            late = lead_done_at is not None and now - lead_done_at > GRACE_S + cfg.actor_timeout_s
            if late or now > deadline or _only_stalled_actors(sup, ranks, procs, now - started):
                for rank in procs:
                    if rank not in sup.exits:
                        ex = Exit(rank, describe(ranks, rank), None, now - started)
                        sup.exits[rank] = ex
                        if rank in ranks.actor_ranks and not stop.signum:  # stalled: lost
                            sup.lost_actors.append(ex)
                break
            time.sleep(POLL_S)
    finally:
        _stop_all(procs)
        stop.restore()
        sup.wall_s = time.monotonic() - started
        sup.stop_signal = stop.name
    if sup.stop_signal is None and ranks.lead in sup.exits and sup.exits[ranks.lead].code != 0:
        raise _failure(run_dir, ranks, sup.exits[ranks.lead], cfg.debug)
    return sup


def _only_stalled_actors(sup: Supervision, ranks: Layout, procs: dict[int, Any], at_s: float) -> bool:
    """Every learner and server has ended well and only actors still run, ACTOR_GRACE_S after
    the last of them ended (``at_s``: now, in seconds since launch). An actor leaves when its
    server halts it, so one still running then is stalled (e.g. SIGSTOPped): nothing is left to
    talk to, and waiting out GRACE_S + --actor-timeout made a 25 s run take 58 s (issue 50)."""
    essential = [r for r in procs if r not in ranks.actor_ranks]
    if not all(r in sup.exits and sup.exits[r].code == 0 for r in essential):
        return False
    return at_s - max(sup.exits[r].at_s for r in essential) > ACTOR_GRACE_S


def start_processes(cfg: RLConfig, run_dir: Path, port: int, resume: bool = False,
                    env: dict[str, str] | None = None) -> dict[int, Any]:
    """Start every rank; ``env``: variables each sets before joining the process group (the
    private store's, :func:`polytrain.launch.stores.rank_store_env`)."""
    # A fork server that has imported torch and polytrain.rl once forks every rank: startup is
    # then one import, not one per process (minutes on the busy 2-core box with 7 processes).
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["polytrain.rl.preload"])
    payload = {"config": cfg.model_dump(), "run_dir": str(run_dir), "port": port, "world": cfg.world,
               "resume": resume, "launcher_pid": os.getpid(), "env": env or {}}
    procs = {r: ctx.Process(target=rank_main, args=(payload, r), name=f"polytrain-rl-{r}")
             for r in range(cfg.world)}
    for p in procs.values():
        p.start()
    return procs


# ---- inside each process -----------------------------------------------------------------------


def exit_with(pid: int) -> None:
    """End this process at once when process ``pid`` (the launcher) ends, SIGKILL included.

    An RL process is a child of the fork server, not of the launcher, so the parent-death signal
    of training ranks does not apply; a daemon thread waits on a pidfd of the launcher instead.
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


def rank_main(payload: dict[str, Any], rank: int) -> None:
    """Entry point of one RL process (spawned by :func:`start_processes`)."""
    from polytrain.runtime import interrupt

    if payload.get("launcher_pid"):
        exit_with(int(payload["launcher_pid"]))
    interrupt.install(None)  # a stop request sets a flag: the lead learner ends at its next check
    import torch

    from polytrain.launch.worker import redirect_output
    from polytrain.metrics.recorder import Recorder
    from polytrain.rl.roles_run import run_role

    run_dir = Path(payload["run_dir"])
    (run_dir / "ranks").mkdir(parents=True, exist_ok=True)
    redirect_output(run_dir / "ranks" / f"rank{rank}.log")
    recorder = Recorder(rank, run_dir / "ranks" / f"rank{rank}.jsonl")
    recorder.emit("process", pid=os.getpid())
    # Many small processes share few cores: one thread each beats oversubscribed intra-op pools.
    torch.set_num_threads(1)
    try:
        result = run_role(payload, rank, recorder)
        atomic_json(run_dir / "ranks" / f"rank{rank}.result.json", result)
    except BaseException as exc:
        write_error_record(run_dir, rank, exc)
        raise
    finally:
        recorder.close()
