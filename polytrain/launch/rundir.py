"""The run directory: where it goes, and the files rank 0 writes at the end (docs/run-directory.md)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from polytrain.config import JobConfig, to_toml
from polytrain.errors import ConfigError
from polytrain.launch.records import atomic_json, make_run_dir
from polytrain.runtime.job import Job, RankContext
from polytrain.runtime.jsonsafe import json_safe

TESTBED_ENV = "POLYTRAIN_TESTBED_RECORD"  # set by polytrain testbed on every host


def new_run_dir(cfg: JobConfig, base: Path = Path("runs")) -> Path:
    """``--out`` if given (it must not hold another run), else runs/<time>-<strategy>."""
    return make_run_dir(cfg.out, cfg.strategy, base, resume_hint=True)


def write_config(run_dir: Path, cfg: JobConfig) -> None:
    resolved = cfg.model_copy(update={"out": str(run_dir)})
    (run_dir / "config.toml").write_text(to_toml(resolved))


def _whole_run(records: list[dict[str, Any]], events: list[dict[str, Any]]) -> dict[str, Any]:
    """Steps, samples and training time of the whole run: this launch's, plus, after a resume
    or a restart, what the run had done up to its checkpoint (the kept events say)."""
    working = [r for r in records if r["steps"] > 0]
    out = {"steps_run": max((r["steps"] for r in working), default=0),
           "samples": max((r["samples"] for r in working), default=0),
           "wall_s": max((r["wall_s"] for r in working), default=0.0)}
    resumed = [r["resumed"] for r in records if r.get("resumed")]
    if not resumed:
        return out
    steps = [e for e in events if e["event"] == "step"]
    out["steps_run"] = max((int(e["step"]) for e in steps), default=out["steps_run"])
    out["samples"] = max((int(e.get("samples") or 0) for e in steps), default=out["samples"])
    out["wall_s"] += max(float(r["t"]) for r in resumed)
    return out


def build_summary(job: Job, ctx: RankContext, records: list[dict[str, Any]],
                  events: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The run's summary; ``events``: every rank's events of the whole run (after a resume, its
    steps, samples and time count from step 1, and ``resumes`` lists where it resumed)."""
    import polytrain

    whole = _whole_run(records, events or [])
    samples, wall = whole["samples"], whole["wall_s"]
    resumes = [{"from_step": e["from_step"], "t": e["t_base"]} for e in events or []
               if e["event"] == "resume" and e["rank"] == 0]
    losses = [r["final_loss"] for r in records if r["final_loss"] is not None]
    evals = [r["eval"] for r in records if r["eval"]]
    sent = sum(r["bytes_sent"] for r in records)
    metrics: dict[str, Any] = {}
    for r in records:
        for k, v in r["strategy_metrics"].items():
            metrics.setdefault(k, v)
    testbed = os.environ.get(TESTBED_ENV)
    return {
        "strategy": job.config.strategy,
        "world_size": ctx.world,
        "steps": job.steps,
        "steps_run": whole["steps_run"],
        "interrupted": _interrupted(job.steps),
        "skipped_steps": sorted({e["step"] for e in events or [] if e["event"] == "skipped"}),
        "resumes": resumes,
        "samples": samples,
        "wall_s": wall,
        "throughput_samples_per_s": samples / wall if wall > 0 else 0.0,
        "final_loss": sum(losses) / len(losses) if losses else None,
        "eval": evals[0] if evals else None,
        "bytes_sent": sent,
        "bytes_sent_per_sample": sent / samples if samples else 0.0,
        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in records),
        "per_rank": records,
        "strategy_metrics": metrics,
        "config": job.config.model_dump(),
        "testbed": json.loads(testbed) if testbed else None,
        "prediction": _prediction(job, ctx, json.loads(testbed) if testbed else None),
        "backend": ctx.backend,
        "precision": job.config.precision,
        "device": str(ctx.device),
        "polytrain_version": polytrain.__version__,
        "torch_version": torch.__version__,
    }


def _interrupted(steps: int) -> dict[str, Any] | None:
    """How this run was stopped on request (SIGTERM, Ctrl-C), None when it was not."""
    from polytrain.runtime import interrupt

    step = interrupt.stopped_at()
    return None if step is None or step >= steps else {"signal": interrupt.signal_name(), "step": step}


def write_interrupted(run_dir: Path, cfg: JobConfig, signal_name: str) -> dict[str, Any]:
    """The launcher's summary of a run stopped on request whose rank 0 could not write one
    (killed after the grace period): what the ranks' event files hold, marked interrupted."""
    events = []
    for path in sorted((run_dir / "ranks").glob("rank*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue  # a line cut short by the kill
    events.sort(key=lambda e: (e.get("t", 0.0), e.get("rank", 0)))
    with (run_dir / "metrics.jsonl").open("w") as f:
        for e in events:
            f.write(json.dumps(e) + "\n")
    steps = [e for e in events if e.get("event") == "step"]
    last = max((int(e["step"]) for e in steps), default=0)
    losses = [e["loss"] for e in steps if e["step"] == last and e.get("loss") is not None]
    summary = {"strategy": cfg.strategy, "world_size": cfg.procs, "steps_run": last,
               "samples": max((int(e.get("samples") or 0) for e in steps), default=0),
               "final_loss": sum(losses) / len(losses) if losses else None,
               "interrupted": {"signal": signal_name, "step": last, "by": "launcher"},
               "config": cfg.model_dump(mode="json")}
    atomic_json(run_dir / "summary.json", summary)
    return summary


def _prediction(job: Job, ctx: RankContext, testbed: dict[str, Any] | None) -> dict[str, Any]:
    """The planner's prediction for this very job, recorded beside the measurement."""
    from polytrain.plan.predict import predict_run

    return predict_run(job.config, ctx.world, testbed)


def write_results(
    job: Job,
    ctx: RankContext,
    records: list[dict[str, Any]],
    events: list[dict[str, Any]],
    model_state: dict[str, torch.Tensor] | None,
) -> None:
    run_dir = ctx.run_dir
    events.sort(key=lambda e: (e["t"], e["rank"]))
    with (run_dir / "metrics.jsonl").open("w") as f:
        for e in events:
            f.write(json.dumps(json_safe(e)) + "\n")
    if model_state is not None:
        torch.save(model_state, run_dir / "model.pt")
    atomic_json(run_dir / "summary.json", build_summary(job, ctx, records, events))


def read_summary(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "summary.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{run_dir} has no readable summary.json ({e}).") from None
