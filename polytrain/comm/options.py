"""Options every strategy that all-reduces shares: which collective carries the data.

``--set collective=ring|builtin``: ``builtin`` (default) is the backend's own all-reduce (gloo or
NCCL); ``ring`` is polytrain's explicit ring (:mod:`polytrain.comm.ring`), whose 2(W−1) phases
appear on the timeline.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from polytrain.errors import ConfigError

COLLECTIVES = ("builtin", "ring")


class CollectiveOptions(BaseModel):
    collective: Literal["builtin", "ring"] = Field(
        "builtin", description="all-reduce: builtin (the backend's) or ring (polytrain's, on p2p)")


def check_collective(strategy: str, collective: str, world: int) -> None:
    """A ring needs a neighbour: refuse ``collective=ring`` on one rank before launch."""
    if collective == "ring" and world < 2:
        raise ConfigError(
            f"Strategy '{strategy}' with collective=ring needs world size >= 2 (a ring of at least "
            f"two ranks), but --procs is {world}. Use --procs 2 or more, or collective=builtin "
            f"(valid: {', '.join(COLLECTIVES)}).")


# which codecs read each codec option (the others refuse it: nothing is silently ignored)
_ANY = ("fp16", "bf16", "topk", "randomk", "threshold", "onebit", "terngrad", "qsgd", "dgc")
OPTION_CODECS: dict[str, tuple[str, ...]] = {
    "ratio": ("topk", "randomk", "dgc"), "select": ("topk", "dgc"), "tau": ("threshold",),
    "levels": ("qsgd",), "scale": ("onebit",), "error_feedback": _ANY, "entropy": _ANY,
    "dgc_momentum": ("dgc",), "dgc_clip": ("dgc",), "dgc_warmup": ("dgc",), "dgc_masking": ("dgc",),
    "powersgd_rank": ("powersgd",), "onebit_warmup": ("onebit-adam",),
}
OPTION_CODECS["entropy"] = (*_ANY, "onebit-adam")  # 1-bit Adam's payloads are packed the same way

# Optimizers that keep a momentum of their own (one home for the rule; ``adamw`` belongs here
# when it exists). A codec that carries momentum itself (dgc with dgc_momentum > 0) under one of
# these applies momentum twice and diverges (issue 51: loss 3.7e25 by step 47).
MOMENTUM_OPTIMIZERS = frozenset({"momentum", "adam", "adamw"})
# Optimizers whose state 1-bit Adam freezes and compresses (it replaces their step).
ADAM_OPTIMIZERS = frozenset({"adam"})
# Strategies that run 1-bit Adam: allreduce (its DDP hook) and mesh (its data-parallel axis).
ONEBIT_STRATEGIES = ("allreduce", "mesh")


class CodecOptions(BaseModel):
    """``--set compression=NAME`` and the codecs' own options (see :mod:`polytrain.comm.codecs`)."""

    compression: str = Field(
        "none", description="gradient codec: none, fp16, topk, topk+onebit, ..., onebit-adam")
    ratio: float = Field(0.01, description="topk/randomk/dgc: fraction of entries sent, in (0, 1]")
    select: Literal["bucket", "tensor"] = Field(
        "bucket", description="topk/dgc: the largest entries of a whole DDP bucket, or of each tensor")
    tau: float = Field(1e-3, description="threshold: entries with |g| >= tau are sent as ±tau")
    levels: int = Field(16, description="qsgd: quantisation levels s, 1..255")
    scale: Literal["tensor", "row"] = Field("tensor", description="onebit: one scale pair per tensor or row")
    error_feedback: bool | None = Field(None, description="residual memory (default: on for biased codecs)")
    entropy: Literal["none", "zstd"] = Field("none", description="zstd over payloads")
    dgc_momentum: float = Field(0.9, ge=0.0, lt=1.0, description="dgc: momentum of the corrected velocity")
    dgc_clip: float | None = Field(None, gt=0.0, description="dgc: local clip norm C (scaled by W^-1/2)")
    dgc_warmup: int = Field(0, ge=0, description="dgc: encodings over which sparsity warms up")
    dgc_masking: bool = Field(True, description="dgc: momentum factor masking (sent entries leave u)")
    powersgd_rank: int = Field(1, ge=1, description="powersgd: rank of the low-rank factors")
    onebit_warmup: int = Field(
        100, ge=1, description="onebit-adam: full-precision Adam steps before the variance freezes")

    @field_validator("compression")
    @classmethod
    def _codec(cls, v: str) -> str:
        from polytrain.comm.codecs import check_name

        return check_name(v)

    @field_validator("ratio")
    @classmethod
    def _ratio(cls, v: float) -> float:
        if not 0.0 < v <= 1.0:
            raise ValueError("ratio must be in (0, 1] (the fraction of entries sent), e.g. ratio=0.01")
        return v

    @field_validator("tau")
    @classmethod
    def _tau(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("tau must be > 0 (entries with |g| >= tau are sent), e.g. tau=0.001")
        return v

    @field_validator("levels")
    @classmethod
    def _levels(cls, v: int) -> int:
        if not 1 <= v <= 255:
            raise ValueError("levels must be in 1..255 (qsgd quantisation levels), e.g. levels=16")
        return v

    @model_validator(mode="after")
    def _select(self) -> CodecOptions:
        if self.select == "tensor" and self.compression.split("+")[0] not in OPTION_CODECS["select"]:
            raise ValueError(f"select=tensor (each tensor's largest entries) applies to topk and dgc "
                             f"(alone or as topk+X, dgc+X), not compression={self.compression}; "
                             "drop select or use select=bucket")
        return self

    @property
    def compressing(self) -> bool:
        return self.compression != "none"


def check_optimizer(strategy: str, opts: CodecOptions, optimizer: str) -> None:
    """Codec × optimizer: refuse a pair that would apply momentum twice, or 1-bit Adam without
    Adam (or outside :data:`ONEBIT_STRATEGIES`, whose exchange and optimizer it replaces), before
    launch."""
    parts = set(opts.compression.split("+"))
    if "dgc" in parts and opts.dgc_momentum > 0 and optimizer in MOMENTUM_OPTIMIZERS:
        raise ConfigError(
            f"Strategy '{strategy}': compression={opts.compression} keeps its own momentum "
            f"(dgc_momentum={opts.dgc_momentum:g}) and --optimizer {optimizer} adds a second one, "
            "which diverges; use --optimizer sgd (DGC's momentum then does the work) or "
            "--set dgc_momentum=0.")
    if opts.compression == "onebit-adam" and optimizer not in ADAM_OPTIMIZERS:
        raise ConfigError(
            f"Strategy '{strategy}': compression=onebit-adam compresses Adam's momentum and freezes "
            f"its variance, so it needs --optimizer {'|'.join(sorted(ADAM_OPTIMIZERS))} (got "
            f"--optimizer {optimizer}); use --optimizer adam, or a gradient codec (e.g. topk).")
    if opts.compression == "onebit-adam" and strategy not in ONEBIT_STRATEGIES:
        raise ConfigError(
            f"Strategy '{strategy}' cannot take compression=onebit-adam: it replaces the "
            "optimizer's step and the data-parallel gradient exchange, which only "
            f"{' and '.join(repr(s) for s in ONEBIT_STRATEGIES)} run. Use --strategy allreduce, or a "
            "gradient codec (e.g. onebit, topk).")


def check_onebit_nonfinite(strategy: str, compression: str, on_nonfinite: str) -> None:
    """1-bit Adam cannot skip a step one rank alone finds non-finite (the exchange would hang)."""
    if compression == "onebit-adam" and on_nonfinite == "skip":
        raise ConfigError(
            f"Strategy '{strategy}': compression=onebit-adam with --on-nonfinite skip: once warm each "
            "rank sees only its local gradient, so ranks could disagree on skipping and the exchange "
            "would hang; use --on-nonfinite stop (the default) or another codec.")


def check_codec(strategy: str, opts: CodecOptions, world: int, *, hooks: bool, optimizer: str) -> None:
    """Refuse what a codec-taking strategy cannot do with these options, before launch.

    ``hooks``: the strategy trains through DDP, so PyTorch's ``powersgd`` hook (and 1-bit Adam)
    apply. ``optimizer``: the job's ``--optimizer`` (:func:`check_optimizer`)."""
    collective = getattr(opts, "collective", "builtin")
    check_collective(strategy, collective, world)
    parts = set(opts.compression.split("+"))
    for option in sorted(opts.model_fields_set):
        users = OPTION_CODECS.get(option)
        if users is not None and not parts & set(users):
            raise ConfigError(
                f"Strategy '{strategy}': {option}= is read only by compression={'|'.join(users)}, "
                f"not by compression={opts.compression}; drop {option} or choose one of those codecs.")
    if opts.compression == "powersgd" and not hooks:
        raise ConfigError(
            f"Strategy '{strategy}' cannot take compression=powersgd: it is PyTorch's DDP gradient "
            "hook, which only 'allreduce' runs. Use another codec (e.g. topk, onebit) or "
            "--strategy allreduce.")
    if opts.compression == "powersgd" and collective == "ring":
        raise ConfigError(
            "compression=powersgd runs PyTorch's powerSGD_hook, which all-reduces with the "
            "backend's collective: drop collective=ring (valid with powersgd: builtin).")
    if opts.compression == "onebit-adam" and collective == "ring":
        raise ConfigError(
            "compression=onebit-adam exchanges its 1-bit chunks point to point (all-to-all, then "
            "all-gather) and all-reduces the warm-up with the backend's collective: drop "
            "collective=ring (valid with onebit-adam: builtin).")
    check_optimizer(strategy, opts, optimizer)
