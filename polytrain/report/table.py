"""The summary table as plain strings, shared by report.md and the rich console table."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from polytrain.report.units import (
    MISSING,
    human_bytes,
    human_number,
    human_rate,
    human_seconds,
    is_number,
    percent,
)

Summary = Mapping[str, Any]
SHORT_LIST = 8
"""Lists longer than this are summarised (count, min, mean, max) instead of printed."""


@dataclass(frozen=True)
class Column:
    header: str
    cell: Callable[[Summary], str]
    numeric: bool = True  # right-aligned


def _accuracy(s: Summary) -> str:
    ev = s.get("eval")
    return percent(ev.get("accuracy")) if isinstance(ev, Mapping) else MISSING


def _bytes_per_sample(s: Summary) -> str:
    value = s.get("bytes_sent_per_sample")
    return MISSING if not is_number(value) else human_bytes(value) + "/sample"


def _number(key: str) -> Callable[[Summary], str]:
    return lambda s: human_number(s.get(key))


def _loss(s: Summary) -> str:
    value = s.get("final_loss")
    return f"{value:.4f}" if is_number(value) else MISSING


SUMMARY_COLUMNS: tuple[Column, ...] = (
    Column("Strategy", lambda s: str(s.get("strategy", MISSING)), numeric=False),
    Column("World", _number("world_size")),
    Column("Steps", _number("steps")),
    Column("Throughput", lambda s: human_rate(s.get("throughput_samples_per_s"))),
    Column("Final loss", _loss),
    Column("Accuracy", _accuracy),
    Column("Bytes/sample", _bytes_per_sample),
    Column("Peak memory", lambda s: human_bytes(s.get("peak_rss_bytes"))),
    Column("Wall time", lambda s: human_seconds(s.get("wall_s"))),
)


def _codec(s: Summary) -> str:
    """`topk(ratio=0.01) 101x, 1.2 KB/step, 3.1 ms/step`: a compressed run's codec figures."""
    metrics = s.get("strategy_metrics")
    c = metrics.get("codec") if isinstance(metrics, Mapping) else None
    if not isinstance(c, Mapping):
        return MISSING
    parts = [str(c.get("codec", "?"))]
    if is_number(c.get("ratio_vs_fp32")):
        parts.append(f"{c['ratio_vs_fp32']:.3g}x")
    if is_number(c.get("wire_bytes_per_step")):
        parts.append(human_bytes(c["wire_bytes_per_step"]) + "/step")
    if is_number(c.get("codec_s_per_step")):
        parts.append(human_seconds(c["codec_s_per_step"]) + "/step")
    return ", ".join(parts)


def _has_codec(s: Summary) -> bool:
    metrics = s.get("strategy_metrics")
    return isinstance(metrics, Mapping) and "codec" in metrics


def summary_columns(summaries: Sequence[Summary], target_accuracy: float | None = None) -> list[Column]:
    """The columns to show; time-to-accuracy and the codec only when some summary has them."""
    columns = list(SUMMARY_COLUMNS)
    if any(_has_codec(s) for s in summaries):
        columns.append(Column("Codec (ratio, wire, time)", _codec, numeric=False))
    if any("time_to_accuracy_s" in s for s in summaries):
        header = "Time to acc."
        if target_accuracy is not None:
            header = f"Time to {target_accuracy * 100:g} %"
        columns.append(Column(header, _time_to_accuracy))
    return columns


def _time_to_accuracy(s: Summary) -> str:
    value = s.get("time_to_accuracy_s")
    if "time_to_accuracy_s" in s and value is None:
        return "not reached"
    return human_seconds(value)


def summary_cells(
    summaries: Sequence[Summary], target_accuracy: float | None = None
) -> tuple[list[Column], list[list[str]]]:
    """Columns and one row of cells per summary."""
    columns = summary_columns(summaries, target_accuracy)
    return columns, [[c.cell(s) for c in columns] for s in summaries]


def testbed_line(summary: Summary) -> str | None:
    """`Testbed: 4 emulated hosts, NIC 1Gbit, latency 1ms` when the run used one."""
    bed = summary.get("testbed")
    if not isinstance(bed, Mapping) or not bed:
        return None
    parts = []
    if "hosts" in bed:
        parts.append(f"{bed['hosts']} emulated hosts")
    if "nic" in bed:
        parts.append(f"NIC {bed['nic']}")
    if bed.get("latency") is not None:
        parts.append(f"latency {bed['latency']}")
    parts += [f"{k} {v}" for k, v in bed.items() if k not in ("hosts", "nic", "latency")]
    return "Testbed: " + ", ".join(parts)


def per_rank_cells(summary: Summary) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the per-rank table (rank, role, steps, bytes sent, memory, busy)."""
    headers = ["Rank", "Role", "Steps", "Bytes sent", "Peak memory", "Busy"]
    rows = []
    for r in summary.get("per_rank") or []:
        if not isinstance(r, Mapping):
            continue
        rows.append(
            [
                human_number(r.get("rank")),
                str(r.get("role", MISSING)),
                human_number(r.get("steps")),
                human_bytes(r.get("bytes_sent")),
                human_bytes(r.get("peak_rss_bytes")),
                human_seconds(r.get("busy_s")),
            ]
        )
    return headers, rows


def flatten_metrics(metrics: Any, prefix: str = "") -> list[tuple[str, str]]:
    """Nested strategy metrics as (dotted.key, text) pairs; long lists are summarised."""
    if isinstance(metrics, Mapping):
        if not metrics and prefix:
            return [(prefix, "{}")]
        pairs: list[tuple[str, str]] = []
        for key, value in metrics.items():
            pairs += flatten_metrics(value, f"{prefix}.{key}" if prefix else str(key))
        return pairs
    if isinstance(metrics, list | tuple):
        return [(prefix or "value", summarise_list(metrics))]
    return [(prefix or "value", human_number(metrics))]


def summarise_list(values: Sequence[Any]) -> str:
    """`[1, 2, 3]` for short lists of scalars; `40 values: min 0, mean 1.2, max 5` otherwise."""
    scalars = all(not isinstance(v, Mapping | list | tuple) for v in values)
    if scalars and len(values) <= SHORT_LIST:
        return "[" + ", ".join(human_number(v) for v in values) + "]"
    numbers = [float(v) for v in values if is_number(v)]
    if numbers and len(numbers) == len(values):
        mean = sum(numbers) / len(numbers)
        return (
            f"{len(numbers)} values: min {human_number(min(numbers))}, "
            f"mean {human_number(mean)}, max {human_number(max(numbers))}"
        )
    return f"{len(values)} items"
