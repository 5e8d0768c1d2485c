"""report.md: a self-contained markdown page (tables plus the PNGs by relative path)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from polytrain.report.load import Run, Source
from polytrain.report.table import flatten_metrics, per_rank_cells, summary_cells, testbed_line

PERFETTO = "https://ui.perfetto.dev"


def md_table(
    headers: Sequence[str], rows: Sequence[Sequence[str]], numeric: Sequence[bool] | None = None
) -> str:
    """A GitHub markdown table; `|` inside cells is escaped."""
    numeric = numeric or [False] * len(headers)
    align = ["---:" if n else "---" for n in numeric]
    lines = [_md_row(headers), _md_row(align)] + [_md_row(r) for r in rows]
    return "\n".join(lines)


def _md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |"


def _image(path: Path, base: Path, alt: str) -> str:
    return f"![{alt}]({path.relative_to(base).as_posix()})"


def render_report(source: Source, images: dict[str, Path], traces: dict[str, Path]) -> str:
    """The whole page. `images` maps a kind (`loss_time`, `timeline:<strategy>`, ...) to a PNG."""
    summaries = [r.summary for r in source.runs]
    parts = [_heading(source), *_header_lines(source)]
    columns, rows = summary_cells(summaries, source.target_accuracy)
    parts += ["## Summary", md_table([c.header for c in columns], rows, [c.numeric for c in columns])]
    parts += _curves(source, images)
    parts += _timelines(source, images, traces)
    parts += _per_rank(source.runs)
    parts += _strategy_metrics(source.runs)
    return "\n\n".join(parts) + "\n"


def _heading(source: Source) -> str:
    if source.is_compare:
        names = ", ".join(r.strategy for r in source.runs)
        return f"# polytrain compare: {names}"
    return f"# polytrain run: {source.runs[0].strategy}"


def _header_lines(source: Source) -> list[str]:
    first = source.runs[0].summary
    lines = [f"Run directory: `{source.path}`"]
    versions = [
        f"{k.split('_')[0]} {first[k]}" for k in ("polytrain_version", "torch_version") if first.get(k)
    ]
    if versions:
        lines[0] += " · " + " · ".join(versions)
    testbed = testbed_line(first)
    if testbed:
        lines.append(testbed)
    if source.target_accuracy is not None:
        lines.append(
            f"Target accuracy: {source.target_accuracy * 100:g} % "
            "(time to accuracy = first evaluation at or above it)."
        )
    return ["  \n".join(lines)]


def _curves(source: Source, images: dict[str, Path]) -> list[str]:
    parts = ["## Training curves"]
    captions = {
        "loss_time": "Training loss vs wall-clock time",
        "loss_samples": "Training loss vs samples",
        "accuracy_time": "Evaluation accuracy vs time",
    }
    parts += [_image(images[k], source.path, v) for k, v in captions.items() if k in images]
    parts.append("## Throughput, traffic and memory")
    captions = {
        "throughput": "Throughput (samples/s)",
        "bytes_per_sample": "Bytes sent per sample",
        "memory": "Peak memory per rank",
    }
    parts += [_image(images[k], source.path, v) for k, v in captions.items() if k in images]
    return parts


def _timelines(source: Source, images: dict[str, Path], traces: dict[str, Path]) -> list[str]:
    parts = [
        "## Timelines",
        "One row per rank: the compute lane above the comm lane, one box per span, "
        "gaps are idle time. Where spans nest, the innermost is drawn. "
        f"Open the `.json` traces at {PERFETTO} for every span, zoomable.",
    ]
    for run in source.runs:
        key = f"timeline:{run.strategy}"
        if key in images:
            if source.is_compare:
                parts.append(f"### {run.strategy}")
            parts.append(_image(images[key], source.path, f"Timeline of {run.strategy}"))
        if key in traces:
            rel = traces[key].relative_to(source.path).as_posix()
            parts.append(f"Chrome trace: [`{rel}`]({rel})")
    return parts


def _per_rank(runs: Sequence[Run]) -> list[str]:
    parts = ["## Per rank"]
    for run in runs:
        headers, rows = per_rank_cells(run.summary)
        if len(runs) > 1:
            parts.append(f"### {run.strategy}")
        parts.append(
            md_table(headers, rows, [True, False, True, True, True, True])
            if rows
            else "_no per-rank figures in the summary_"
        )
    return parts


def _strategy_metrics(runs: Sequence[Run]) -> list[str]:
    parts = ["## Strategy metrics"]
    for run in runs:
        pairs = flatten_metrics(run.summary.get("strategy_metrics") or {})
        parts.append(f"### {run.strategy}")
        parts.append(md_table(["Metric", "Value"], [list(p) for p in pairs]) if pairs else "_none reported_")
    return parts
