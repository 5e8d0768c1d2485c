"""The Python API: ``polytrain.train(...)`` and ``polytrain.compare(...)``.

    import polytrain
    summary = polytrain.train(strategy="allreduce", procs=2, model="my_pkg.nets:make_model",
                              dataset="digits", steps=200)
    print(summary.eval["accuracy"], summary.throughput_samples_per_s)

``model``, ``dataset`` and ``loss`` may also be objects: a factory function or class, an
``nn.Module`` instance, an in-memory dataset (a torch ``Dataset``, tensors ``(x, y)``), a loss
function (:mod:`polytrain.memory`).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

import polytrain.env as env
from polytrain.config import JobConfig, load_config
from polytrain.errors import ConfigError
from polytrain.launch.precheck import precheck
from polytrain.metrics.summary import TrainSummary

REPORT_ENV = env.REPORT  # "0": the API writes no plots/report.md (the test suite's default)


def _config(config: str | Path | None, sets: Sequence[str] | None, kw: dict[str, Any]) -> JobConfig:
    from polytrain.memory import resolve

    resolve(kw)  # model/dataset/loss objects -> names the ranks import, or files they load
    cfg = load_config(config, kw, list(sets or []))
    precheck(cfg)  # before torch is imported: the commonest refusals in well under a second
    return cfg


def train(*, config: str | Path | None = None, sets: Sequence[str] | None = None,
          resume: str | Path | None = None, console: Console | None = None,
          report: bool | None = None, **options: Any) -> TrainSummary:
    """Run one job (keyword arguments are JobConfig fields) and return its summary.json, typed
    (:class:`~polytrain.metrics.summary.TrainSummary`: ``s.eval``, ``s.strategy_metrics``; read by
    key too, ``s["eval"]``; ``s.to_dict()`` is the JSON object).

    The run directory is the CLI's, report included (plots, timeline, report.md) unless
    ``report=False`` (default: on, or the environment's ``POLYTRAIN_REPORT=0``)."""
    if resume is not None:
        from polytrain.launch.local import launch
        from polytrain.launch.prepare import resume_config

        run_dir = Path(resume)
        cfg = resume_config(run_dir, options, list(sets or []))
        _check_checkpoints(run_dir, cfg, console or Console(stderr=True))
        summary = launch(cfg, resume=True, run_dir=run_dir, console=console)
    else:
        cfg = _config(config, sets, options)
        from polytrain.launch.local import launch  # torch: after the job's fields are checked

        summary = launch(cfg, console=console)
    summary = _predicted(summary)
    _write_report(summary, report)
    return TrainSummary.of(summary, f"{(summary.get('config') or {}).get('out', 'the run')}/summary.json")


def _predicted(summary: dict[str, Any]) -> dict[str, Any]:
    """The run's summary with the planner's prediction for it beside the measurement (the launcher
    runs below the planner, so the prediction is added here, after the run)."""
    from polytrain.plan.predict import record_prediction

    out = (summary.get("config") or {}).get("out")
    return record_prediction(Path(out)) if out else summary


def _write_report(summary: dict[str, Any], report: bool | None) -> None:
    if report is None:
        report = os.environ.get(REPORT_ENV, "1") != "0"
    out = (summary.get("config") or {}).get("out")
    if report and out:
        from polytrain.report import write_report

        write_report(Path(out))


def _check_checkpoints(run_dir: Path, cfg: JobConfig, console: Console) -> None:
    """Refuse a resume without a good checkpoint before any process starts; warn about bad ones."""
    from polytrain.runtime.checkpoint import CheckpointStore
    from polytrain.strategies.base import job_fingerprint

    ckpt, warnings = CheckpointStore(run_dir / "checkpoints", job_fingerprint(cfg)).find_good()
    for w in warnings:
        console.print(f"[yellow]warning:[/] {w}; resuming from {ckpt.name} instead", highlight=False)


def compare(strategies: Sequence[str], *, config: str | Path | None = None,
            sets: Sequence[str] | None = None, target_accuracy: float | None = None,
            console: Console | None = None, **options: Any) -> dict[str, Any]:
    """Run the same job with each strategy; write and return compare.json.

    ``single`` always runs on one process (it is the reference); the others on ``procs``.
    Every process of every side gets the same threads (cores / the largest ``procs``, or the
    caller's ``OMP_NUM_THREADS``), so that ``single`` is not timed with all the cores while each
    rank of the others has a share; compare.json records the threads each side's ranks ran with.
    """
    if not strategies:
        raise ConfigError("compare needs at least one strategy, e.g. --strategies single,allreduce")
    base = _config(config, sets, options)
    for name in strategies:
        precheck(base.model_copy(update={"strategy": name, "procs": 1 if name == "single" else base.procs}))
    from polytrain.launch.local import launch  # torch: after the torch-free checks
    from polytrain.launch.prepare import prepare

    root = Path(base.out) if base.out else Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-compare"
    if (root / "compare.json").exists():
        raise ConfigError(f"--out {root} already holds a comparison; choose another --out.")
    jobs = []
    for name in strategies:
        procs = 1 if name == "single" else base.procs
        cfg = base.model_copy(update={"strategy": name, "procs": procs, "out": str(root / name)})
        prepare(cfg)  # every job is checked before the first one starts
        jobs.append(cfg)
    root.mkdir(parents=True, exist_ok=True)
    summaries = []
    with _equal_threads(max(cfg.procs for cfg in jobs)) as threads:
        for cfg in jobs:
            summary = _predicted(launch(cfg, console=console))
            if target_accuracy is not None:
                summary["time_to_accuracy_s"] = _time_to_accuracy(Path(cfg.out or ""), target_accuracy)
            summary["threads_per_process"] = _threads_run(Path(cfg.out or ""))
            summaries.append(summary)
    result: dict[str, Any] = {"strategies": summaries, "target_accuracy": target_accuracy,
                              "threads_per_process": threads}
    (root / "compare.json").write_text(json.dumps(result, indent=1))
    result["out"] = str(root)
    return result


@contextlib.contextmanager
def _equal_threads(procs: int) -> Iterator[int]:
    """``OMP_NUM_THREADS`` for every side of a comparison: the caller's, else cores / ``procs``
    (what the widest side's ranks get); the caller's environment is restored afterwards."""
    saved = os.environ.get("OMP_NUM_THREADS")
    threads = int(saved) if saved and saved.isdigit() else max(1, (os.cpu_count() or 1) // procs)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        yield threads
    finally:
        if saved is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = saved


def _threads_run(run_dir: Path) -> list[int]:
    """The threads each rank of a run reported it ran with (its ``process`` events, by rank)."""
    path = run_dir / "metrics.jsonl"
    found: dict[int, int] = {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        ev = json.loads(line)
        if ev.get("event") == "process" and "threads" in ev:
            found[int(ev.get("rank", 0))] = int(ev["threads"])
    return [found[r] for r in sorted(found)]


def _time_to_accuracy(run_dir: Path, target: float) -> float | None:
    """Seconds until the first evaluation at or above ``target`` (None: never reached)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None
    for line in path.read_text().splitlines():
        ev = json.loads(line)
        if ev.get("event") == "eval" and ev.get("accuracy", 0) >= target:
            return float(ev["t"])
    return None


def under_torchrun() -> bool:
    """True inside a worker started by torchrun (or any torch elastic agent)."""
    return "TORCHELASTIC_RUN_ID" in os.environ and "LOCAL_RANK" in os.environ
