"""The RL run directory: where it goes, and the summary the launcher assembles at the end.

    RUN/config.toml      the resolved RL job
    RUN/metrics.jsonl    every rank's events merged, sorted by (t, rank)
    RUN/summary.json     the figures below
    RUN/model.pt         the learner's final Q-network (state_dict)
    RUN/return_vs_time.png, RUN/return_vs_steps.png
    RUN/checkpoints/step-K/rank{R}.pt, LATEST   --checkpoint-every: training's store (rl/checkpoint.py)
    RUN/ranks/rank{R}.jsonl | .log | .result.json | .error.json
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from polytrain.launch.records import make_run_dir
from polytrain.launch.supervisor import Supervision
from polytrain.metrics.summary import RLSummary
from polytrain.rl.config import RLConfig
from polytrain.rl.roles import describe, layout_ranks
from polytrain.runtime.layout import Layout


def new_run_dir(cfg: RLConfig, base: Path = Path("runs")) -> Path:
    """``--out`` if given (it must not hold another run), else runs/<time>-rl-<algo>."""
    return make_run_dir(cfg.out, f"rl-{cfg.algo}", base)


def write_config(run_dir: Path, cfg: RLConfig) -> None:
    import tomli_w

    data = {k: v for k, v in cfg.model_copy(update={"out": str(run_dir)}).model_dump().items()
            if v is not None}
    (run_dir / "config.toml").write_text(tomli_w.dumps(data))


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def merge_events(run_dir: Path, world: int) -> list[dict[str, Any]]:
    events = []
    for rank in range(world):
        path = run_dir / "ranks" / f"rank{rank}.jsonl"
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            if line.endswith("}"):  # a killed rank may leave a torn last line
                events.append(json.loads(line))
    events.sort(key=lambda e: (e["t"], e["rank"]))
    with (run_dir / "metrics.jsonl").open("w") as f:
        for e in events:
            f.write(json.dumps(e) + "\n")
    return events


def _bytes(records: dict[int, dict[str, Any]], world: int) -> tuple[int, dict[str, int], dict[str, int]]:
    """(bytes sent by all ranks, by operation, by rank). A rank without a record (a dead actor)
    is credited with what the others received from it — measured, on the receiving side."""
    total, by_rank = 0, {}
    by_op: defaultdict[str, int] = defaultdict(int)
    for rank in range(world):
        rec = records.get(rank)
        if rec is not None and "bytes_sent" in rec:
            sent = int(rec["bytes_sent"])
            for op, n in rec["bytes_by_op"].items():
                by_op[op] += n
        else:
            sent = sum(int(r.get("received_by_peer", {}).get(str(rank), 0)) for r in records.values())
            by_op["from_lost_actors"] += sent
        by_rank[str(rank)] = sent
        total += sent
    return total, dict(by_op), by_rank


def _lead_events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "ranks" / "rank0.jsonl"
    return [json.loads(line) for line in (path.read_text().splitlines() if path.exists() else [])
            if line.endswith("}")]


def startup_s(run_dir: Path, sup: Supervision) -> float:
    """Seconds from this launch to its clock's start (every process up and connected); a
    resumed run's file also holds the earlier launches' ``start`` events: the last is this one's."""
    starts = [ev for ev in _lead_events(run_dir) if ev["event"] == "start"]
    return float(starts[-1]["epoch"]) - sup.launch_epoch if starts else 0.0


def resumes(run_dir: Path) -> list[dict[str, Any]]:
    """Where the run was resumed (as the training loop's summary lists them): env steps, learner
    updates and the run's clock at the checkpoint it continued from."""
    return [{"from_env_steps": ev["env_steps"], "updates": ev["updates"], "t": ev["t_base"]}
            for ev in _lead_events(run_dir) if ev["event"] == "resume"]


def _lost(sup: Supervision, ranks: Layout, replay: dict[str, Any], cfg: RLConfig,
          offset: float) -> list[dict[str, Any]]:
    """Lost actors, with times on the run's clock (``offset``: launch -> clock origin)."""
    from polytrain.rl.core import epsilon_ladder

    eps = epsilon_ladder(cfg.actors, cfg.eps_base, cfg.eps_alpha)
    detected = replay.get("lost", {})
    out = []
    for ex in sup.lost:
        i = ranks.actor_ranks.index(ex.rank)
        out.append({"rank": ex.rank, "actor": i, "epsilon": eps[i], "cause": ex.cause,
                    "exited_at_s": round(ex.at_s - offset, 3),
                    "detected_by_replay_at_s": detected.get(str(ex.rank))})
    for rank_s, at in detected.items():  # silent but never exited (hung): lost all the same
        if int(rank_s) not in {ex.rank for ex in sup.lost}:
            i = ranks.actor_ranks.index(int(rank_s))
            out.append({"rank": int(rank_s), "actor": i, "epsilon": eps[i], "cause": "silent",
                        "exited_at_s": None, "detected_by_replay_at_s": at})
    return out


LEAD_FIGURES = ("target_return", "solved", "stop_reason", "time_to_target_s", "target_confirmed_s",
                "env_steps_to_target", "best_mean_return", "final_mean_return", "final_eval_episodes",
                "evaluations", "eval_s")


def build_summary(cfg: RLConfig, run_dir: Path, sup: Supervision) -> dict[str, Any]:
    from polytrain.version import __version__

    ranks = layout_ranks(cfg)
    records = {r: rec for r in range(cfg.world)
               if (rec := _load(run_dir / "ranks" / f"rank{r}.result.json")) is not None}
    lead = records[ranks.lead]["result"]
    replay = records[ranks.replay_rank]["result"] if ranks.replay_rank in records else {}
    learners = [records[r]["result"] for r in ranks.replica_ranks if r in records]
    actors = [records[r]["result"] for r in ranks.actor_ranks if r in records]
    sent, by_op, by_rank = _bytes(records, cfg.world)
    offset = startup_s(run_dir, sup)
    env_steps = replay.get("env_steps", lead.get("env_steps", 0))
    resumed = resumes(run_dir)
    base = resumed[-1]["t"] if resumed else 0.0  # the run's clock when this launch's began
    run_s = lead["wall_s"] + base  # the whole run's
    updates = sum(r["learner_updates"] for r in learners)
    return {
        "strategy": cfg.algo, "algo": cfg.algo, "env": cfg.env, "world_size": cfg.world,
        "roles": {str(r): describe(ranks, r) for r in range(cfg.world)},
        "env_steps": env_steps,
        "episodes": replay.get("episodes", lead.get("episodes", 0)),
        **{k: lead.get(k) for k in LEAD_FIGURES},
        "learner_updates": updates,
        "learner_updates_per_s": sum(r["learner_updates_per_s"] for r in learners),
        "actor_steps_per_s": env_steps / run_s if run_s > 0 else 0.0,
        "per_actor_steps_per_s": [a.get("actor_steps_per_s") for a in actors],
        "replay_size": replay.get("replay_size", lead.get("replay_size")),
        "replay_capacity": cfg.replay_capacity,
        "bytes_sent": sent, "bytes_by_op": by_op, "bytes_by_rank": by_rank,
        "bytes_sent_per_env_step": sent / env_steps if env_steps else 0.0,
        "wall_s": run_s, "launch_wall_s": sup.wall_s, "startup_s": offset, "resumes": resumed,
        "lost_actors": _lost(sup, ranks, replay, cfg, offset - base),
        "exits": {str(r): {"role": e.role, "cause": e.cause, "at_s": round(e.at_s - offset + base, 3)}
                  for r, e in sorted(sup.exits.items())},
        "peak_rss_bytes": max((r["peak_rss_bytes"] for r in records.values()), default=0),
        "per_rank": [records[r] for r in sorted(records)],
        "config": cfg.model_dump(), "polytrain_version": __version__,
        "torch_version": torch.__version__,
    }


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    RLSummary.of(summary).write(run_dir)
