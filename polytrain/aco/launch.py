"""Run ``polytrain aco``: in this process (``--procs 1``), on P local processes through the same
elastic agent as ``train`` (``polytrain.launch.local``), or as one rank of plain ``torchrun``
(one host or many, the testbed's emulated hosts included).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from polytrain.aco.config import ACOConfig
from polytrain.aco.progress import ACOProgress, FollowIterations
from polytrain.aco.results import IterationLog, build_summary, write_run
from polytrain.aco.run import RankOutcome, Runner
from polytrain.aco.tsp import Instance, load_instance
from polytrain.errors import ConfigError, RankFailure
from polytrain.metrics.summary import ACOSummary, read_summary


def prepare(cfg: ACOConfig) -> tuple[ACOConfig, Instance]:
    """Load the instance and check every rule that needs it, before anything starts."""
    inst = load_instance(cfg.tsp)
    cfg = cfg.resolved(inst.n)
    if cfg.target_gap is not None and cfg.optimum is None and inst.optimum is None:
        raise ConfigError(f"--target-gap needs the optimum of {inst.name}, which polytrain does not know. "
                          "Fix: add --optimum LENGTH, or use --iterations / --time-limit.")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: this machine has no CUDA device. Fix: --device cpu (or auto).")
    return cfg, inst


def device_for(cfg: ACOConfig, local_rank: int = 0) -> torch.device:
    if cfg.device == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def _outcome_record(o: RankOutcome, rank: int) -> dict[str, Any]:
    rec = {"rank": rank, "best_length": o.best_length, "best_tour": o.best_tour,
           "iterations": o.iterations, "wall_s": o.wall_s, "tours": o.tours,
           "exchanges": o.exchanges, "restarts": o.restarts}
    rec.update(o.comm)
    return rec


def run_aco(cfg: ACOConfig, console: Console | None = None, plots: bool = True,
            progress: bool = True) -> dict[str, Any]:
    """Validate, run, write the run directory; returns the summary."""
    cfg, inst = prepare(cfg)
    from polytrain.launch.records import make_run_dir

    run_dir = make_run_dir(cfg.out, f"aco-{cfg.variant}")
    cfg = ACOConfig(**{**cfg.to_dict(), "out": str(run_dir)})
    (run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1))
    label = f"aco {cfg.variant} {inst.name} ×{cfg.procs}"
    bar = ACOProgress(cfg, label, console, enabled=progress)
    if cfg.procs == 1:
        log = IterationLog(run_dir / "iterations.jsonl")
        try:
            def record(row: dict[str, Any]) -> None:
                log(row)
                bar(row)

            outcome = Runner(cfg, inst, None, device_for(cfg)).run(record)
        finally:
            log.close()
            bar.close()
        summary = build_summary(cfg, inst, log.rows, [_outcome_record(outcome, 0)])
        write_run(run_dir, summary, inst, log.rows, plots)
        return read_summary(run_dir, ACOSummary).to_dict()
    with FollowIterations(run_dir / "iterations.jsonl", bar):
        _launch_ranks(cfg, run_dir, plots)
    return read_summary(run_dir, ACOSummary).to_dict()


def _launch_ranks(cfg: ACOConfig, run_dir: Path, plots: bool) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from polytrain.launch.local import describe_failure, run_agent

    payload = run_dir / "ranks" / "launch.json"
    payload.parent.mkdir(parents=True, exist_ok=True)
    payload.write_text(json.dumps({"config": cfg.to_dict(), "run_dir": str(run_dir), "plots": plots,
                                   "rank_logs": True}))
    try:
        run_agent(cfg.procs, "polytrain.aco.rank", payload, run_dir, False)
    except ChildFailedError as err:
        raise RankFailure(describe_failure(run_dir, err, False)) from None


def rank_main(payload: dict[str, Any]) -> None:
    """One rank (started by the launcher above, or by torchrun through the CLI)."""
    from polytrain.comm import Comm
    from polytrain.launch.worker import init_distributed, redirect_output, set_threads

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    run_dir = Path(payload["run_dir"])
    if payload.get("rank_logs"):
        redirect_output(run_dir / "ranks" / f"rank{rank}.log")
    (run_dir / "ranks").mkdir(parents=True, exist_ok=True)
    (run_dir / "ranks" / f"rank{rank}.jsonl").touch()
    set_threads()
    log = IterationLog(run_dir / "iterations.jsonl" if rank == 0 else None)
    try:
        cfg, inst = prepare(ACOConfig.from_dict(payload["config"]))
        device = device_for(cfg, local_rank)
        init_distributed("nccl" if device.type == "cuda" else "gloo", rank, world, cfg.timeout_s)
        comm = Comm(rank, world)
        outcome = Runner(cfg, inst, comm, device).run(log)
        records = comm.gather_json(_outcome_record(outcome, rank))
        if rank == 0:
            assert records is not None
            write_run(run_dir, build_summary(cfg, inst, log.rows, records), inst, log.rows,
                      bool(payload.get("plots", True)))
        comm.barrier()
    except BaseException as exc:
        from polytrain.launch.records import write_error_record

        write_error_record(run_dir, rank, exc, step=len(log.rows))
        raise
    finally:
        log.close()
    import torch.distributed as dist

    dist.destroy_process_group()


def run_under_torchrun(cfg: ACOConfig, plots: bool = True) -> dict[str, Any] | None:
    """``polytrain aco`` on a rank of plain torchrun; rank 0 returns the summary."""
    world = int(os.environ["WORLD_SIZE"])
    if cfg.procs not in (1, world):
        raise ConfigError(f"--procs {cfg.procs} disagrees with torchrun's world size {world}. "
                          "Under torchrun, leave --procs out.")
    cfg = ACOConfig(**{**cfg.to_dict(), "procs": world})
    prepare(cfg)
    run_dir = Path(cfg.out or f"runs/torchrun-aco-{os.environ.get('TORCHELASTIC_RUN_ID', 'job')}")
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = ACOConfig(**{**cfg.to_dict(), "out": str(run_dir)})
    if int(os.environ["RANK"]) == 0:
        (run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1))
    rank_main({"config": cfg.to_dict(), "run_dir": str(run_dir), "plots": plots, "rank_logs": False})
    if int(os.environ["RANK"]) == 0:
        return read_summary(run_dir, ACOSummary).to_dict()
    return None
