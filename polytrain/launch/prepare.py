"""Everything checkable about a job is checked here, before any process starts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polytrain.config import JobConfig, load_config, total_steps
from polytrain.data import DataSpec, dataset_spec, validate_dataset_options
from polytrain.errors import ConfigError
from polytrain.launch.precheck import precheck
from polytrain.models import is_user_model, validate_model
from polytrain.models.contract import check_job
from polytrain.runtime.live_log import check_sinks
from polytrain.runtime.supports import Request, refusal, requested, training_asked
from polytrain.strategies import Strategy, get_strategy_class, make_strategy, registry

# Flags that may differ when a run is resumed: they do not change what the steps compute.
RESUMABLE_CHANGES = {
    "steps",
    "epochs",
    "timeout_s",
    "debug",
    "checkpoint_every",
    "eval_every",
    "keep_checkpoints",
    "out",
    "on_nonfinite",
    "on_divergence",
    "divergence_factor",
    "divergence_window",
    "max_param",
    "device",  # the same steps on other hardware (float rounding may differ)
    "log",
    "log_ranks",
    "activation_checkpointing",  # recomputes the same forward
}


@dataclass
class Prepared:
    config: JobConfig
    strategy: Strategy
    spec: DataSpec
    steps: int
    note: str | None = None  # a change made to the job, for the launcher to say


def fixed_world(cfg: JobConfig) -> tuple[JobConfig, str | None]:
    """A strategy that runs on a fixed number of processes (``single``: 1) gets it when
    ``--procs`` was left at its default, and a note saying so; an explicit --procs is checked
    by the strategy as given."""
    fixed = get_strategy_class(cfg.strategy).fixed_procs
    if fixed is None or cfg.procs == fixed or "procs" in cfg.model_fields_set:
        return cfg, None
    note = (f"--strategy {cfg.strategy} runs on {fixed} process (not the default --procs "
            f"{cfg.procs}, which is for parallel strategies)")
    return cfg.model_copy(update={"procs": fixed}), note


def job_request(cfg: JobConfig, *, resume: bool = False, hosts: int = 1,
                testbed: bool = False) -> Request:
    """The features (checkpoint, resume, eval, ...) this launch asks of its strategy."""
    return requested(cfg.options, checkpoint_every=cfg.checkpoint_every, eval_every=cfg.eval_every,
                     resume=resume, hosts=hosts, testbed=testbed, training=training_asked(cfg))


def check_supports(cfg: JobConfig, request: Request, strategy: Strategy | None = None) -> None:
    """Refuse what the strategy does not honour, naming the strategies that do.

    Without ``strategy`` the check uses what the class declares (before its options are
    validated); with it, what it honours under these options (``Strategy.supports_for``).
    """
    table = [(n, c.declared()) for n, c in registry().items()]
    supports = (strategy.supports_for(cfg) if strategy is not None
                else get_strategy_class(cfg.strategy).declared())
    problem = refusal(cfg.strategy, supports, request, table)
    if problem:
        raise ConfigError(problem)


def prepare(cfg: JobConfig, *, resume: bool = False, hosts: int = 1,
            testbed: bool = False) -> Prepared:
    """Validate strategy, options, dataset, model and their fit, and that the strategy honours
    what the launch asks (``resume``, ``hosts`` > 1 under torchrun, ``testbed``); raise
    ConfigError otherwise."""
    cfg, note = fixed_world(cfg)
    precheck(cfg)  # the torch-free checks first: their refusals read the same either way
    request = job_request(cfg, resume=resume, hosts=hosts, testbed=testbed)
    check_supports(cfg, request)
    strategy = make_strategy(cfg.strategy, cfg.options)
    check_supports(cfg, request, strategy)
    validate_dataset_options(cfg.dataset, cfg.data_options)
    spec = dataset_spec(cfg.dataset, cfg.data_options)
    validate_model(cfg.model, spec, cfg.model_options)
    if is_user_model(cfg.model) or cfg.loss or ":" in cfg.dataset:
        check_job(cfg.model, cfg.model_options, spec, cfg.loss, cfg.dataset, cfg.data_options)
    strategy.check(cfg, cfg.procs)
    check_device(cfg.device)
    check_sinks(list(cfg.log))
    if cfg.log and hosts > 1:
        raise ConfigError(f"--log {','.join(cfg.log)} under torchrun across {hosts} hosts: it is "
                          "written from rank 0's host, which sees only its own ranks' event files. "
                          "Drop --log (metrics.jsonl holds every rank's figures after the run), or "
                          "run on one host.")
    check_data_size(cfg, spec)
    steps = total_steps(cfg, spec.train_size)
    return Prepared(cfg, strategy, spec, steps, note)


def check_device(device: str) -> None:
    """``--device cuda`` where this host sees no GPU: refused here, before any process starts."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise ConfigError(f"--device cuda: no CUDA device is visible on this host (torch "
                          f"{torch.__version__}, {build}). Use --device cpu (or auto, which "
                          "takes a GPU when there is one).")


def check_data_size(cfg: JobConfig, spec: DataSpec) -> None:
    """A global batch larger than the training set would repeat samples within one step."""
    if 0 < spec.train_size < cfg.batch_size:
        raise ConfigError(
            f"--batch-size {cfg.batch_size} is larger than the {spec.train_size} training samples "
            f"of dataset '{cfg.dataset}': a batch would hold samples twice. Use --batch-size "
            f"{spec.train_size} or less, or more data.")


def check_resume_steps(run_dir: Path, cfg: JobConfig, steps: int) -> int:
    """The step of ``run_dir``'s newest good checkpoint; ConfigError when the job (``steps``)
    ends there or before: a resume with nothing to train would overwrite the run's results.
    Called before the ranks start; it removes a killed run's half-written checkpoints."""
    from polytrain.runtime.checkpoint import CheckpointStore
    from polytrain.strategies.base import job_fingerprint

    store = CheckpointStore(run_dir / "checkpoints", job_fingerprint(cfg))
    done = store.step_of(store.find_good()[0])
    if steps > done:
        store.remove_stale()  # no rank runs yet: every half-written checkpoint is a dead run's
    if steps <= done:
        raise ConfigError(
            f"--resume {run_dir}: its newest checkpoint is at step {done} and this job ends at "
            f"step {steps}, so there is nothing to train (nothing was started or written). Pass "
            f"--steps above {done} (or more --epochs) to train further.")
    return done


def resume_config(run_dir: Path, overrides: dict[str, Any], sets: list[str]) -> JobConfig:
    """The stored job of ``run_dir``, with only the changes a resume allows."""
    stored_path = run_dir / "config.toml"
    if not stored_path.is_file():
        raise ConfigError(
            f"--resume {run_dir}: there is no config.toml there, so it is not a polytrain run "
            "directory. Point --resume at the directory a previous `polytrain train` wrote."
        )
    stored = load_config(stored_path)
    wanted = load_config(stored_path, overrides, sets)
    changed = sorted(
        k
        for k in type(stored).model_fields
        if getattr(stored, k) != getattr(wanted, k) and k not in RESUMABLE_CHANGES
    )
    if stored.strategy == wanted.strategy:  # a layout the strategy re-shards may change
        view = get_strategy_class(stored.strategy).resume_view
        if view(stored) == view(wanted):
            changed = [k for k in changed if k not in ("options", "procs")]
    if changed:
        diffs = ", ".join(f"{k}: {getattr(stored, k)!r} -> {getattr(wanted, k)!r}" for k in changed)
        raise ConfigError(
            f"--resume {run_dir} belongs to another job: {diffs}. A resumed run must compute the "
            f"same steps; only {', '.join(sorted(RESUMABLE_CHANGES))} may change. Drop those "
            "flags, or start a new run without --resume."
        )
    return wanted.model_copy(update={"out": str(run_dir)})
