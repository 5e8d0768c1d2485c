"""bf16 vs fp32 (``--precision``): step time and peak memory, on the default job and gpt-mini.

    python benchmarks/precision.py [--repeats 3] [--steps 30] [--device cpu]

Each measurement is a fresh process (so its peak RSS is its own) that trains one model on one
process as ``single`` does — Adam, fp32 master weights, ``Precision(name).autocast()`` around the
forward and loss — for 3 warm-up steps and then ``--steps`` timed steps with one torch thread.
Step time: the median of the timed steps; peak memory: the process's peak RSS, and its growth
over the RSS before the first step (activations, gradients, optimizer state). On a GPU
(``--device cuda``) the memory is ``torch.cuda.max_memory_allocated``. The repeats alternate the
precisions so that drifting load falls on both alike.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

from harness import alternating, fmt_spread, spread, write_results

JOBS: dict[str, dict[str, Any]] = {
    "cnn/digits (default job)": {"model": "cnn", "dataset": "digits", "batch_size": 64},
    "gpt-mini/chars": {"model": "gpt-mini", "dataset": "chars", "batch_size": 16,
                       "data_options": {"chars": 100_000}},
}
PRECISIONS = ("fp32", "bf16")


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def measure(job_name: str, precision: str, steps: int, device: str) -> dict[str, float]:
    """One process's figures (run in a child: ``--one``)."""
    import torch

    from polytrain.config import make_config
    from polytrain.runtime.job import Job
    from polytrain.runtime.precision import Precision

    torch.set_num_threads(1)
    job = Job.from_config(make_config(JOBS[job_name] | {"steps": steps + 3, "precision": precision}))
    dev = torch.device(device)
    model = job.build_model().to(dev)
    opt = job.make_optimizer(model.parameters())
    amp, batches = Precision(precision, dev), job.batches()
    before, times = _current_rss_mb(), []
    for i in range(1, steps + 4):
        x, y = (t.to(dev) for t in batches.shard(i))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with amp.autocast():
            loss = job.forward_loss(model, x, y)
        amp.backward(loss)
        amp.step(opt)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        if i > 3:
            times.append(time.perf_counter() - t0)
    out = {"step_ms": statistics.median(times) * 1e3, "peak_rss_mb": _rss_mb(),
           "rss_growth_mb": _rss_mb() - before, "loss": float(loss.detach())}
    if dev.type == "cuda":
        out["cuda_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def bf16_units() -> str:
    """What this CPU offers bf16 matrix products (from /proc/cpuinfo's flags)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(f.read().split())
    except OSError:
        return "unknown"
    have = sorted(flags & {"avx512_bf16", "amx_bf16", "avx512f", "avx2"})
    native = "yes" if flags & {"avx512_bf16", "amx_bf16"} else "no"
    return f"native bf16 units: {native} (flags: {', '.join(have) or 'none of avx2/avx512'})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--one", nargs=2, metavar=("JOB", "PRECISION"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure(args.one[0], args.one[1], args.steps, args.device)))
        return
    raw: dict[str, dict[str, list[dict[str, float]]]] = {j: {p: [] for p in PRECISIONS} for j in JOBS}
    for job_name in JOBS:
        for _, precision in alternating(list(PRECISIONS), args.repeats):
            child = subprocess.run([sys.executable, __file__, "--one", job_name, precision,
                                    "--steps", str(args.steps), "--device", args.device],
                                   capture_output=True, text=True, check=True)
            raw[job_name][precision].append(json.loads(child.stdout.strip().splitlines()[-1]))
    rows = []
    for job_name, by in raw.items():
        base = statistics.median(r["step_ms"] for r in by["fp32"])
        for precision, runs in by.items():
            ms = [r["step_ms"] for r in runs]
            rows.append({"job": job_name, "precision": precision, "step ms": fmt_spread(ms, 2),
                         "vs fp32": f"{base / statistics.median(ms):.2f}x",
                         "peak RSS MB": fmt_spread([r["peak_rss_mb"] for r in runs], 0),
                         "RSS growth MB": fmt_spread([r["rss_growth_mb"] for r in runs], 1),
                         "step_ms": spread(ms)})
    notes = ("One process, one torch thread, Adam, fp32 master weights; bf16 is autocast over the "
             f"forward and loss. {args.steps} timed steps after 3 warm-up steps, median per "
             "repeat; the table gives median (min-max) over the repeats. 'vs fp32': fp32's "
             "median step time / this one's (above 1: faster). CPU figures as measured; "
             f"{bf16_units()}: without them oneDNN emulates bf16 products, so bf16 is slower here "
             "while its activations take less memory (RSS growth). On a GPU run the same script "
             "with --device cuda.")
    write_results("precision", rows, ["job", "precision", "step ms", "vs fp32", "peak RSS MB",
                                      "RSS growth MB"], notes,
                  extra={"raw": raw, "cpu": bf16_units(), "device": args.device})


if __name__ == "__main__":
    main()
