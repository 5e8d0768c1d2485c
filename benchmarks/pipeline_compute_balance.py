"""How evenly this machine's cores compute, with no pipeline runtime at all: the floor of the bubble.

Two processes (one per core, as the pipeline's two stages) run the two halves of the bubble model
(benchmarks/bubble_model.py, cut 6,6) exactly as gpipe's stages do — M forwards, M backwards, one
optimizer step per mini-batch — but independently: no messages, no executor, no recorder. Each
action's compute seconds are then replayed through the gpipe schedule with free messages
(`metrics.schedule_bubble`, the same replay as every run's ``bubble_fraction_schedule``). If the
cores delivered the same speed this replay would give (P-1)/(M+P-1); what it gives instead is
the bubble that this machine's compute alone implies, before any runtime cost.

Also reported: the per-mini-batch ratio of the two processes' compute (stage 1 / stage 0), and
how much slower the first forward and first backward of a mini-batch are than the median.

    python benchmarks/pipeline_compute_balance.py [--microbatch-sizes 128,512] [--microbatches 8]
                                                   [--steps 30] [--warmup 2]
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from harness import write_results  # noqa: E402


def _stage(i: int, steps: int, m: int, b: int, q: Any, bar: Any) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    from torch import nn

    from benchmarks.bubble_model import make
    from polytrain.strategies.pipeline.heap import keep_heap

    keep_heap()  # as the pipeline's ranks
    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers = make(None)
    module = nn.Sequential(*(layers[:6] if i == 0 else layers[6:]))
    opt = torch.optim.SGD(module.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(b * m, 8, 8) if i == 0 else torch.randn(b * m, 64)  # digits: 8x8 images
    y = torch.randint(0, 10, (b * m,))
    rows = []
    bar.wait()
    for _ in range(steps):
        fs, bs, held = [], [], []
        for k in range(m):
            t = time.perf_counter()
            inp = x[k * b:(k + 1) * b].clone().requires_grad_(i == 1)
            out = module(inp)
            if i == 1:
                out = nn.functional.cross_entropy(out, y[k * b:(k + 1) * b])
            held.append(out)
            fs.append(time.perf_counter() - t)
        for _ in range(m):  # backwards in reverse order, as gpipe
            t = time.perf_counter()
            out = held.pop()
            out.backward() if i == 1 else out.backward(torch.ones_like(out))
            bs.append(time.perf_counter() - t)
        opt.step()
        opt.zero_grad(set_to_none=True)
        rows.append((fs, bs))
    q.put((i, rows))


def measure(b: int, m: int, steps: int, warmup: int) -> dict[str, Any]:
    from polytrain.strategies.pipeline.metrics import schedule_bubble, theoretical_bubble

    ctx = mp.get_context("spawn")
    q, bar = ctx.Queue(), ctx.Barrier(2)
    procs = [ctx.Process(target=_stage, args=(i, steps, m, b, q, bar)) for i in range(2)]
    for p in procs:
        p.start()
    res = dict(q.get() for _ in procs)
    for p in procs:
        p.join()
    keep = range(warmup, steps)
    ops = [[[["F", k, fs[k]] for k in range(m)] + [["B", m - 1 - j, bs[j]] for j in range(m)]
            for fs, bs in (res[i][s] for s in keep)] for i in (0, 1)]
    replay, _ = schedule_bubble(ops)
    ratios = [sum(res[1][s][0] + res[1][s][1]) / sum(res[0][s][0] + res[0][s][1]) for s in keep]
    med = statistics.median

    def first_vs_rest(i: int, which: int) -> float:
        firsts = [res[i][s][which][0] for s in keep]
        rest = [t for s in keep for t in res[i][s][which][1:]]
        return med(firsts) / med(rest) - 1.0

    theory = theoretical_bubble(2, m)
    return {
        "microbatch": b,
        "M": m,
        "steps": len(keep),
        "replay_bubble": replay,
        "theory": theory,
        "relative_gap": (replay - theory) / theory,
        "ratio_s1_s0_median": med(ratios),
        "ratio_mean_abs_log": statistics.mean(abs(math.log(r)) for r in ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "F_ms": "/".join(f"{1000 * med([t for s in keep for t in res[i][s][0]]):.1f}" for i in (0, 1)),
        "B_ms": "/".join(f"{1000 * med([t for s in keep for t in res[i][s][1]]):.1f}" for i in (0, 1)),
        "first_F_slower": "/".join(f"{first_vs_rest(i, 0):+.0%}" for i in (0, 1)),
        "first_B_slower": "/".join(f"{first_vs_rest(i, 1):+.0%}" for i in (0, 1)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--microbatch-sizes", default="128,512")
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=2, help="mini-batches left out at the start")
    ap.add_argument("--name", default="pipeline_compute_balance")
    args = ap.parse_args()
    rows = [measure(int(b), args.microbatches, args.steps, args.warmup)
            for b in args.microbatch_sizes.split(",")]
    notes = (
        "Two processes, one per core, each running one half of the bubble model as a gpipe stage "
        "does (M forwards, M backwards, optimizer step), independently: no messages, no runtime. "
        "replay_bubble: their per-action compute seconds replayed through the gpipe schedule with "
        "free messages (metrics.schedule_bubble) — the bubble this machine's compute alone implies. "
        "ratio_*: per mini-batch, stage 1's total compute / stage 0's (median, mean |log|, range). "
        "first_F/B_slower: the first forward/backward of a mini-batch vs the median of the others."
    )
    cols = ["microbatch", "M", "steps", "replay_bubble", "theory", "relative_gap", "ratio_s1_s0_median",
            "ratio_mean_abs_log", "ratio_min", "ratio_max", "F_ms", "B_ms", "first_F_slower",
            "first_B_slower"]
    write_results(args.name, rows, cols, notes)


if __name__ == "__main__":
    main()
