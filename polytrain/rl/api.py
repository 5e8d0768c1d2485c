"""Run an RL job from Python: ``polytrain.rl.api.run(algo="apex", actors=3)`` -> summary dict."""

from __future__ import annotations

import shutil
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from rich.console import Console

from polytrain.errors import Interrupted
from polytrain.launch.records import free_port
from polytrain.rl.config import RLConfig, check_qnet, make_rl_config


def run_config(cfg: RLConfig, console: Console | None = None, progress: bool = True,
               plots: bool = True, resume: bool = False) -> dict[str, Any]:
    """Validate-free entry for an RLConfig: start, supervise, assemble, plot. ``resume``: continue
    the run in ``cfg.out`` from its checkpoint (options from :func:`resume_config`). A SIGTERM or
    Ctrl-C stops every process; the run ends with :class:`Interrupted`."""
    from polytrain.launch.stores import rank_store_env
    from polytrain.rl.progress import FollowRL
    from polytrain.rl.ranks import start, watch
    from polytrain.rl.results import build_summary, merge_events, new_run_dir, write_config, write_summary

    check_qnet(cfg)  # a broken user Q-network fails here, before any process starts
    run_dir = Path(str(cfg.out)) if resume else new_run_dir(cfg)
    write_config(run_dir, cfg)
    console = console or Console(stderr=True)
    started = time.monotonic()
    private = run_dir / "ranks" / "store"  # the process group's store, 0700
    procs = start(cfg, run_dir, free_port(), resume, rank_store_env(private))
    follow = FollowRL(run_dir / "ranks" / "rank0.jsonl", cfg, console) if progress else nullcontext()
    try:
        with follow:
            sup = watch(cfg, run_dir, procs, started)
    finally:
        shutil.rmtree(private, ignore_errors=True)
        merge_events(run_dir, cfg.world)
    if sup.stop_signal is not None:
        raise _interrupted(cfg, run_dir, sup)
    summary = build_summary(cfg, run_dir, sup)
    summary["run_dir"] = str(run_dir)
    write_summary(run_dir, summary)
    if plots:
        from polytrain.rl.plots import write_plots

        summary["plots"] = [str(p) for p in write_plots(run_dir)]
        write_summary(run_dir, summary)
    return summary


def _interrupted(cfg: RLConfig, run_dir: Path, sup: Any) -> Interrupted:
    """A run stopped by SIGTERM/Ctrl-C: its summary marked ``interrupted`` (when the lead learner
    reported), and the one line the CLI prints."""
    import signal

    from polytrain.rl.results import build_summary, write_summary

    try:
        summary = build_summary(cfg, run_dir, sup)
    except (KeyError, OSError, ValueError):  # stopped before the lead learner could report
        summary = {"strategy": cfg.algo, "algo": cfg.algo, "config": cfg.model_dump()}
    steps = summary.get("env_steps")
    summary.update(run_dir=str(run_dir), interrupted={"signal": sup.stop_signal, "env_steps": steps})
    write_summary(run_dir, summary)
    from polytrain.rl.checkpoint import has_checkpoint

    saved = has_checkpoint(run_dir)
    then = (f"continue with: polytrain rl {cfg.algo} --resume {run_dir} --max-env-steps N" if saved
            else "no checkpoint (--checkpoint-every N writes one at the stop)")
    where = f"after {steps} env steps" if steps is not None else "before the learner reported"
    return Interrupted(f"{sup.stop_signal}: {cfg.algo} stopped {where}; summary.json (marked "
                       f"interrupted) in {run_dir}; {then}.",
                       128 + int(signal.Signals[sup.stop_signal]))


def resume_config(run_dir: str, options: dict[str, Any]) -> RLConfig:
    """The config of a run continued from its checkpoint (ConfigError if it cannot be)."""
    from polytrain.rl.resume import resume_options

    return make_rl_config(resume_options(Path(run_dir), options))


def run(console: Console | None = None, progress: bool = True, plots: bool = True,
        **options: Any) -> dict[str, Any]:
    """Validate ``options`` (RLConfig fields; ConfigError before any process starts) and run."""
    return run_config(make_rl_config(options), console=console, progress=progress, plots=plots)
