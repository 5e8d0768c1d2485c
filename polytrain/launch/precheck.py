"""The checks of a job that need neither torch nor the strategy modules, run first.

They answer the commonest mistakes (an unknown strategy id, model or dataset, a straggler rank
outside the job, an ``--on-nonfinite`` the strategy cannot honour) in well under a second: the CLI and the
Python API run them right after the job's fields are validated (:mod:`polytrain.config`) and
before anything imports torch; :func:`polytrain.launch.prepare.prepare` runs them again (cheap)
before the checks that need the strategy classes.
"""

from __future__ import annotations

from polytrain.config import JobConfig
from polytrain.errors import ConfigError, unknown

# strategies whose step is the shared plain step on one synchronised gradient (see
# polytrain/runtime/divergence.py): they alone can skip a non-finite step on every rank alike
SKIPS = ("single", "allreduce")


def check_strategy_id(name: str) -> None:
    """An unknown strategy id is refused with the known ones, read without importing them."""
    from polytrain.strategies.catalog import strategy_ids

    ids = strategy_ids()
    if name not in ids:
        raise unknown("strategy", name, ids, "List them with: polytrain strategies.")


def check_zoo_names(cfg: JobConfig) -> None:
    """An unknown built-in dataset or model is refused as the registries would refuse it (a
    user's ``pkg.module:factory`` is checked when it is imported, after torch)."""
    from polytrain.strategies.catalog import zoo_names

    fix = "Or give your own as 'pkg.module:factory'."
    if ":" not in cfg.dataset and cfg.dataset not in zoo_names("data"):
        raise unknown("dataset", cfg.dataset, zoo_names("data"), fix=fix)
    if ":" not in cfg.model and cfg.model not in zoo_names("models"):
        raise unknown("model", cfg.model, zoo_names("models"), fix=fix)


def _skip_honoured(flag: str, what: str, strategy: str, default: str) -> None:
    """``--FLAG skip`` needs one synchronised gradient, so that every rank skips alike."""
    if strategy not in SKIPS:
        raise ConfigError(
            f"--{flag} skip is honoured by {', '.join(SKIPS)} (one synchronised gradient, so every "
            f"rank skips the same {what}), not by {strategy}. Use --{flag} {default}, or one of "
            "those strategies.")


def check_on_nonfinite(cfg: JobConfig) -> None:
    if cfg.on_nonfinite == "skip":
        _skip_honoured("on-nonfinite", "steps", cfg.strategy, "stop (the default)")


def check_on_divergence(cfg: JobConfig) -> None:
    if cfg.on_divergence == "skip":
        _skip_honoured("on-divergence", "updates", cfg.strategy, "stop (the default) or warn")
    if cfg.on_divergence == "skip" and not cfg.divergence_factor:
        raise ConfigError("--on-divergence skip needs the loss check: --divergence-factor 0 turns "
                          "it off. Pass a factor > 1 (default 1000).")


def precheck(cfg: JobConfig) -> None:
    """Raise ConfigError for what is wrong with ``cfg`` and checkable without torch."""
    check_strategy_id(cfg.strategy)
    check_zoo_names(cfg)
    if cfg.slow_rank is not None and not 0 <= cfg.slow_rank < cfg.procs:
        raise ConfigError(
            f"slow_rank={cfg.slow_rank} is not a rank of this job (ranks 0..{cfg.procs - 1}). "
            f"Use --set slow_rank=R with 0 <= R < --procs."
        )
    check_on_nonfinite(cfg)
    check_on_divergence(cfg)
