"""The job's flags as data: one table (`JOB_FLAGS`) feeds ``train``, ``compare`` and the
planner's model flags; a parsed job's overrides (`overrides`) and the same job written back as
flags (`job_argv`, for the testbed's hosts). Torch-free: ``--help`` builds the parser from it."""

from __future__ import annotations

import argparse
from typing import Any

# JobConfig field -> (flag, type, help). One table feeds `train` and `compare`.
JOB_FLAGS: list[tuple[str, str, Any, str]] = [
    ("strategy", "--strategy", str, "strategy id (see `polytrain strategies`); default allreduce"),
    ("procs", "--procs", int, "world size: all processes, whatever their role; default 2"),
    ("model", "--model", str, "zoo model (see `polytrain models`) or pkg.module:factory; default cnn"),
    ("dataset", "--dataset", str, "built-in dataset (see `polytrain datasets`); default digits"),
    ("steps", "--steps", int, "optimisation steps; default 300"),
    ("epochs", "--epochs", float, "passes over the training data (overrides --steps)"),
    ("batch_size", "--batch-size", int, "GLOBAL batch size, split over data-parallel ranks; default 64"),
    ("lr", "--lr", float, "learning rate; default 1e-3"),
    ("optimizer", "--optimizer", str, "sgd | momentum | adam | adamw; default adam"),
    ("momentum", "--momentum", float, "momentum for --optimizer momentum; default 0.9"),
    ("weight_decay", "--weight-decay", float, "weight decay (decoupled for adamw, else L2); default 0"),
    ("lr_schedule", "--lr-schedule", str, "constant | linear | cosine, per optimizer step; "
     "default constant"),
    ("warmup_steps", "--warmup-steps", int, "linear warm-up over the first N optimizer steps"),
    ("min_lr", "--min-lr", float, "learning rate a linear/cosine schedule ends at; default 0"),
    ("grad_accum", "--grad-accum", int, "K micro-steps of B/K samples per optimizer step "
     "(global batch stays B); default 1"),
    ("precision", "--precision", str, "fp32 | bf16 | fp16: autocast forward and loss, fp32 "
     "weights (fp16 with loss scaling); default fp32"),
    ("device", "--device", str, "auto | cpu | cuda: auto takes a GPU per rank when there are "
     "enough (NCCL), else the CPU (gloo); default auto"),
    ("log", "--log", str, "csv,tensorboard,wandb: write the loss and evaluations while the run "
     "goes (RUN/log.csv, RUN/tensorboard, RUN/wandb offline)"),
    ("log_ranks", "--log-ranks", str, "0 | all: --log writes the run's figures (the mean loss over "
     "ranks, rank 0's evaluations), or also every rank's own loss per step; default 0"),
    ("clip_grad_norm", "--clip-grad-norm", float, "clip the gradient to this global L2 norm "
     "(over the whole model, however it is split); default off"),
    ("loss", "--loss", str, "loss as pkg.module:fn(output, targets) (default: the task's "
     "cross-entropy, or the loss the model returns)"),
    ("seed", "--seed", int, "seed of initialisation and data order; default 0"),
    ("eval_every", "--eval-every", int, "evaluate on the test split every N steps (0: at the end)"),
    ("checkpoint_every", "--checkpoint-every", int, "write a checkpoint every N steps (0: never)"),
    ("keep_checkpoints", "--keep-checkpoints", int, "checkpoints to keep; default 3"),
    ("timeout_s", "--timeout", float, "seconds a rank waits for its peers before failing; default 60"),
    ("on_nonfinite", "--on-nonfinite", str, "stop | skip: a non-finite loss, gradient or parameter "
     "stops the run (default), or a step with a non-finite gradient is skipped (single, allreduce)"),
    ("on_divergence", "--on-divergence", str, "stop | skip | warn: a finite loss past "
     "--divergence-factor x its running minimum stops the run (default), skips the update "
     "(single, allreduce) or is noted"),
    ("divergence_factor", "--divergence-factor", float, "loss bound over its running minimum; "
     "default 1000 (0: off)"),
    ("divergence_window", "--divergence-window", int, "steps a divergence may have been building: "
     "checkpoints that close to it are set aside; default 10"),
    ("max_param", "--max-param", float, "largest |parameter| a checkpoint may hold; default 1e6 (0: off)"),
    ("out", "--out", str, "run directory; default runs/<time>-<strategy>"),
]


def add_job_flags(p: argparse.ArgumentParser, *, with_strategy: bool = True) -> None:
    p.add_argument("--config", help="TOML job file; flags override it")
    for field, flag, typ, help_ in JOB_FLAGS:
        if field == "strategy" and not with_strategy:
            continue
        p.add_argument(flag, dest=field, type=typ, default=None, help=help_)
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="strategy option (model.KEY / data.KEY for model and dataset options)")
    p.add_argument("--activation-checkpointing", action="store_true", default=None,
                   help="recompute each block's (layer's, stage's) forward in backward: less "
                        "activation memory for one more forward")
    p.add_argument("--debug", action="store_true", default=None,
                   help="tracebacks, and PyTorch's collective checks (TORCH_DISTRIBUTED_DEBUG)")
    p.add_argument("--no-report", action="store_true", help="skip the plots and report.md")
    p.add_argument("--tensorboard", action="store_true",
                   help="also write TensorBoard scalars to RUN/tensorboard (needs tensorboard)")


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    fields = [f for f, *_ in JOB_FLAGS] + ["debug", "activation_checkpointing"]
    return {f: getattr(args, f) for f in fields if getattr(args, f, None) is not None}


def job_argv(ns: argparse.Namespace, drop: tuple[str, ...]) -> list[str]:
    """A parsed ``train``/``compare`` job written back as flags (leaving out the fields in ``drop``)."""
    out = ["--config", ns.config] if ns.config else []
    for field, flag, *_ in JOB_FLAGS:
        if getattr(ns, field, None) is not None and field not in drop:
            out += [flag, str(getattr(ns, field))]  # str(float) round-trips exactly
    for item in ns.sets:
        out += ["--set", item]
    for dest, flag in (("activation_checkpointing", "--activation-checkpointing"), ("debug", "--debug"),
                       ("no_report", "--no-report"), ("tensorboard", "--tensorboard"),
                       ("allow_inexact", "--allow-inexact")):
        out += [flag] if getattr(ns, dest, None) else []
    for dest, flag in (("resume", "--resume"), ("bind", "--bind"), ("cluster", "--cluster")):
        out += [flag, getattr(ns, dest)] if getattr(ns, dest, None) is not None else []
    return out


def add_model_flags(p: argparse.ArgumentParser) -> None:
    """The model and data flags of a job (``profile``, ``plan``)."""
    for field, flag, typ, help_ in JOB_FLAGS:
        if field in ("model", "dataset", "batch_size", "optimizer"):
            p.add_argument(flag, dest=field, type=typ, default=None, help=help_)
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="model.KEY / data.KEY: model and dataset options")


def model_overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {f: getattr(args, f) for f in ("model", "dataset", "batch_size", "optimizer")
            if getattr(args, f, None) is not None}
