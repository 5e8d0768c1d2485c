"""What each strategy honours, declared as data and checked before any process starts.

Every strategy declares a :class:`Supports` (class attribute ``Strategy.supports``, refined per
job by ``Strategy.supports_for`` where an option changes it, e.g. ``ps`` with
``consistency=k-of-n`` cannot checkpoint). :func:`requested` says which of these features a job
asks for; :func:`refusal` compares the two and, when something is asked that the strategy does
not honour, returns a one-line error naming the feature, the value asked, why, and the
strategies that do honour it. ``prepare()`` raises it before the launcher starts anything, so no
option is ever silently ignored.

=============  ================================================  ============================
feature        asked by                                          honoured means
=============  ================================================  ============================
checkpoint     ``--checkpoint-every N`` (N > 0)                  writes a resumable checkpoint
resume         ``--resume RUN`` (and torchrun restarts)          continues from one
eval           ``--eval-every N`` (N > 0)                        evaluates during the run
compression    ``--set compression=CODEC`` (not ``none``)        compresses what it sends
torchrun       ``torchrun`` over several hosts                   ranks may be on other hosts
testbed        ``polytrain testbed``                             runs on the emulated cluster
lr_schedule    ``--lr-schedule linear|cosine``, ``--warmup-steps``  every optimizer follows it
clip           ``--clip-grad-norm X``                            clips by the global norm
grad_accum     ``--grad-accum K`` (K > 1)                        K micro-steps, one update
precision      ``--precision bf16|fp16``                         autocast, fp32 master weights
recompute      ``--activation-checkpointing``                    recomputes blocks in backward
=============  ================================================  ============================

The training features of issue 45 (``lr_schedule``, ...) are off unless a strategy declares them:
a strategy must show it honours them (its oracle test) before it says so. Where a strategy
honours one with a meaning of its own — an asynchronous one clipping each worker's push by its
own norm rather than by the global norm of one synchronous gradient — ``means`` says what it
means there (``polytrain strategies NAME``, the docs' matrix: "per worker").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

FEATURES = ("checkpoint", "resume", "eval", "compression", "torchrun", "testbed", "lr_schedule",
            "clip", "grad_accum", "precision", "recompute")
# The training features (docs/training.md's support matrix).
TRAINING = ("lr_schedule", "clip", "grad_accum", "precision", "recompute")

ASKED_BY = {
    "checkpoint": "--checkpoint-every {value}",
    "resume": "--resume",
    "eval": "--eval-every {value}",
    "compression": "--set compression={value}",
    "torchrun": "torchrun across {value} hosts",
    "testbed": "polytrain testbed",
    "lr_schedule": "--lr-schedule {value}",
    "clip": "--clip-grad-norm {value}",
    "grad_accum": "--grad-accum {value}",
    "precision": "--precision {value}",
    "recompute": "--activation-checkpointing",
}

FIX = {
    "checkpoint": "drop --checkpoint-every",
    "resume": "start a new run without --resume",
    "eval": "drop --eval-every (the run still evaluates at the end)",
    "compression": "drop --set compression",
    "torchrun": "run it on one host",
    "testbed": "run it with polytrain train",
    "lr_schedule": "drop --lr-schedule and --warmup-steps (a constant --lr)",
    "clip": "drop --clip-grad-norm",
    "grad_accum": "drop --grad-accum",
    "precision": "use --precision fp32",
    "recompute": "drop --activation-checkpointing",
}


NO_CODEC = {"compression": "no codec is wired into what it sends"}
NOT_WIRED = {"lr_schedule": "its updates do not go through the job's optimizer",
             "clip": "no global-norm clipping is wired into its update",
             "grad_accum": "its steps are not cut into micro-steps",
             "precision": "its forward does not run under autocast with a loss scaler",
             "recompute": "its forward is not wrapped for recomputation"}


def refusing(reasons: dict[str, str]) -> dict[str, str]:
    """The default reasons, with a strategy's own (``reasons``) in place of some."""
    return NO_CODEC | NOT_WIRED | reasons


@dataclass(frozen=True)
class Supports:
    """The features one strategy honours; ``why`` gives the reason for each one it does not."""

    checkpoint: bool = True
    resume: bool = True
    eval: bool = True
    compression: bool = False
    torchrun: bool = True
    testbed: bool = True
    lr_schedule: bool = False
    clip: bool = False
    grad_accum: bool = False
    precision: bool = False
    recompute: bool = False
    why: dict[str, str] = field(default_factory=lambda: NO_CODEC | NOT_WIRED, compare=False)
    means: dict[str, str] = field(default_factory=dict, compare=False)  # a meaning of its own

    def honours(self, feature: str) -> bool:
        if feature not in FEATURES:
            raise ValueError(f"unknown feature '{feature}'; valid: {', '.join(FEATURES)}")
        return bool(getattr(self, feature))

    def without(self, reason: str, *features: str) -> Supports:
        """A copy that does not honour ``features``, each for ``reason``."""
        for f in features:
            self.honours(f)  # refuse unknown names
        off: dict[str, Any] = dict.fromkeys(features, False)
        return replace(self, **off, why={**self.why, **dict.fromkeys(features, reason)},
                       means={f: m for f, m in self.means.items() if f not in features})

    def as_row(self) -> dict[str, bool]:
        return {f: self.honours(f) for f in FEATURES}

    def explain(self, feature: str) -> str:
        """One line: what ``feature`` means on this strategy, or why it refuses it."""
        if not self.honours(feature):
            return "refused: " + self.why.get(feature, "it does not implement it")
        return self.means.get(feature, "yes")


@dataclass(frozen=True)
class Request:
    """What one launch asks of its strategy: feature -> the value that asked for it."""

    asked: dict[str, Any]

    def __iter__(self) -> Any:
        return iter(self.asked.items())


def requested(options: dict[str, Any], *, checkpoint_every: int = 0, eval_every: int = 0,
              resume: bool = False, hosts: int = 1, testbed: bool = False,
              training: dict[str, Any] | None = None) -> Request:
    """The features a job asks for (only those it asks for). ``training``: the training
    features asked (:func:`training_asked`)."""
    asked: dict[str, Any] = dict(training or {})
    if checkpoint_every:
        asked["checkpoint"] = checkpoint_every
    if resume:
        asked["resume"] = True
    if eval_every:
        asked["eval"] = eval_every
    codec = options.get("compression")
    if codec not in (None, "none", False):
        asked["compression"] = codec
    if hosts > 1 and not testbed:
        asked["torchrun"] = hosts
    if testbed:
        asked["testbed"] = True
    return Request(asked)


def training_asked(cfg: Any) -> dict[str, Any]:
    """The training features a job config asks for, each with the value that asked."""
    asked: dict[str, Any] = {}
    if cfg.lr_schedule != "constant" or cfg.warmup_steps:
        asked["lr_schedule"] = f"{cfg.lr_schedule} --warmup-steps {cfg.warmup_steps}"
    if cfg.clip_grad_norm is not None:
        asked["clip"] = cfg.clip_grad_norm
    if cfg.grad_accum > 1:
        asked["grad_accum"] = cfg.grad_accum
    if cfg.precision != "fp32":
        asked["precision"] = cfg.precision
    if cfg.activation_checkpointing:
        asked["recompute"] = True
    return asked


def matrix(table: Iterable[tuple[str, Supports]], features: Iterable[str] = TRAINING) -> str:
    """A markdown table: one row per strategy, a column per feature (yes / no)."""
    cols = list(features)
    lines = ["| strategy | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name, s in table:
        cells = ("no" if not s.honours(f) else "per worker" if f in s.means else "yes" for f in cols)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def refusal(name: str, supports: Supports, request: Request,
            table: Iterable[tuple[str, Supports]]) -> str | None:
    """None when ``supports`` honours everything asked, else the one-line error to raise.

    ``table``: (strategy name, its class-level Supports) for every strategy, to name the ones
    that do honour what was asked.
    """
    rows = list(table)
    for feature, value in request:
        if supports.honours(feature):
            continue
        asked = ASKED_BY[feature].format(value=value)
        why = supports.why.get(feature, "it does not implement it")
        others = [n for n, s in rows if n != name and s.honours(feature)]
        return (f"Strategy '{name}' does not support {feature} ({asked}): {why}. "
                f"Fix: {FIX[feature]}, or use a strategy that does: {', '.join(others) or 'none'}.")
    return None
