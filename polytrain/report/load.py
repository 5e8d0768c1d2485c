"""Read run and compare directories (layout: docs/run-directory.md) with clear errors.

Events come from `metrics.jsonl` (all ranks merged). When it is missing — a run that died before
the merge — the per-rank streams `ranks/rank{R}.jsonl` are merged here instead, and a final line
cut short by a killed rank is dropped (every other malformed line is an error).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polytrain.errors import ConfigError
from polytrain.metrics.summary import TrainSummary

Event = dict[str, Any]
Summary = dict[str, Any]

# The keys the report cannot do without are TrainSummary's required ones (strategy, world_size);
# every other figure is shown as `—` when absent.

EVENT_FIELDS: dict[str, tuple[str, ...]] = {
    "step": ("step", "loss", "samples"),
    "eval": ("step",),  # with `accuracy` (classification) and/or `loss` (regression: lasso, strads)
    "span": ("name", "cat", "start", "end"),
}
"""Fields each event kind must carry (besides `event`, `rank`, `t`); other kinds pass through."""

_NUMERIC = frozenset({"rank", "t", "loss", "accuracy", "start", "end", "samples", "step"})
_COMMON = ("event", "rank", "t")
_NEEDED = {kind: (*_COMMON, *fields) for kind, fields in EVENT_FIELDS.items()}
_ABSENT = object()


@dataclass
class Run:
    """One run directory: its summary and its events sorted by (t, rank)."""

    path: Path
    summary: Summary
    events: list[Event] = field(default_factory=list)

    @property
    def strategy(self) -> str:
        return str(self.summary["strategy"])


@dataclass
class Source:
    """What `polytrain report` was pointed at: one run, or the runs of a compare."""

    path: Path
    runs: list[Run]
    is_compare: bool
    target_accuracy: float | None = None


def load_run(path: Path, summary: Summary | None = None) -> Run:
    """Load a train run directory; `summary` overrides summary.json (a compare.json entry)."""
    path = Path(path)
    _require_dir(path)
    if summary is None:
        summary_file = path / "summary.json"
        if not summary_file.is_file():
            raise ConfigError(
                f"Run directory '{path}' has no summary.json: is it a polytrain run directory? "
                "A run writes summary.json when it finishes; point at a finished run "
                "(or at a compare directory, which holds compare.json)."
            )
        summary = _check_summary(_read_json(summary_file), summary_file)
    return Run(path=path, summary=summary, events=read_events(path))


def load_source(path: Path) -> Source:
    """Load a run directory (summary.json) or a compare directory (compare.json + subdirs)."""
    path = Path(path)
    _require_dir(path)
    if (path / "compare.json").is_file():
        return _load_compare(path)
    if (path / "summary.json").is_file():
        return Source(path=path, runs=[load_run(path)], is_compare=False)
    raise ConfigError(
        f"RUN_DIR '{path}' has no summary.json or compare.json: is it a polytrain run directory? "
        "Pass the --out directory of a finished `polytrain train` or `polytrain compare`."
    )


def read_events(path: Path) -> list[Event]:
    """All events of a run, sorted by (t, rank): metrics.jsonl, else the merged ranks/*.jsonl."""
    merged = path / "metrics.jsonl"
    if merged.is_file():
        events = _read_jsonl(merged, tolerate_cut_tail=False)
    else:
        rank_files = sorted((path / "ranks").glob("rank*.jsonl"))
        if not rank_files:
            raise ConfigError(
                f"Run directory '{path}' has no metrics.jsonl and no ranks/rank*.jsonl: there are "
                "no events to plot. Re-run the job; a run writes its events while it trains."
            )
        events = [e for f in rank_files for e in _read_jsonl(f, tolerate_cut_tail=True)]
    events.sort(key=lambda e: (e["t"], e["rank"]))
    return events


def time_to_accuracy(events: Sequence[Event], target: float) -> float | None:
    """Seconds until the first `eval` event with accuracy >= target; None if never reached."""
    if not isinstance(target, int | float) or not 0 < target <= 1:
        raise ConfigError(
            f"Target accuracy must be a fraction in (0, 1]; got {target!r}. Write 0.95 for 95 %."
        )
    reached = [
        float(e["t"]) for e in events if e.get("event") == "eval" and float(e.get("accuracy", -1.0)) >= target
    ]
    return min(reached) if reached else None


def _load_compare(path: Path) -> Source:
    compare_file = path / "compare.json"
    data = _read_json(compare_file)
    summaries = data.get("strategies") if isinstance(data, dict) else None
    if not isinstance(summaries, list) or not summaries:
        raise ConfigError(
            f"{compare_file} must be an object with a non-empty 'strategies' list of summaries; "
            f"got {_preview(data)}. Re-run `polytrain compare` to rewrite it."
        )
    runs = []
    for i, raw in enumerate(summaries):
        summary = _check_summary(raw, compare_file, where=f"strategies[{i}]")
        sub = path / str(summary["strategy"])
        if not sub.is_dir():
            raise ConfigError(
                f"Compare directory '{path}' lists strategy '{summary['strategy']}' but has no "
                f"subdirectory '{sub.name}/' with its events. Each strategy of a compare writes "
                "COMPARE/<strategy>/; re-run the compare or restore that directory."
            )
        runs.append(load_run(sub, summary=summary))
    target = data.get("target_accuracy")
    target = float(target) if isinstance(target, int | float) else None
    return Source(path=path, runs=runs, is_compare=True, target_accuracy=target)


def _require_dir(path: Path) -> None:
    if not path.exists():
        raise ConfigError(
            f"Run directory '{path}' does not exist. Pass the --out directory of a finished "
            "`polytrain train` or `polytrain compare`."
        )
    if not path.is_dir():
        raise ConfigError(
            f"'{path}' is a file, not a run directory. Pass the directory that holds "
            "summary.json (a train run) or compare.json (a compare)."
        )


def _read_json(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"{file} is not valid JSON ({exc}). The run may have been killed while writing it; "
            "re-run the job to rewrite it."
        ) from exc


def _check_summary(raw: Any, file: Path, where: str = "") -> Summary:
    label = f"{file}{' ' + where if where else ''}"
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{label} must be a JSON object (a run summary); got {_preview(raw)}. "
            "Re-run the job to rewrite it."
        )
    TrainSummary.of(raw, label)  # the keys and types of a train summary (refused with one line)
    return raw


def _read_jsonl(file: Path, tolerate_cut_tail: bool) -> list[Event]:
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"Cannot read events file {file}: {exc}.") from exc
    lines = text.split("\n")
    if tolerate_cut_tail and not text.endswith("\n"):
        lines[-1] = _drop_if_cut(lines[-1])  # the last line was never finished
    numbered = [(n, line) for n, line in enumerate(lines, start=1) if line.strip()]
    try:  # fast path: one parse for the whole file (10^5 events in a fraction of a second)
        parsed = json.loads("[" + ",".join(line for _, line in numbered) + "]")
    except json.JSONDecodeError:
        parsed = []
    if len(parsed) != len(numbered):  # a broken line (or `1, 2` on one line): find it
        parsed = [_parse_line(file, n, line) for n, line in numbered]
    return [_check_event(e, file, n) for (n, _), e in zip(numbered, parsed, strict=True)]


def _drop_if_cut(line: str) -> str:
    try:
        json.loads(line or "{}")
    except json.JSONDecodeError:
        return ""
    return line


def _parse_line(file: Path, number: int, line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{file}:{number} is not a JSON event ({exc}): {line[:80]!r}. Every line of an "
            "events file is one JSON object; delete the broken line or re-run the job."
        ) from exc


def _check_event(event: Any, file: Path, number: int) -> Event:
    if not isinstance(event, dict):
        raise ConfigError(f"{file}:{number} must be a JSON object (one event); got {_preview(event)}.")
    kind = event.get("event")
    needed = _NEEDED.get(kind, _COMMON) if isinstance(kind, str) else _COMMON
    for key in needed:
        value = event.get(key, _ABSENT)
        if value is _ABSENT:
            missing = [k for k in needed if k not in event]
            raise ConfigError(
                f"{file}:{number}: a '{kind}' event needs field(s) {', '.join(missing)} "
                f"(see docs/run-directory.md); got {_preview(event)}."
            )
        wrong_type = type(value) is not int if key == "rank" else type(value) not in (int, float)
        if key in _NUMERIC and wrong_type:
            kind_of = "an integer" if key == "rank" else "a number"
            raise ConfigError(f"{file}:{number}: '{key}' must be {kind_of}; got {value!r}.")
    if kind == "span" and not (math.isfinite(event["start"]) and event["end"] >= event["start"]):
        raise ConfigError(
            f"{file}:{number}: span '{event['name']}' ends before it starts "
            f"(start={event['start']}, end={event['end']}); spans need start <= end on one clock."
        )
    return event


def _preview(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
