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
=============  ================================================  ============================
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

FEATURES = ("checkpoint", "resume", "eval", "compression", "torchrun", "testbed")

ASKED_BY = {
    "checkpoint": "--checkpoint-every {value}",
    "resume": "--resume",
    "eval": "--eval-every {value}",
    "compression": "--set compression={value}",
    "torchrun": "torchrun across {value} hosts",
    "testbed": "polytrain testbed",
}

FIX = {
    "checkpoint": "drop --checkpoint-every",
    "resume": "start a new run without --resume",
    "eval": "drop --eval-every (the run still evaluates at the end)",
    "compression": "drop --set compression",
    "torchrun": "run it on one host",
    "testbed": "run it with polytrain train",
}


NO_CODEC = {"compression": "no codec is wired into what it sends"}


@dataclass(frozen=True)
class Supports:
    """The features one strategy honours; ``why`` gives the reason for each one it does not."""

    checkpoint: bool = True
    resume: bool = True
    eval: bool = True
    compression: bool = False
    torchrun: bool = True
    testbed: bool = True
    why: dict[str, str] = field(default_factory=lambda: dict(NO_CODEC), compare=False)

    def honours(self, feature: str) -> bool:
        if feature not in FEATURES:
            raise ValueError(f"unknown feature '{feature}'; valid: {', '.join(FEATURES)}")
        return bool(getattr(self, feature))

    def without(self, reason: str, *features: str) -> Supports:
        """A copy that does not honour ``features``, each for ``reason``."""
        for f in features:
            self.honours(f)  # refuse unknown names
        return replace(self, **dict.fromkeys(features, False),
                       why={**self.why, **dict.fromkeys(features, reason)})

    def as_row(self) -> dict[str, bool]:
        return {f: self.honours(f) for f in FEATURES}


@dataclass(frozen=True)
class Request:
    """What one launch asks of its strategy: feature -> the value that asked for it."""

    asked: dict[str, Any]

    def __iter__(self) -> Any:
        return iter(self.asked.items())


def requested(options: dict[str, Any], *, checkpoint_every: int = 0, eval_every: int = 0,
              resume: bool = False, hosts: int = 1, testbed: bool = False) -> Request:
    """The features a job asks for (only those it asks for)."""
    asked: dict[str, Any] = {}
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
