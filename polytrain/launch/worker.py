"""What every rank runs, whether started by polytrain's own launcher or by plain ``torchrun``.

The rank reads its place from the environment torchrun's agent sets (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_*), joins the process group, runs the
strategy, and gathers every rank's figures at rank 0, which writes the run directory. On any
error it writes ``ranks/rank{R}.error.json`` (rank, step, error) before it exits, so the launcher
can say which rank failed, where and why.
"""

from __future__ import annotations

import os
import resource
import socket
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist

import polytrain.env as env
from polytrain.comm import Comm
from polytrain.config import make_config
from polytrain.errors import ConfigError
from polytrain.launch.reaper import remove_when_agent_ends
from polytrain.launch.records import clear_error_record, die_with_parent, write_error_record
from polytrain.launch.stores import bind_address, rank_store, tcp_store
from polytrain.metrics.recorder import Recorder
from polytrain.runtime import interrupt
from polytrain.runtime.checkpoint import CheckpointStore
from polytrain.runtime.job import Job, RankContext, RankResult
from polytrain.runtime.progress import RankProgress
from polytrain.runtime.same_data import check_same_data
from polytrain.runtime.startup_trace import rank_mark
from polytrain.strategies import make_strategy
from polytrain.strategies.base import job_fingerprint

CHECK_ENV = env.CHECK_COLLECTIVES


def set_threads() -> None:
    """Share the cores among this host's ranks (as torchrun does) instead of oversubscribing."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))


def pick_device(local_rank: int, want: str = "auto") -> tuple[torch.device, str]:
    """``--device``: NCCL on this rank's GPU (cuda; auto when it has one), gloo on CPU."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if want == "cuda" and local_rank >= gpus:
        raise ConfigError(f"--device cuda: local rank {local_rank} has no GPU of its own (this "
                          f"host has {gpus}). Run at most {gpus} ranks per host, or --device cpu.")
    if want != "cpu" and local_rank < gpus:
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank), "nccl"
    return torch.device("cpu"), "gloo"


def init_distributed(backend: str, rank: int, world: int, timeout_s: float) -> dist.Store:
    """Join the process group through a store namespace private to this restart generation.

    Under ``torchrun --max-restarts``, the agent's TCPStore outlives the workers; gloo's default
    ``env://`` keys from the dead generation would make the new one dial the dead workers' ports.
    A PrefixStore keyed by TORCHELASTIC_RESTART_COUNT gives each generation fresh keys.
    Under the local launcher the store is its private FileStore (see
    :func:`polytrain.launch.stores.private_rendezvous`), else a TCPStore at MASTER_ADDR:MASTER_PORT.
    """
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ.get("MASTER_PORT", "0"))
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    timeout = timedelta(seconds=timeout_s)
    store = rank_store(timeout) or tcp_store(
        addr, port, world, rank == 0 and not agent_store, timeout, bind=bind_address(addr))
    generation = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    prefixed = dist.PrefixStore(f"polytrain/gen{generation}", store)
    dist.init_process_group(backend, store=prefixed, rank=rank, world_size=world, timeout=timeout)
    return prefixed


def redirect_output(path: Path) -> None:
    """Send this rank's stdout/stderr (and any library's) to its log file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def exit_now(code: int = 0) -> NoReturn:
    """End a finished rank's process here, without the interpreter's shutdown.

    A rank that has written its results, passed the final barrier and destroyed its process
    groups has nothing left to do, but Python's shutdown still tears down torch's C++ objects,
    and a gloo thread or a pending work object destroyed then can abort the process ("terminate
    called without an active exception", SIGABRT) after a successful run: seen on 3 of ~460
    tests in one suite run, 0 in two other runs of the same code. The launcher would report that
    run as failed.
    ``multiprocessing`` ends its children the same way (``os._exit`` after the target returns);
    polytrain's RL roles, which run as such children, never showed the abort.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_rank(payload: dict[str, Any]) -> None:
    """Entry point of one rank. ``payload``: config (dict), run_dir, resume, rank_logs, progress."""
    die_with_parent()
    remove_when_agent_ends()  # the agent's log tree, when the agent ends (killed or not)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    run_dir = Path(payload["run_dir"])
    if payload.get("rank_logs"):
        redirect_output(run_dir / "ranks" / f"rank{rank}.log")
    set_threads()
    generation = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    fresh = generation == 0 and not payload.get("resume")
    clear_error_record(run_dir, rank)  # a previous generation's, or a previous launch's
    recorder = Recorder(rank, run_dir / "ranks" / f"rank{rank}.jsonl", fresh=fresh)
    recorder.emit("process", pid=os.getpid(), host=socket.gethostname(), generation=generation,
                  threads=torch.get_num_threads())
    try:
        cfg = make_config(payload["config"])
        device, backend = pick_device(local_rank, cfg.device)
        interrupt.install(init_distributed(backend, rank, world, cfg.timeout_s))
        rank_mark(run_dir, rank, "process group ready")
        strategy = make_strategy(cfg.strategy, cfg.options)
        job = Job.from_config(cfg)
        store = CheckpointStore(run_dir / "checkpoints", job_fingerprint(cfg), clock=recorder.now)
        ctx = RankContext(
            rank=rank,
            world=world,
            local_rank=local_rank,
            device=device,
            backend=backend,
            comm=Comm(rank, world, check=cfg.debug or os.environ.get(CHECK_ENV) == "1"),
            recorder=recorder,
            run_dir=run_dir,
            checkpoints=store,
            resume=bool(payload.get("resume")) or (generation > 0 and bool(store.candidates())),
            progress=RankProgress(rank == 0 and bool(payload.get("progress")), job.steps, cfg.strategy),
            slow_rank=cfg.slow_rank,
            slow_factor=cfg.slow_factor,
        )
        if not ctx.resume and not fresh:
            recorder.rewind(0)  # a restart from scratch: the steps run again
        check_same_data(job, ctx)  # a dataset factory that ignores its seed: caught here
        role = strategy.roles(world)[rank]
        rank_mark(run_dir, rank, "job built (data, context)")
        result = strategy.run(job, ctx)
        result.role = role
        result.strategy_metrics.update(job.split_tracer)
        if ctx.progress is not None:
            ctx.progress.close()
        _finish(job, ctx, result, bool(payload.get("merged_by_launcher")))
        rank_mark(run_dir, rank, "results written")
    except BaseException as exc:
        write_error_record(run_dir, rank, exc, step=recorder.last_step)
        raise
    finally:
        recorder.close()
    dist.destroy_process_group()


def _rank_record(ctx: RankContext, result: RankResult) -> dict[str, Any]:
    return {
        "rank": ctx.rank,
        "role": result.role,
        "steps": result.steps,
        "samples": result.samples,
        "wall_s": result.wall_s,
        "final_loss": result.final_loss,
        "eval": result.eval,
        "peak_rss_bytes": peak_rss_bytes(),
        "busy_s": ctx.recorder.busy_s(),
        "resumed": ctx.recorder.resumed,
        "bytes_sent_run": ctx.recorder.base_bytes + ctx.comm.bytes_sent,  # earlier launches too
        "strategy_metrics": result.strategy_metrics,
        **ctx.comm.summary(),
    }


def _finish(job: Job, ctx: RankContext, result: RankResult, merged_by_launcher: bool = False) -> None:
    """Gather every rank's record and events at rank 0, which writes the run directory.

    ``merged_by_launcher``: polytrain's local launcher merges the ranks' event files into
    ``metrics.jsonl`` as they grow (:mod:`polytrain.launch.merge`); then only the few events the
    summary reads are gathered (:meth:`Recorder.summary_events`), and a stop costs the same
    whatever the run's length. Otherwise (torchrun, several hosts) every event is gathered.

    No barrier follows: the other ranks would wait on rank 0's writing (the whole run's events,
    seconds for a long run) within ``--timeout``, and a timeout there failed a finished job; a
    soak run under torchrun then restarted from its last checkpoint and failed again, over and
    over. The other ranks have nothing left to do once their part is gathered."""
    from polytrain.launch.rundir import write_results

    records = ctx.comm.gather_json(_rank_record(ctx, result))
    mine = ctx.recorder.summary_events() if merged_by_launcher else ctx.recorder.events
    events = ctx.comm.gather_json(mine)
    if ctx.is_leader:
        assert records is not None and events is not None
        write_results(job, ctx, records, [e for evs in events for e in evs], result.model_state,
                      metrics=not merged_by_launcher)
