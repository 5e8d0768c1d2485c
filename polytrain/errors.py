"""Errors users see. Every message names the rule, the value and the fix."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class PolytrainError(Exception):
    """Base of every error polytrain raises on purpose (shown without a traceback)."""


class ConfigError(PolytrainError):
    """A job description breaks a rule; raised before any process starts."""


class RankFailure(PolytrainError):
    """One or more ranks of a running job failed; the message says which, where and why."""


class DivergedError(PolytrainError):
    """Training diverged (a non-finite loss or parameter, or a finite loss or parameter past its
    bound); the job stops. ``step``: where it was seen; ``since``: the first step the divergence
    may have begun at (the detector's window), so checkpoints after ``since - 1`` are not good."""

    def __init__(self, message: str, step: int | None = None, since: int | None = None) -> None:
        super().__init__(message)
        self.step = step
        self.since = since if since is not None else step


class Interrupted(PolytrainError):
    """The run was stopped on request (SIGTERM, Ctrl-C); ``exit_code`` is 128 + the signal."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class CheckpointError(PolytrainError):
    """A checkpoint is missing, corrupt or belongs to another job."""


def did_you_mean(value: str, valid: Iterable[str]) -> str:
    """A short hint listing the valid choices, closest first."""
    import difflib

    options = sorted(valid)
    close = difflib.get_close_matches(value, options, n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    return f"Valid choices: {', '.join(options)}.{hint}"


def unknown(kind: str, value: str, valid: Iterable[str], fix: str = "") -> ConfigError:
    """The error for a name that is not one of the registered ones."""
    msg = f"Unknown {kind} '{value}'. {did_you_mean(value, valid)}"
    if fix:
        msg += f" {fix}"
    return ConfigError(msg)


def validation_parts(err: Any, fields: Iterable[str], noun: str, flags: bool = False) -> list[str]:
    """A pydantic ``ValidationError`` as one phrase per error, naming the {noun} (a job key or a
    strategy option), its value and the rule; an unknown name gets the nearest valid ones.
    ``flags``: name a value by its command-line flag (``--batch-size = 0``)."""
    valid = sorted(fields)
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        msg = str(e["msg"]).removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            hint = did_you_mean(str(e["loc"][-1]), valid) if valid else f"It takes no {noun}s."
            parts.append(f"unknown {noun} '{loc}'. {hint}")
        elif not loc:  # a rule across fields: its message names them and their values
            parts.append(msg)
        elif flags:
            parts.append(f"--{loc.replace('_', '-')} = {e.get('input')!r}: {msg}")
        else:
            parts.append(f"{noun} '{loc}' = {e.get('input')!r}: {msg}")
    return parts
