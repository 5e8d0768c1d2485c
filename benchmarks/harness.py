"""Benchmark harness: every benchmark writes results/<name>.json and results/<name>.md.

The JSON holds the rows, the command that produced them, the machine and the versions, so every
figure in the README or an issue note can be traced to the run that measured it.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


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


def write_results(name: str, rows: list[dict[str, Any]], columns: list[str], notes: str = "") -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    command = command_line()
    record = {"name": name, "command": command, "when": time.strftime("%Y-%m-%d %H:%M:%S"),
              "machine": machine(), "rows": rows}
    (RESULTS / f"{name}.json").write_text(json.dumps(record, indent=1))
    md = f"# {name}\n\nMeasured with `{command}` on {record['when']} " \
         f"({record['machine']['cpus']} CPUs, torch {record['machine']['torch']}).\n\n"
    md += markdown_table(rows, columns) + ("\n" + notes + "\n" if notes else "")
    out = RESULTS / f"{name}.md"
    out.write_text(md)
    print(md)
    return out
