"""The run directory: where it goes, and the files rank 0 writes at the end (docs/run-directory.md)."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

import torch

import polytrain.env as env
from polytrain.config import JobConfig, to_toml
from polytrain.errors import ConfigError
from polytrain.launch.merge import MergedEvents, merge_all
from polytrain.launch.records import atomic_json, make_run_dir
from polytrain.metrics.jsonsafe import json_safe
from polytrain.runtime.job import Job, RankContext

TESTBED_ENV = env.TESTBED_RECORD  # set by polytrain testbed on every host


def new_run_dir(cfg: JobConfig, base: Path = Path("runs")) -> Path:
    """``--out`` if given (it must not hold another run), else runs/<time>-<strategy>."""
    return make_run_dir(cfg.out, cfg.strategy, base, resume_hint=True)


def write_config(run_dir: Path, cfg: JobConfig) -> None:
    resolved = cfg.model_copy(update={"out": str(run_dir)})
    (run_dir / "config.toml").write_text(to_toml(resolved))


def _whole_run(records: list[dict[str, Any]], events: list[dict[str, Any]]) -> dict[str, Any]:
    """Steps, samples, training time and bytes of the whole run: this launch's, plus, after a
    resume or a restart, what the run had done up to its checkpoint (the kept events say)."""
    working = [r for r in records if r["steps"] > 0]
    out = {"steps_run": max((r["steps"] for r in working), default=0),
           "samples": max((r["samples"] for r in working), default=0),
           "wall_s": max((r["wall_s"] for r in working), default=0.0),
           "bytes_sent": sum(int(r.get("bytes_sent_run", r["bytes_sent"])) for r in records)}
    resumed = [r["resumed"] for r in records if r.get("resumed")]
    if not resumed:
        return out
    steps = [e for e in events if e["event"] == "step"]
    out["steps_run"] = max((int(e["step"]) for e in steps), default=out["steps_run"])
    out["samples"] = max((int(e.get("samples") or 0) for e in steps), default=out["samples"])
    out["wall_s"] += max(float(r["t"]) for r in resumed)
    return out


def _segments(events: list[dict[str, Any]], whole: dict[str, Any]) -> list[dict[str, Any]]:
    """One entry per launch of the run (a fresh start, then each resume or restart): the steps
    it contributed, its training time, samples, bytes and throughput. A launch that was killed
    counts up to the checkpoint the next one resumed from (later work was done again)."""
    starts = sorted({int(e["from_step"]) for e in events  # 0: a restart from scratch
                     if e["event"] == "resume" and e["rank"] == 0 and int(e["from_step"]) > 0})
    t_at = {int(e["from_step"]): float(e["t_base"]) for e in events
            if e["event"] == "resume" and e["rank"] == 0}
    samples_at: dict[int, int] = {}
    bytes_at: dict[int, int] = {}
    for e in events:
        if e["event"] == "step":
            samples_at[int(e["step"])] = max(samples_at.get(int(e["step"]), 0), int(e.get("samples") or 0))
        elif e["event"] == "tally":
            bytes_at[int(e["step"])] = bytes_at.get(int(e["step"]), 0) + int(e["bytes_sent"])
    bounds = [0, *starts, int(whole["steps_run"])]
    marks = {0: (0.0, 0, 0), bounds[-1]: (whole["wall_s"], whole["samples"], whole["bytes_sent"])}
    for b in starts:
        marks.setdefault(b, (t_at[b], samples_at.get(b, 0), bytes_at.get(b, 0)))
    out = []
    for a, b in itertools.pairwise(bounds):
        (t0, s0, b0), (t1, s1, b1) = marks[a], marks[b]
        wall = max(0.0, t1 - t0)
        out.append({"from_step": a + 1, "to_step": b, "wall_s": wall, "samples": s1 - s0,
                    "bytes_sent": b1 - b0,
                    "throughput_samples_per_s": (s1 - s0) / wall if wall > 0 else 0.0})
    return out


def from_events(records: list[dict[str, Any]], events: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary's figures that come from the events (``events``: every rank's, or only those
    :meth:`polytrain.metrics.recorder.Recorder.summary_events` keeps: the same figures)."""
    whole = _whole_run(records, events)
    return {"steps_run": whole["steps_run"],
            "skipped_steps": sorted({e["step"] for e in events if e["event"] == "skipped"}),
            "divergence_warnings": _warned(events),
            "resumes": [{"from_step": e["from_step"], "t": e["t_base"]} for e in events
                        if e["event"] == "resume" and e["rank"] == 0],
            "segments": _segments(events, whole),
            "samples": whole["samples"], "wall_s": whole["wall_s"],
            "bytes_sent": whole["bytes_sent"]}


def build_summary(job: Job, ctx: RankContext, records: list[dict[str, Any]],
                  events: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The run's summary; ``events``: every rank's events of the whole run (after a resume, its
    steps, samples and time count from step 1, and ``resumes`` lists where it resumed)."""
    from polytrain.version import __version__

    seen = from_events(records, events or [])
    samples, wall = seen["samples"], seen["wall_s"]
    losses = [r["final_loss"] for r in records if r["final_loss"] is not None]
    evals = [r["eval"] for r in records if r["eval"]]
    sent = seen["bytes_sent"]
    metrics: dict[str, Any] = {}
    for r in records:
        for k, v in r["strategy_metrics"].items():
            metrics.setdefault(k, v)
    testbed = os.environ.get(TESTBED_ENV)
    return {
        "strategy": job.config.strategy,
        "world_size": ctx.world,
        "steps": job.steps,
        "steps_run": seen["steps_run"],
        "interrupted": _interrupted(job.steps),
        "stopped": _stopped(job.steps),
        "skipped_steps": seen["skipped_steps"],
        "divergence_warnings": seen["divergence_warnings"],
        "resumes": seen["resumes"],
        "segments": seen["segments"],
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
        "model_call": job.model_call or None,
        "testbed": json.loads(testbed) if testbed else None,
        "backend": ctx.backend,
        "precision": job.config.precision,
        "device": str(ctx.device),
        "polytrain_version": __version__,
        "torch_version": torch.__version__,
    }


def _stopped(steps: int) -> dict[str, Any]:
    """Why the run ended, as rank 0 saw it: completed, or interrupted (SIGTERM, Ctrl-C). A run
    that failed or diverged gets its summary from the launcher (``write_stopped``)."""
    stop = _interrupted(steps)
    return {"reason": "interrupted", **stop} if stop else {"reason": "completed"}


def _interrupted(steps: int) -> dict[str, Any] | None:
    """How this run was stopped on request (SIGTERM, Ctrl-C), None when it was not."""
    from polytrain.runtime import interrupt

    step = interrupt.stopped_at()
    return None if step is None or step >= steps else {"signal": interrupt.signal_name(), "step": step}


def write_interrupted(run_dir: Path, cfg: JobConfig, signal_name: str,
                      merged: MergedEvents | None = None) -> dict[str, Any]:
    """The launcher's summary of a run stopped on request whose rank 0 could not write one
    (killed after the grace period): what the ranks' event files hold, marked interrupted."""
    return write_stopped(run_dir, cfg, {"reason": "interrupted", "signal": signal_name},
                         interrupted=True, merged=merged)


def write_stopped(run_dir: Path, cfg: JobConfig, stopped: dict[str, Any], *,
                  interrupted: bool = False, merged: MergedEvents | None = None) -> dict[str, Any]:
    """The launcher's summary of a run whose rank 0 wrote none (a rank failed or diverged, or
    the ranks were killed): what the ranks' event files hold, and ``stopped``: why it ended.
    ``merged``: the launcher's merge of those files as they grew (only their unread tails are
    read now); without it the whole files are merged here (``metrics.jsonl`` either way)."""
    if merged is None:
        merged = merge_all(run_dir / "ranks", run_dir / "metrics.jsonl")
    else:
        merged.finish()
    seen = merged.summary()
    last = seen["steps_run"]
    summary = {"strategy": cfg.strategy, "world_size": cfg.procs, "steps": cfg.steps,
               "steps_run": last,
               "samples": seen["samples"],
               "final_loss": seen["final_loss"],
               "interrupted": ({"signal": stopped["signal"], "step": last, "by": "launcher"}
                               if interrupted else None),
               "stopped": {**stopped, "after_step": last},
               "divergence_warnings": seen["divergence_warnings"],
               "config": cfg.model_dump(mode="json")}
    atomic_json(run_dir / "summary.json", summary)
    return summary


def record_failure(run_dir: Path, cfg: JobConfig, rank: int,
                   merged: MergedEvents | None = None) -> str:
    """After a failed run (every rank stopped): set aside the checkpoints a divergence may have
    touched, write summary.json saying why the run stopped, and return a sentence for the
    launcher's message (empty when there is nothing to add)."""
    from polytrain.launch.records import read_error_record
    from polytrain.runtime.checkpoint import CheckpointStore

    record = read_error_record(run_dir, rank) or {}
    stopped: dict[str, Any] = {"reason": "failed", "rank": rank, "error": record.get("error")}
    note = ""
    diverged = record.get("diverged")
    if isinstance(diverged, dict) and isinstance(diverged.get("since"), int):
        stopped |= {"reason": "diverged", "step": diverged.get("step"), "since": diverged["since"]}
        store = CheckpointStore(run_dir / "checkpoints", "")
        moved, good = (store.set_aside_after(diverged["since"] - 1) if store.root.is_dir()
                       else ([], None))
        stopped |= {"set_aside": moved, "last_good_checkpoint": good}
        if good:
            note = (f"\nLast good checkpoint: {good} (before the divergence window); continue "
                    f"with: polytrain train --resume {run_dir} --lr <lower>")
        if moved:
            note += f"\nSet aside as diverged-*: {', '.join(moved)}"
    try:
        write_stopped(run_dir, cfg, stopped, merged=merged)
    except OSError as exc:  # e.g. the disk that failed the run is still full
        return note + f"\n(summary.json could not be written: {exc.strerror})"
    return note


def _warned(events: list[dict[str, Any]]) -> list[int]:
    """Steps where --on-divergence warn noted a loss over its bound (any rank)."""
    return sorted({int(e["step"]) for e in events if e.get("event") == "divergence"})


def write_results(
    job: Job,
    ctx: RankContext,
    records: list[dict[str, Any]],
    events: list[dict[str, Any]],
    model_state: dict[str, torch.Tensor] | None,
    metrics: bool = True,
) -> None:
    """Rank 0's record of the run: ``metrics.jsonl`` from ``events`` (unless ``metrics`` is
    False: the launcher merges it), ``model.pt`` and ``summary.json``."""
    run_dir = ctx.run_dir
    events.sort(key=lambda e: (e["t"], e["rank"]))
    if metrics:
        with (run_dir / "metrics.jsonl").open("w") as f:
            for e in events:
                f.write(json.dumps(json_safe(e)) + "\n")
    if model_state is not None:  # the user's own key names: MyModel(...).load_state_dict(...)
        from polytrain.models.export import user_state_dict

        torch.save(user_state_dict(model_state, job.form, job.user_keys), run_dir / "model.pt")
    atomic_json(run_dir / "summary.json", build_summary(job, ctx, records, events))


def read_summary(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "summary.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{run_dir} has no readable summary.json ({e}).") from None
