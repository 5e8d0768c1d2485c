"""One testbed job of `plan_accuracy.py` and what is read from its run directory before it is
deleted: the first training rank's step times (`step_times`), every rank's compute per step as its
own trace timed it (`span_stats`), peak RSS, the in-run prediction and the runtime's partition.
`PROBE` is the job that measures a model's in-job compute speed beside its profile.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from plan_accuracy_model import MODELS

from polytrain.testbed.probes import cpu_per_step, span_stats, step_times

ROOT = Path(__file__).resolve().parent.parent


PROBE = ("ps", {"servers": 1}, 2, "1gbit")  # a worker and its server: the worker computes alone
# two pipeline stages on 2 hosts at 1 Gbit/s: how the executor's actions run beside their compute
PIPE_PROBE = ("gpipe", {"microbatches": 4}, 2, "1gbit")
# local-sgd that never averages, 2 hosts at 1 Gbit/s: a data-parallel runtime's step with no exchange,
# whose trace gives its own time per pass beside its compute (since 2026-11-29 17:55; priced since
# d301aa6: `plan_accuracy_model.probe_pass_overheads`)
STEP_PROBE = ("local-sgd", {"period": 0}, 2, "1gbit")
PROBES = (PROBE, PIPE_PROBE, STEP_PROBE)  # run in this order before each round (`plan_accuracy.measure`)


def run_one(
    model: str, hosts: int, nic: str, strategy: str, opts: dict[str, Any], steps: int,
    batch: int | None = None,
) -> dict[str, Any]:
    args, default_batch = MODELS[model]
    batch = batch or default_batch
    out = Path(tempfile.mkdtemp()) / "run"
    sets = [x for k, v in opts.items() for x in ("--set", f"{k}={v}")]
    cmd = [
        sys.executable,
        "-m",
        "polytrain",
        "testbed",
        "--hosts",
        str(hosts),
        "--nic",
        nic,
        "--",
        "train",
        "--strategy",
        strategy,
        "--procs",
        str(hosts),
        *args,
        "--batch-size",
        str(batch),
        "--steps",
        str(steps),
        "--optimizer",
        "sgd",
        "--lr",
        "0.01",
        "--out",
        str(out),
        "--no-report",
        *sets,
    ]
    load0 = os.getloadavg()[0]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    row: dict[str, Any] = {
        "model": model,
        "hosts": hosts,
        "nic": nic,
        "strategy": strategy,
        "options": opts,
        "batch": batch,
        "load_start": load0,
        "load_end": os.getloadavg()[0],
    }
    if proc.returncode != 0:
        return {**row, "error": (proc.stderr or proc.stdout).strip().splitlines()[-1:]}
    summary = json.loads((out / "summary.json").read_text())
    times = step_times(out)
    every = step_times(out, 0)
    spans = span_stats(out)
    cpu = cpu_per_step(out)
    shutil.rmtree(out.parent, ignore_errors=True)
    return {
        **row,
        "measured_step_s": statistics.median(times),
        "step_times": times,
        "all_step_times": every,  # no warm-up dropped: the analysis may choose its window
        "spans": spans,  # each rank's compute per step, as its own trace timed it
        "cpu_per_step": cpu,  # each rank's process CPU seconds per step (since 2026-11-30 04:10)
        "peak_rss_bytes": summary["peak_rss_bytes"],
        "in_run_prediction": summary.get("prediction"),
        "partition": (summary.get("strategy_metrics") or {}).get("partition"),  # what the runtime cut
    }
