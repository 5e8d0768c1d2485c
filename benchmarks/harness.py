"""Benchmark harness: every benchmark writes results/<name>.json and results/<name>.md.

The JSON holds the rows, the git commit, every command line that produced them (an ``--append``
run keeps the earlier ones), the machine, the versions and the load average at start and end, so
every figure in the README or an issue note can be traced to the run that measured it.

Timing rules (the development machine is a shared 2-core VM): compare variants inside one run with
their repeats interleaved (:func:`alternating`), report the median of >= 5 repeats with min–max
(:func:`spread`, :func:`fmt_spread`), and keep the per-repeat values in the rows.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

RESULTS = Path(__file__).resolve().parent / "results"
# The TSPLIB instances ship inside the package (polytrain/aco/data); --data-dir points elsewhere.
DATA_DIR = Path(__file__).resolve().parent.parent / "polytrain" / "aco" / "data"
# One lock serialises benchmarks that share a machine, so two never time each other's load.
DEFAULT_LOCK = Path(tempfile.gettempdir()) / "polytrain-bench.lock"
LOAD_AT_IMPORT = os.getloadavg()  # the load when the benchmark started (scripts import this first)
T = TypeVar("T")


def git_commit() -> str:
    """The checked-out commit, with ``+dirty`` when tracked files differ from it."""
    root = RESULTS.parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def alternating(variants: Sequence[T], repeats: int) -> Iterator[tuple[int, T]]:
    """(repeat, variant) for every repeat, the variants' order reversed every other repeat, so
    load that drifts during the run falls on every variant alike."""
    for r in range(repeats):
        for v in (variants if r % 2 == 0 else list(reversed(variants))):
            yield r, v


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min and max of per-repeat values."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def fmt_spread(values: Sequence[float], digits: int = 3) -> str:
    """``median (min–max)`` as the README quotes it."""
    s = spread(values)
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def machine() -> dict[str, Any]:
    import torch

    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": sys.version.split()[0],
            "torch": torch.__version__}


def markdown_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:,.3f}" if abs(v) < 100 else f"{v:,.0f}"
        return str(v)

    head = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
    return head + "".join("| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |\n" for r in rows)


def command_line() -> str:
    """How this script was called, as a results file records it."""
    return "python " + " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])


def earlier_rows(name: str) -> list[dict[str, Any]]:
    """The per-run rows already in results/<name>.json (summary rows, seed "all", dropped):
    what a script's ``--append`` adds its new runs to."""
    path = RESULTS / f"{name}.json"
    if not path.exists():
        return []
    return [r for r in json.loads(path.read_text())["rows"] if r.get("seed") != "all"]


def earlier_commands(name: str) -> list[str]:
    """Every command line recorded in results/<name>.json (an older file has one ``command``)."""
    path = RESULTS / f"{name}.json"
    if not path.exists():
        return []
    old = json.loads(path.read_text())
    return list(old.get("commands") or [old["command"]])


def write_results(name: str, rows: list[dict[str, Any]], columns: list[str], notes: str = "",
                  appended: bool = False, extra: dict[str, Any] | None = None) -> Path:
    """Write results/<name>.json and .md. ``appended``: the rows include an earlier run's, whose
    command lines are kept beside this one's. ``extra``: more top-level JSON (e.g. raw repeats)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    command = command_line()
    commands = [*earlier_commands(name), command] if appended else [command]
    record = {"name": name, "command": command, "commands": commands, "commit": git_commit(),
              "when": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine(),
              "loadavg": {"start": list(LOAD_AT_IMPORT), "end": list(os.getloadavg())},
              **(extra or {}), "rows": rows}
    (RESULTS / f"{name}.json").write_text(json.dumps(record, indent=1))
    shown = " ; ".join(f"`{c}`" for c in commands)
    md = f"# {name}\n\nMeasured with {shown} at commit `{record['commit'][:12]}` on {record['when']} " \
         f"({record['machine']['cpus']} CPUs shared with other jobs, load average " \
         f"{LOAD_AT_IMPORT[0]:.1f} at start, {record['loadavg']['end'][0]:.1f} at end; " \
         f"torch {record['machine']['torch']}).\n\n"
    md += markdown_table(rows, columns) + ("\n" + notes + "\n" if notes else "")
    out = RESULTS / f"{name}.md"
    out.write_text(md)
    print(md)
    return out


def add_common_flags(ap: argparse.ArgumentParser, data: bool = False) -> None:
    """``--lock PATH`` (the benchmark lock; ``none`` runs without one) and, with ``data``,
    ``--data-dir PATH`` (where the TSPLIB instances are read)."""
    ap.add_argument("--lock", default=str(DEFAULT_LOCK),
                    help=f"file locked for the whole run, so benchmarks do not overlap "
                         f"(default {DEFAULT_LOCK}; 'none': no lock)")
    if data:
        ap.add_argument("--data-dir", type=Path, default=DATA_DIR,
                        help="folder of the TSPLIB .tsp files (default: the package's own)")


_HELD: list[Any] = []  # the open lock file: closing it (at exit) releases the lock


def hold_lock(path: str) -> None:
    """Wait for and hold the benchmark lock until this process ends (``none``: do nothing)."""
    if path == "none":
        return
    f = open(path, "a")  # noqa: SIM115 - held open on purpose until the process exits
    print(f"waiting for the benchmark lock {path} ...", file=sys.stderr, flush=True)
    fcntl.flock(f, fcntl.LOCK_EX)
    _HELD.append(f)
