"""How long the CLI takes to answer without training: ``--version``, ``--help``, ``strategies``
and refusals of bad input, each timed from process start to exit beside ``python -c pass`` (the
interpreter's own start-up), the cases alternating repeat by repeat. Goal (issue 49): each under
1 s on an idle machine. The refusals are of two kinds: those decided before torch is imported
(the job's fields, the strategy, model and dataset names, the straggler rank, --on-nonfinite)
and, for comparison, those that still need the strategy's options or checks (and so torch).

    python benchmarks/cli_latency.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from harness import alternating, fmt_spread, spread, write_results  # noqa: E402

PY = [sys.executable]
CLI = [*PY, "-m", "polytrain"]
CASES: list[tuple[str, list[str], str]] = [
    ("python -c pass", [*PY, "-c", "pass"], "baseline"),
    ("python -c 'import torch'", [*PY, "-c", "import torch"], "baseline: the import a refusal "
     "that needs torch pays"),
    ("polytrain --version", [*CLI, "--version"], "answer"),
    ("polytrain --help", [*CLI, "--help"], "answer"),
    ("polytrain strategies", [*CLI, "strategies"], "answer"),
    ("train --steps -1", [*CLI, "train", "--steps", "-1"], "refusal, no torch"),
    ("train --strategy allreduc", [*CLI, "train", "--strategy", "allreduc"], "refusal, no torch"),
    ("train --set slow_rank=9", [*CLI, "train", "--set", "slow_rank=9"], "refusal, no torch"),
    ("train --model resnet999", [*CLI, "train", "--model", "resnet999"], "refusal, no torch"),
    ("train --procs 3", [*CLI, "train", "--procs", "3"], "refusal, needs torch"),
]


def _time(cmd: list[str]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (user + system of the child) and the exit code of ``cmd``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu, r.returncode


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    times: dict[str, list[float]] = {name: [] for name, _, _ in CASES}
    cpus: dict[str, list[float]] = {name: [] for name, _, _ in CASES}
    codes: dict[str, int] = {}
    for _, (name, cmd, _) in alternating(CASES, args.repeats):
        seconds, cpu, codes[name] = _time(cmd)
        times[name].append(seconds)
        cpus[name].append(cpu)
    base = spread(times["python -c pass"])["median"]
    rows = []
    for name, _, kind in CASES:
        med = spread(times[name])["median"]
        rows.append({"command": name, "kind": kind, "exit": codes[name],
                     "seconds": fmt_spread(times[name]), "minus python -c pass": round(med - base, 3),
                     "CPU seconds": fmt_spread(cpus[name]),
                     "under 1 s": "yes" if med < 1.0 else "no", "repeats": times[name],
                     "cpu_repeats": cpus[name]})
    notes = (f"Median (min–max) of {args.repeats} repeats per command, the commands alternating "
             "(the order reversed every other repeat), wall clock from start to exit of a fresh "
             "process. The machine is shared: the goal (< 1 s on an idle machine) is judged on "
             "the difference to `python -c pass` and on the CPU seconds (user + system of the child, "
             "which a loaded machine stretches far less than the wall clock) as much as on the "
             "wall-clock figure itself. The `import torch` row is the cause of the refusals that "
             "need torch: they pay that import (a strategy's options and checks live in modules "
             "that import torch), and little besides.")
    write_results("cli_latency", rows, ["command", "kind", "exit", "seconds", "minus python -c pass",
                                        "CPU seconds", "under 1 s"], notes)


if __name__ == "__main__":
    main()
