"""Local launch: N processes on this machine through PyTorch's elastic agent (torchrun's engine).

The agent starts the ranks (spawn), watches them, and when one fails it stops the others within
``shutdown_timeout`` seconds; a rank that hangs makes its peers' collectives time out after
``timeout_s``, so a job never hangs. The launcher turns the agent's report and the ranks' own
error files into one paragraph: which rank, at which step, and why.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

import polytrain.env as env
from polytrain._torch_compat import cheap_rendezvous_events
from polytrain.config import JobConfig
from polytrain.errors import ConfigError, Interrupted, RankFailure
from polytrain.launch.agent import is_timeout, prompt_stop, unresponsive
from polytrain.launch.lock import hold_run_dir
from polytrain.launch.merge import MergedEvents, MergeThread
from polytrain.launch.prepare import Prepared, check_resume_steps, prepare
from polytrain.launch.reaper import AGENT_LOGS_ENV
from polytrain.launch.records import LAUNCHER_PID_ENV, free_port, oom_kills, read_error_record
from polytrain.launch.rundir import (
    new_run_dir,
    read_summary,
    record_failure,
    write_config,
    write_interrupted,
)
from polytrain.launch.stores import BIND_ENV, Rendezvous, private_rendezvous, stores_bound_to
from polytrain.runtime import startup_trace
from polytrain.runtime.live_log import LiveLog, make_sinks
from polytrain.runtime.progress import FollowProgress

if TYPE_CHECKING:
    from torch.distributed.launcher.api import LaunchConfig

SHUTDOWN_TIMEOUT_S = 10


def quiet_elastic(debug: bool) -> None:
    level = logging.INFO if debug else logging.CRITICAL
    prefixes = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing")
    # torch's elastic modules give their own loggers an explicit level (LOGLEVEL, WARNING)
    names = [n for n in logging.root.manager.loggerDict if n.startswith(prefixes)]
    for name in {*prefixes, *names}:
        logging.getLogger(name).setLevel(level)
    cheap_rendezvous_events()  # polytrain._torch_compat: why


def _user_paths() -> list[str]:
    """This program's import paths that a fresh interpreter would not have (its script's folder,
    the working directory, paths it added), so a rank imports the user's model factory as the
    launching program does."""
    system = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    out = []
    for entry in sys.path:
        path = os.path.realpath(entry or os.getcwd())
        if not any(path == s or path.startswith(s + os.sep) for s in system) and path not in out:
            out.append(path)
    return out


@contextlib.contextmanager
def rank_environment(procs: int, agent_logs: Path | None = None,
                     extra: dict[str, str] | None = None) -> Iterator[None]:
    """The ranks' environment, set while they start; the caller's is restored afterwards.

    ``OMP_NUM_THREADS``: the ranks' OpenMP pool sized as torchrun does, cores / local ranks.
    Calling ``torch.set_num_threads`` in a rank is not enough: by then the OpenMP runtime has
    started with one thread per core, and oneDNN convolutions then ran 27% slower with 2 ranks
    on 2 cores (vgg16 allreduce, 654 vs 902 samples/s, measured). A user's own value wins.
    ``PYTHONPATH``: this program's own import paths first (see :func:`_user_paths`).
    ``agent_logs``: the agent's log folder, which a rank's watcher removes when the launcher
    ends, killed or not (see :mod:`polytrain.launch.reaper`).
    ``extra``: more variables for the agent and the ranks (the private rendezvous's).
    """
    extra = extra or {}
    with env.restored(("OMP_NUM_THREADS", "PYTHONPATH", LAUNCHER_PID_ENV, AGENT_LOGS_ENV, *extra)) as saved:
        os.environ.update(extra)
        if agent_logs is not None:
            os.environ[AGENT_LOGS_ENV] = str(agent_logs)
        os.environ[LAUNCHER_PID_ENV] = str(os.getpid())  # a rank started after we died exits
        if saved["OMP_NUM_THREADS"] is None:
            os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // procs))
        os.environ["PYTHONPATH"] = os.pathsep.join(
            _user_paths() + ([saved["PYTHONPATH"]] if saved["PYTHONPATH"] else []))
        yield


def launch(
    cfg: JobConfig, *, resume: bool = False, run_dir: Path | None = None, console: Console | None = None
) -> dict[str, Any]:
    """Validate, run the job on ``cfg.procs`` local processes, and return its summary."""
    started = time.time()
    startup_trace.begin(started)
    startup_trace.mark("launch: torch and the launcher imported")
    prepared = prepare(cfg, resume=resume)
    startup_trace.mark("job prepared (strategy, model, data checked)")
    cfg = prepared.config  # e.g. single's one process
    if run_dir is None:
        run_dir = new_run_dir(cfg)
    with hold_run_dir(run_dir):  # one job at a time writes a run directory
        if resume:
            check_resume_steps(run_dir, cfg, prepared.steps)
        return _launch(cfg, prepared, resume, run_dir, console, started)


def _launch(cfg: JobConfig, prepared: Prepared, resume: bool, run_dir: Path,
            console: Console | None, started: float) -> dict[str, Any]:
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    cfg = cfg.model_copy(update={"out": str(run_dir)})
    if not resume:
        write_config(run_dir, cfg)
    console = console or Console(stderr=True)
    if prepared.note:
        console.print(f"note: {prepared.note}", highlight=False)
    payload = {
        "config": cfg.model_dump(mode="json"),
        "run_dir": str(run_dir),
        "resume": resume,
        "rank_logs": True,
        "progress": False,
        "merged_by_launcher": True,  # metrics.jsonl: merged below as the ranks write
    }
    payload_path = run_dir / "ranks" / "launch.json"
    payload_path.parent.mkdir(parents=True, exist_ok=True)
    payload_path.write_text(json.dumps(payload, indent=1))
    if cfg.debug:
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "INFO"  # DETAIL crashes DDP on torch 2.13/CPU
    rank0 = run_dir / "ranks" / "rank0.jsonl"
    label = f"{cfg.strategy} ×{cfg.procs}"
    states: dict[int, str] = {}  # the live ranks' process states when a failure stopped them
    ooms = oom_kills()  # the kernel's OOM kills so far: a rise names a SIGKILLed rank's cause
    startup_trace.mark("agent starts the ranks")
    startup_trace.write_launcher(run_dir)
    merged = MergedEvents(run_dir / "ranks", world=cfg.procs)
    try:
        sinks = make_sinks(list(cfg.log), run_dir, cfg.strategy, cfg.model_dump(mode="json"))
        with FollowProgress(rank0, prepared.steps, label, console), \
                LiveLog(run_dir / "ranks", sinks, resume=resume, per_rank=cfg.log_ranks == "all",
                        world=cfg.procs):
            run_agent(cfg.procs, "polytrain.launch.rank_main", payload_path, run_dir, cfg.debug,
                      inner=[prompt_stop(states, SHUTDOWN_TIMEOUT_S, lambda: stepped(run_dir / "ranks")),
                             MergeThread(merged)])
    except ChildFailedError as err:
        oom = (oom_kills() or 0) > (ooms or 0)
        message = describe_failure(run_dir, err, cfg.debug, states, oom=oom)
        raise RankFailure(message + record_failure(run_dir, cfg, _cause(run_dir, err), merged)) from None
    except SignalException as exc:
        raise Interrupted(_interrupted(run_dir, cfg, exc.sigval, started, merged),
                          128 + int(exc.sigval)) from None
    finally:
        startup_trace.mark("ranks ended")
        startup_trace.write_launcher(run_dir)
    merged.finish()
    return read_summary(run_dir)


def run_agent(procs: int, module: str, payload_path: Path, run_dir: Path, debug: bool,
              inner: Sequence[contextlib.AbstractContextManager[Any]] = ()) -> None:
    """Run ``python -m module PAYLOAD`` on ``procs`` ranks of this machine under torch's elastic
    agent — every app whose ranks are all essential starts them here (``train``, ``aco``; a job
    whose ranks may die runs under :mod:`polytrain.launch.supervisor`). The rendezvous is
    private (``run_dir/ranks/agent``, removed after the run); ``inner``: context managers held
    while the ranks run, inside their environment. Raises torch's ``ChildFailedError`` when a
    rank fails (:func:`describe_failure` words it) and ``SignalException`` on SIGTERM/SIGINT."""
    from torch.distributed.launcher.api import elastic_launch

    quiet_elastic(debug)
    agent_dir = run_dir / "ranks" / "agent"
    shutil.rmtree(agent_dir, ignore_errors=True)  # a launcher killed -9 before its watcher ran
    rdzv = local_rendezvous(agent_dir)
    lc = agent_config(procs, agent_dir, rdzv)
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(rank_environment(procs, agent_dir, rdzv.env))
            stack.enter_context(stores_bound_to(rdzv.local_addr))
            for cm in inner:
                stack.enter_context(cm)
            elastic_launch(lc, sys.executable)("-m", module, str(payload_path))
    finally:
        shutil.rmtree(agent_dir, ignore_errors=True)


def stepped(ranks: Path) -> bool:
    """Whether a rank has recorded a training step (in its event file's first 256 KiB: a
    rank's first step comes after a few start-up events)."""
    for path in ranks.glob("rank*.jsonl"):
        with contextlib.suppress(OSError), path.open("rb") as f:
            if b'"event": "step"' in f.read(1 << 18):
                return True
    return False


def agent_config(procs: int, agent_dir: Path, rdzv: Rendezvous) -> LaunchConfig:
    """torch's elastic agent for ``procs`` ranks on this machine, as every polytrain app that
    starts its ranks through it (``train``, ``aco``) runs it: no restarts, a 0.1 s watch, the
    agent's files in ``agent_dir`` (private, removed after the run)."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig

    return LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=procs,
        run_id=uuid.uuid4().hex[:12],
        rdzv_backend="c10d",
        rdzv_endpoint=rdzv.endpoint,
        rdzv_configs=rdzv.configs,
        max_restarts=0,
        monitor_interval=0.1,
        local_addr=rdzv.local_addr,
        shutdown_timeout=SHUTDOWN_TIMEOUT_S,
        # torch's agent keeps a log tree per run, by default a /tmp/torchelastic_* that nothing
        # removes: it goes in the run directory and is removed after the run (killed or not:
        # polytrain.launch.reaper)
        logs_specs=DefaultLogsSpecs(log_dir=str(agent_dir)),
    )


def local_rendezvous(private: Path) -> Rendezvous:
    """A one-machine job's rendezvous: private FileStores in ``private`` (0700), or TCP stores on
    the ``--bind`` address when one was given. With TCP stores this launcher hosts the rendezvous
    store (``is_host``): torch guesses by matching the endpoint against the hostname's
    addresses, and where /etc/hosts maps the hostname to 127.0.0.1 it took this host's own
    interface address for another host's, waited 2.5 min as a client and failed (issue 50)."""
    bind = os.environ.get(BIND_ENV)
    return private_rendezvous(private, bind, free_port(bind) if bind else 0)


def _interrupted(run_dir: Path, cfg: JobConfig, sig: signal.Signals, started: float,
                 merged: MergedEvents) -> str:
    """One line on a run stopped by SIGTERM/SIGINT: where it stopped, how to continue (the
    record: ``merged``'s unread tail, and the summary rank 0 wrote, else the launcher's)."""
    path = run_dir / "summary.json"
    summary = None
    if path.is_file() and path.stat().st_mtime >= started:  # rank 0 finished the stop itself
        with contextlib.suppress(ConfigError):
            summary = read_summary(run_dir)
    if not summary or not summary.get("interrupted"):
        summary = write_interrupted(run_dir, cfg, sig.name, merged)
    else:
        merged.finish()
    step = summary["interrupted"]["step"]
    latest = run_dir / "checkpoints" / "LATEST"
    ckpt = latest.read_text().strip() if latest.is_file() else None
    then = (f"checkpoint {ckpt}; continue with: polytrain train --resume {run_dir}" if ckpt
            else "no checkpoint (add --checkpoint-every N to be able to continue)")
    return (f"{sig.name}: every rank stopped after step {step} of {cfg.steps or 'the epochs'}; "
            f"metrics and summary.json (marked interrupted) in {run_dir}; {then}.")


def _timeout(run_dir: Path) -> float | str:
    try:
        return float(json.loads((run_dir / "ranks" / "launch.json").read_text())["config"]["timeout_s"])
    except (OSError, ValueError, KeyError):
        return "?"


def _last_step(run_dir: Path, rank: int) -> int:
    path = run_dir / "ranks" / f"rank{rank}.jsonl"
    last = 0
    try:
        for line in path.read_text().splitlines():
            if '"event": "step"' in line:
                last = json.loads(line)["step"]
    except (OSError, ValueError):
        pass
    return last


def _cause(run_dir: Path, err: Any) -> int:
    """The rank whose failure stopped the run: one that saw the loss diverge, if any did (the
    others then fail on its exit: a parameter server's broken connection, a peer's timeout),
    else the first to fail."""
    for rank in sorted(err.failures):
        record = read_error_record(run_dir, rank) or {}
        if isinstance(record.get("diverged"), dict):
            return int(rank)
    return int(err.get_first_failure()[0])


def describe_failure(run_dir: Path, err: Any, debug: bool, states: dict[int, str] | None = None,
                     oom: bool = False) -> str:
    """One paragraph per failed rank, the first failure first. When the first failure is a
    rank that timed out waiting and another rank was alive but not answering (``states``: the
    live ranks' process states), that rank is named first: it is the cause."""
    first_rank = _cause(run_dir, err)
    ranks = [first_rank, *sorted(r for r in err.failures if r != first_rank)]
    lines = []
    record = read_error_record(run_dir, first_rank)
    hung = unresponsive(states or {})
    if record is not None and is_timeout(record["error"]) and hung:
        lines = [f"rank {r} stopped answering after step {_last_step(run_dir, r)} ({why})"
                 for r, why in sorted(hung.items())]
        lines[0] += (f"; rank {first_rank} timed out waiting for it at step {record['step'] + 1} "
                     f"(after --timeout {_timeout(run_dir)} s)")
        ranks = [r for r in ranks[1:] if r not in hung]  # killed by the launcher: said above
    for rank in ranks:
        failure = err.failures[rank]
        record = read_error_record(run_dir, rank)
        if record is not None:
            what = f"failed at step {record['step'] + 1}: {record['error']}"
            if debug:
                what += "\n" + record["traceback"]
        else:
            sig = failure.signal_name() if failure.exitcode < 0 else f"exit code {failure.exitcode}"
            if failure.exitcode > 0 and not (run_dir / "ranks" / f"rank{rank}.jsonl").exists():
                what = (
                    f"died ({sig}) while its process was starting, before polytrain's rank code "
                    "ran (its Python error, if any, is printed above)"
                )
            elif oom and failure.exitcode == -signal.SIGKILL:
                what = (f"was killed by the kernel's out-of-memory killer after step "
                        f"{_last_step(run_dir, rank)} (its memory cgroup counted an OOM kill); "
                        "use a smaller --batch-size or model, or fewer --procs")
            else:
                what = (
                    f"died ({sig}) after step {_last_step(run_dir, rank)} without an error "
                    "report (killed, or out of memory)"
                )
        lines.append(f"rank {rank} {what}")
    head = "The job failed: " + lines[0] + "."
    rest = "".join(f"\n  also {line}" for line in lines[1:])
    return f"{head}{rest}\nThe other ranks were stopped. Logs: {run_dir}/ranks/rank*.log" + (
        "" if debug else " (add --debug for tracebacks)."
    )
