"""An RL job's ranks: the policy they run under (actors may die alone) and their entry point.

The ranks are started and watched by :mod:`polytrain.launch.supervisor`, the launcher for jobs
whose policy names ranks that may be lost: a learner, replay or parameter server that fails ends
the run; an actor that dies is recorded in ``lost_actors`` and the replay process stops counting
it (see :mod:`polytrain.rl.protocol`). Each rank writes ``ranks/rank{R}.result.json`` when it
finishes; the launcher assembles ``summary.json`` from those files, so a dead actor never
blocks a gather.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from polytrain.launch.records import write_error_record
from polytrain.launch.supervisor import RankPolicy, Supervision, exit_with, start_ranks, supervise
from polytrain.metrics.jsonsafe import atomic_json
from polytrain.rl.config import RLConfig
from polytrain.rl.roles import describe, layout_ranks, role

GRACE_S = 15.0  # after the lead learner finished: how long the others may take to leave (+ --actor-timeout)
ACTOR_GRACE_S = 3.0  # after every learner and server ended: how long a halted actor may take
HANG_S = 120.0  # beyond --max-seconds + --timeout: the last resort against a hang


def policy(cfg: RLConfig) -> RankPolicy:
    """Actors are expendable; the lead learner's clean exit ends the run."""
    ranks = layout_ranks(cfg)
    world = range(cfg.world)
    return RankPolicy(roles=tuple(role(ranks, r)[0] for r in world),
                      labels=tuple(describe(ranks, r) for r in world),
                      lead=ranks.lead, expendable=frozenset({"actor"}),
                      lead_grace_s=GRACE_S + cfg.actor_timeout_s, expendable_grace_s=ACTOR_GRACE_S,
                      deadline_s=cfg.max_seconds + cfg.timeout_s + HANG_S, app="RL job")


def start(cfg: RLConfig, run_dir: Path, port: int, resume: bool = False,
          env: dict[str, str] | None = None) -> dict[int, Any]:
    """Start every rank; ``env``: variables each sets before joining the process group (the
    private store's, :func:`polytrain.launch.stores.rank_store_env`)."""
    payload = {"config": cfg.model_dump(), "run_dir": str(run_dir), "port": port, "world": cfg.world,
               "resume": resume, "env": env or {}}
    return start_ranks(rank_main, payload, cfg.world, ["polytrain.rl.preload"], "polytrain-rl")


def watch(cfg: RLConfig, run_dir: Path, procs: dict[int, Any], started: float) -> Supervision:
    """Supervise the ranks under :func:`policy` until the run ends."""
    return supervise(procs, policy(cfg), run_dir, started, cfg.debug)


def rank_main(payload: dict[str, Any], rank: int) -> None:
    """Entry point of one RL process (started by :func:`start`)."""
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
