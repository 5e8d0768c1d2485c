"""``polytrain train`` inside a rank that plain ``torchrun`` started (one host or many).

    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 2 \\
             --rdzv-backend c10d --rdzv-endpoint HOST0:29500 --rdzv-id job1 \\
             -m polytrain train --strategy allreduce --out runs/job1

Every rank validates the same job, joins the process group, runs its part; rank 0 writes the run
directory and prints the summary. With ``--max-restarts K`` a restarted generation resumes from
the newest good checkpoint by itself.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from polytrain.config import load_config
from polytrain.errors import ConfigError, PolytrainError
from polytrain.launch.prepare import check_resume_steps, prepare, resume_config
from polytrain.launch.rundir import TESTBED_ENV, read_summary, write_config
from polytrain.launch.worker import exit_now, run_rank
from polytrain.runtime.live_log import LiveLog, make_sinks


def train_under_torchrun(
    config: str | None, overrides: dict[str, Any], sets: list[str], resume: str | None,
    no_report: bool = False, finished: Callable[[Path], object] | None = None,
) -> int:
    world = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    generation = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if "procs" in overrides and overrides["procs"] != world:
        raise ConfigError(
            f"--procs {overrides['procs']} disagrees with torchrun's world size {world} "
            "(nnodes x nproc-per-node). Under torchrun, leave --procs out."
        )
    overrides = {**overrides, "procs": world}
    cfg = resume_config(Path(resume), overrides, sets) if resume else load_config(config, overrides, sets)
    run_dir = Path(cfg.out or f"runs/torchrun-{os.environ.get('TORCHELASTIC_RUN_ID', 'job')}")
    cfg = cfg.model_copy(update={"out": str(run_dir)})
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    prepared = prepare(cfg, resume=bool(resume), hosts=-(-world // max(local, 1)),
                       testbed=TESTBED_ENV in os.environ)
    if resume and generation == 0:  # a restart continues the same job
        check_resume_steps(run_dir, cfg, prepared.steps)
    fresh = generation == 0 and not resume
    if fresh and rank == 0 and (run_dir / "summary.json").exists():
        raise ConfigError(
            f"--out {run_dir} already holds a finished run; choose another --out "
            f"(or --resume {run_dir} to continue it)."
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    if fresh and rank == 0:
        write_config(run_dir, cfg)
    payload = {"config": cfg.model_dump(), "run_dir": str(run_dir), "resume": bool(resume),
               "rank_logs": False, "progress": True}
    sinks = make_sinks(list(cfg.log), run_dir, cfg.strategy, cfg.model_dump(mode="json")) if rank == 0 else []
    try:
        with LiveLog(run_dir / "ranks", sinks, resume=not fresh,  # rank 0 writes --log
                     per_rank=cfg.log_ranks == "all"):
            run_rank(payload)
    except BaseException as exc:  # recorded in ranks/rank{R}.error.json by run_rank
        if isinstance(exc, PolytrainError):
            print(f"error: rank {rank}: {exc}", file=sys.stderr)
        else:
            traceback.print_exc()
        # no interpreter teardown: with a peer that stopped answering it waits on stuck
        # transfers for seconds, and the agent restarts (or stops) the job only once we exit
        exit_now(1)
    if rank == 0:
        from polytrain.report import format_summary, write_report

        if finished is not None:  # e.g. the planner's prediction, added to summary.json
            finished(run_dir)
        Console().print(format_summary(read_summary(run_dir), run_dir))
        if not no_report:
            write_report(run_dir)
    return 0
