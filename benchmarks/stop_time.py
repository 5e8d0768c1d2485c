"""How long a stopped run's record takes, and Ctrl-C to the launcher's exit (issue 50 item 4).

    .venv/bin/python benchmarks/stop_time.py --before REV [--repeats 5] [--train-s 10]

``--before``: the git revision to compare with; its ``polytrain`` package (``git archive``d to a
temporary folder) is imported instead of this tree's (same interpreter, same packages).

* ``synthetic N``: two ranks' event files of N steps each, written by polytrain's own recorder
  (two spans and a step per step: 3 events, ~690 bytes a step). Timed: the launcher's record of
  the stopped run, ``write_stopped`` (``metrics.jsonl`` and ``summary.json``), in a fresh
  process. ``before``: from the whole files, as the code before did. ``after``: the files first
  hold all but their last ``TAIL`` steps and the launcher's merge reads them (as its thread
  does while the run goes, untimed); then the tail is appended and the record is written, so
  only the unread tail is read then.
* ``real S s``: ``polytrain train --model mlp --procs 2`` (endless steps, ``--no-report``) is
  started as a terminal's foreground job; after S seconds of training, Ctrl-C (SIGINT to its
  process group) and the time until the launcher exits; steps and the event files' size at
  the stop come from the run directory.

Variants alternate (one of each per repeat, the order reversed every other repeat).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from harness import add_common_flags, alternating, fmt_spread, hold_lock, write_results  # noqa: E402

TAIL = 500  # steps the launcher's merge had not read at the stop (its poll: every 0.5 s)

MAKE = """
import sys, time
from pathlib import Path
from polytrain.metrics.recorder import Recorder
out, steps = Path(sys.argv[1]), int(sys.argv[2])
for rank in range(2):
    rec = Recorder(rank, out / f"rank{rank}.jsonl", fresh=True)
    for i in range(1, steps + 1):
        t = i * 1e-3 + rank * 1e-5
        rec.add_span("forward", "compute", t - 6e-4, t - 4e-4, step=i)
        rec.add_span("allreduce", "comm", t - 4e-4, t - 1e-4, step=i)
        rec.t0 = time.perf_counter() - t  # the step's event at the synthetic clock too
        rec.step(i, 1.0 / i, 64 * i)
    rec.close()
"""

STOP = """
import sys, time
from pathlib import Path
from polytrain.config import make_config
from polytrain.launch import rundir
run, full, cut, variant = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
cfg = make_config({"strategy": "allreduce", "procs": 2, "steps": 10**8, "out": str(run)})
stopped = {"reason": "interrupted", "signal": "SIGINT"}
kw = {}
for path in sorted(full.glob("rank*.jsonl")):
    lines = path.read_text().splitlines(keepends=True)
    head = lines[:3 * cut]  # 3 events a step
    (run / "ranks" / path.name).write_text("".join(head if variant == "after" else lines))
if variant == "after":
    from polytrain.launch.merge import MergedEvents
    merged = MergedEvents(run / "ranks", world=2)
    merged.poll()  # what the launcher's thread read while the run went (untimed)
    for path in sorted(full.glob("rank*.jsonl")):
        lines = path.read_text().splitlines(keepends=True)
        with (run / "ranks" / path.name).open("a") as f:
            f.write("".join(lines[len((run / "ranks" / path.name).read_text().splitlines()):]))
    kw = {"merged": merged}
t0 = time.perf_counter()
summary = rundir.write_stopped(run, cfg, stopped, interrupted=True, **kw)
took = time.perf_counter() - t0
print(took, summary["steps_run"], (run / "metrics.jsonl").stat().st_size)
"""


def _env(code: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(code)}


def synthetic(work: Path, steps: int, variant: str, code: Path) -> dict[str, Any]:
    full = work / f"synthetic-{steps}"
    if not full.exists():
        full.mkdir(parents=True)
        subprocess.run([sys.executable, "-c", MAKE, str(full), str(steps)], check=True,
                       env=_env(HERE.parent))
    run = work / f"run-{time.monotonic_ns()}"
    (run / "ranks").mkdir(parents=True)
    out = subprocess.run([sys.executable, "-c", STOP, str(run), str(full), str(steps - TAIL), variant],
                         env=_env(code), capture_output=True, text=True, check=True).stdout.split()
    shutil.rmtree(run)
    mb = sum(p.stat().st_size for p in full.glob("rank*.jsonl")) / 1e6
    return {"seconds": round(float(out[0]), 3), "steps_run": int(out[1]), "events_mb": round(mb, 1)}


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _trained(run: Path) -> bool:
    path = run / "ranks" / "rank0.jsonl"
    if not path.exists():
        return False
    with path.open("rb") as f:
        return b'"event": "step"' in f.read(1 << 18)


def real(work: Path, train_s: float, code: Path) -> dict[str, Any]:
    run = work / f"real-{time.monotonic_ns()}"
    cmd = [sys.executable, "-m", "polytrain", "train", "--model", "mlp", "--procs", "2",
           "--steps", "100000000", "--out", str(run), "--no-report"]
    proc = subprocess.Popen(cmd, cwd=work, env=_env(code), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_default_sigint)
    try:
        end = time.monotonic() + 300
        while not _trained(run) and proc.poll() is None and time.monotonic() < end:
            time.sleep(0.1)
        time.sleep(train_s)
        mb = sum(p.stat().st_size for p in (run / "ranks").glob("rank*.jsonl")) / 1e6
        os.killpg(proc.pid, signal.SIGINT)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=300)
        said = [x.replace(str(run), "RUN") for x in err.splitlines()
                if x.startswith(("interrupted:", "error:", "SIGINT"))]
        took = time.monotonic() - t0
    finally:
        proc.kill()
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
    by = (summary.get("interrupted") or {}).get("by") or ("rank 0" if summary else "no summary")
    shutil.rmtree(run, ignore_errors=True)
    return {"seconds": round(took, 3), "steps_run": summary.get("steps_run"), "events_mb": round(mb, 1),
            "exit": proc.returncode, "summary_by": by, "message": " | ".join(said)[:200]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--before", required=True, help="the git revision to compare with")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", default="11000,44000", help="synthetic runs' steps per rank")
    p.add_argument("--train-s", default="10,60",
                   help="real runs: seconds of training before Ctrl-C ('': no real runs)")
    p.add_argument("--name", default="stop_time")
    add_common_flags(p)
    a = p.parse_args()
    hold_lock(a.lock)
    work = Path(tempfile.mkdtemp(prefix="polytrain-stop-"))
    before = work / "before"
    before.mkdir()
    archive = subprocess.run(["git", "archive", a.before, "polytrain"], cwd=HERE.parent,
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(before)], input=archive, check=True)
    codes = {"before": before, "after": HERE.parent}
    steps = [int(n) for n in a.steps.split(",") if n]
    train_s = [float(s) for s in a.train_s.split(",") if s]
    probes = [(f"synthetic {n}", v) for n in steps for v in codes] + \
             [(f"real {s} s", v) for s in train_s for v in codes]
    raw: list[dict[str, Any]] = []
    try:
        for r, (name, variant) in alternating(probes, a.repeats):
            kind, size = name.split()[:2]
            row = (synthetic(work, int(size), variant, codes[variant]) if kind == "synthetic"
                   else real(work, float(size), codes[variant]))
            row |= {"probe": name, "code": variant, "repeat": r, "load": round(os.getloadavg()[0], 1)}
            print(json.dumps(row), flush=True)
            raw.append(row)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    for name, variant in probes:
        mine = [x for x in raw if x["probe"] == name and x["code"] == variant]
        rows.append({"probe": name, "code": variant, "seconds": fmt_spread([x["seconds"] for x in mine], 2),
                     "steps_run": fmt_spread([x["steps_run"] or 0 for x in mine], 0),
                     "events_mb": fmt_spread([x["events_mb"] for x in mine], 1),
                     "load_1min": fmt_spread([x["load"] for x in mine], 1), "repeats": len(mine),
                     "exit_codes": sorted({x["exit"] for x in mine if "exit" in x}),
                     "summary_by": sorted({x["summary_by"] for x in mine if "summary_by" in x})})
    write_results(a.name, rows, ["probe", "code", "seconds", "steps_run", "events_mb", "load_1min",
                                 "repeats", "exit_codes", "summary_by"],
                  notes=f"`before`: revision {a.before} (the code compared with); `after`: this commit. "
                        "seconds: median (min–max). synthetic: the launcher's write_stopped on two "
                        f"ranks' files of N steps ({TAIL} steps unread at the stop for `after`); "
                        "real: from Ctrl-C (SIGINT to the job's process group) to the launcher's "
                        "exit after S s of training; steps_run and events_mb at the stop; "
                        "summary_by: who wrote summary.json. load_1min: the 1-minute load average "
                        "when each repeat ended.",
                  extra={"raw": raw})


if __name__ == "__main__":
    main()
